#!/usr/bin/env python3
"""bankstub.py: a misbehaving bank on loopback, for what bank-sim (a
well-behaved one) never does.  Each POST is logged as one JSON line
{path, headers, body} in DIR/log and answered as MODE says:

  big        201 with a JSON body of 2 MiB (the ref first, then padding)
  short      201 whose Content-Length promises 4096 bytes; 20 are sent,
             then the connection is closed
  ref=JSON   201 with the body {"ref": JSON} (JSON as given, verbatim)
  replay=H  201 {"ref":"TXN-KEY"} the first time a key (the Idempotency-Key
             header) is seen; 200 with the same body and header H
             ("Name: value") every time after: a bank whose replay header
             is its own, not the Stripe-style one bank-sim sends
  oauth=JSON an OAuth2 token endpoint at /token answering
             {"access_token":"tok-N","expires_in":JSON} (JSON verbatim,
             "-" leaves expires_in out), and everywhere else, after 600 ms,
             201 {"ref":"TXN-N"}

usage: bankstub.py DIR MODE   (the port is written to DIR/port)
"""
import http.server
import itertools
import json
import os
import sys
import time

d, mode = sys.argv[1], sys.argv[2]
count = itertools.count(1)
seen = set()


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode()
        with open(d + "/log", "a") as f:
            f.write(json.dumps({"path": self.path, "headers": dict(self.headers.items()),
                                "body": body}) + "\n")
        if mode.startswith("oauth=") and self.path == "/token":
            exp = mode[len("oauth="):]
            out = b'{"access_token":"tok-%d","token_type":"Bearer"' % next(count)
            out += (b"" if exp == "-" else b',"expires_in":' + exp.encode()) + b"}"
        elif mode.startswith("oauth="):
            time.sleep(0.6)
            out = b'{"ref":"TXN-%d"}' % next(count)
        elif mode.startswith("replay="):
            key = self.headers.get("Idempotency-Key", "")
            out = b'{"ref":"TXN-' + key.encode() + b'"}'
            if key in seen:
                name, value = mode[len("replay="):].split(":", 1)
                self.send_response(200)
                self.send_header(name.strip(), value.strip())
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                return
            seen.add(key)
        elif mode == "big":
            out = b'{"ref":"TXN-BIG","pad":"' + b"x" * (2 << 20) + b'"}'
        elif mode == "short":
            out = b'{"ref":"TXN-SHORT",'          # 20 bytes of the 4096 promised
        else:
            out = b'{"ref":' + mode[len("ref="):].encode() + b'}'
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(4096 if mode == "short" else len(out)))
        self.end_headers()
        self.wfile.write(out)
        self.wfile.flush()
        if mode == "short":
            self.close_connection = True


s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(d + "/port.tmp", "w") as f:
    f.write(str(s.server_address[1]))
os.rename(d + "/port.tmp", d + "/port")
s.serve_forever()
