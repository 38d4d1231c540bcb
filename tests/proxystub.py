#!/usr/bin/env python3
"""proxystub.py: an HTTP proxy on loopback that records what reaches it,
as a corporate proxy in http_proxy / HTTPS_PROXY / ALL_PROXY would see it.

Each request is one JSON line in DIR/log: {method, target, headers, body}.
  CONNECT host:port   (what a client sends for https://) is tunnelled to
                      host:port, loopback only; the proxy sees the CONNECT
                      line and ciphertext, nothing else
  anything else       (a plain http:// request sent to the proxy: the whole
                      request in cleartext) is answered by the proxy itself
                      with 201 {"ref":"TXN-PROXY"}: a debit the bank never saw

usage: proxystub.py DIR   (the port is written to DIR/port)
"""
import json
import os
import select
import socket
import socketserver
import sys

d = sys.argv[1]


def log(entry):
    with open(d + "/log", "a") as f:
        f.write(json.dumps(entry) + "\n")


class H(socketserver.StreamRequestHandler):
    def handle(self):
        line = self.rfile.readline().decode("latin-1").rstrip("\r\n")
        if not line:
            return
        method, target = (line.split(" ") + ["", ""])[:2]
        headers = {}
        while True:
            h = self.rfile.readline().decode("latin-1").rstrip("\r\n")
            if not h:
                break
            k, _, v = h.partition(":")
            headers[k.strip()] = v.strip()
        body = self.rfile.read(int(headers.get("Content-Length", "0") or 0)).decode("latin-1")
        log({"method": method, "target": target, "headers": headers, "body": body})
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            if host.strip("[]") not in ("127.0.0.1", "localhost", "::1"):
                self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            up = socket.create_connection((host.strip("[]"), int(port)))
            self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.wfile.flush()
            socks = [self.connection, up]
            while True:
                r, _, _ = select.select(socks, [], [], 30)
                if not r:
                    break
                for s in r:
                    data = s.recv(65536)
                    if not data:
                        up.close()
                        return
                    (up if s is self.connection else self.connection).sendall(data)
            up.close()
            return
        out = b'{"ref":"TXN-PROXY"}'
        self.wfile.write(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(out) + out)


class S(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


s = S(("127.0.0.1", 0), H)
with open(d + "/port.tmp", "w") as f:
    f.write(str(s.server_address[1]))
os.rename(d + "/port.tmp", d + "/port")
s.serve_forever()
