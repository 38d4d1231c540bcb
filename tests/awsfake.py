# awsfake.py PORTFILE LOG: a loopback stand-in for the AWS pieces a test
# must not reach for real: container credentials (GET /creds, checks the
# Authorization header against LOG.auth when that file exists) and a JSON-protocol endpoint whose
# path picks the answer (/ok echoes what it got, /throttle, /denied,
# /status500; /slow answers after 0.3 s with the most requests it has seen
# open at once, to show calls overlap).  Every request is appended to LOG as one JSON line.
# With AWSFAKE_TLS=DIR it speaks https with DIR/cert.pem and DIR/key.pem (a
# self-signed certificate the test made): a loopback stand-in for an AWS
# endpoint such as https://dynamodb.REGION.amazonaws.com.
import http.server, json, os, ssl, sys, threading, time

LOCK = threading.Lock()
OPEN = [0, 0]   # requests open now, the most seen at once

CREDS = {"AccessKeyId": "ASIAFAKECONTAINER1", "SecretAccessKey": "containerSecretValue123",
         "Token": "containerSessionToken456", "Expiration": "2099-01-01T00:00:00Z"}

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def send(self, status, obj, hdrs=()):
        out = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(out)))
        for k, v in hdrs: self.send_header(k, v)
        self.end_headers(); self.wfile.write(out)
    def handle_one(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode() if n else ""
        rec = {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
        with open(sys.argv[2], "a") as f: f.write(json.dumps(rec) + "\n")
        p = self.path
        if p == "/creds":
            try:
                with open(sys.argv[2] + ".auth") as f: want = f.read().strip()
            except OSError:
                want = None
            if want and self.headers.get("Authorization") != want:
                return self.send(401, {"message": "bad token"})
            return self.send(200, CREDS)
        if p == "/throttle":
            return self.send(400, {"__type": "com.amazonaws.dynamodb.v20120810#ThrottlingException",
                                   "message": "Rate of requests exceeds the allowed throughput."})
        if p == "/denied":
            return self.send(400, {"__type": "com.amazon.coral.service#AccessDeniedException",
                                   "message": "not authorized"})
        if p == "/nonexistent":
            return self.send(400, {"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "The specified queue does not exist."},
                             [("x-amzn-query-error", "AWS.SimpleQueueService.NonExistentQueue;Sender")])
        if p == "/slow":
            with LOCK:
                OPEN[0] += 1
                OPEN[1] = max(OPEN)
            time.sleep(0.3)
            with LOCK:
                OPEN[0] -= 1
                peak = OPEN[1]
            return self.send(200, {"peak": peak})
        if p == "/status500":
            return self.send(500, {"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError", "message": "boom"})
        return self.send(200, {"target": self.headers.get("X-Amz-Target"),
                               "contentType": self.headers.get("Content-Type"),
                               "authorization": self.headers.get("Authorization"),
                               "securityToken": self.headers.get("X-Amz-Security-Token"),
                               "body": body})
    do_GET = do_POST = do_PUT = handle_one

s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
if os.environ.get("AWSFAKE_TLS"):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.environ["AWSFAKE_TLS"] + "/cert.pem", os.environ["AWSFAKE_TLS"] + "/key.pem")
    s.socket = ctx.wrap_socket(s.socket, server_side=True)
with open(sys.argv[1] + ".tmp", "w") as f: f.write(str(s.server_address[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
s.serve_forever()
