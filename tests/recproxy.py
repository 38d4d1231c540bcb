#!/usr/bin/env python3
"""recproxy.py UPSTREAM PORTFILE LOG [PORT]: a loopback HTTP proxy for the JSON
protocol that forwards every POST to UPSTREAM unchanged (headers included,
so the signature still holds) and appends {"target": X-Amz-Target,
"body": the request JSON} to LOG, one line per request.  Lets a test see
exactly what idemkit sends to DynamoDB or SQS; killing it is an outage of
the service behind it (restart it with PORT to end the outage).  Writes
its port to PORTFILE once it listens."""
import http.client
import http.server
import json
import sys
import urllib.parse

UP = urllib.parse.urlsplit(sys.argv[1])


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        try:
            parsed = json.loads(body or b"{}")
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        with open(sys.argv[3], "a") as f:
            f.write(json.dumps({"target": self.headers.get("X-Amz-Target"), "body": parsed}) + "\n")
        c = http.client.HTTPConnection(UP.hostname, UP.port, timeout=30)
        hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
        c.request("POST", self.path, body=body, headers=hdrs)
        r = c.getresponse()
        data = r.read()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length", "date", "server"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        c.close()


http.server.ThreadingHTTPServer.allow_reuse_address = True
s = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[4]) if len(sys.argv) > 4 else 0), H)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write("%d\n" % s.server_address[1])
import os
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
s.serve_forever()
