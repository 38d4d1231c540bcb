# sigv4_capture.py PORTFILE LOG: records every request it gets (method,
# path, headers in order, body) as one JSON line in LOG and answers like
# SQS (SendMessage, and every entry of a batch Successful), so a command's signed request can be checked afterwards
# by an independent signer (tests/sigv4_verify.py).  Loopback only.
import http.server, json, os, sys

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode() if n else ""
        rec = {"method": self.command, "path": self.path,
               "headers": list(self.headers.items()), "body": body}
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps(rec) + "\n")
        try:
            ids = [e["Id"] for e in json.loads(body).get("Entries", [])]
        except ValueError:
            ids = []
        out = json.dumps({"MD5OfMessageBody": "0" * 32, "MessageId": "captured-1",
                          "Successful": [{"Id": i, "MessageId": "captured-" + i,
                                          "MD5OfMessageBody": "0" * 32} for i in ids],
                          "Failed": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

# threads: a client may keep several calls in flight on as many connections
http.server.ThreadingHTTPServer.daemon_threads = True
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(s.server_address[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
s.serve_forever()
