#!/usr/bin/env python3
"""recproxy.py UPSTREAM PORTFILE LOG [PORT]: a loopback HTTP proxy for the JSON
protocol that forwards every POST to UPSTREAM unchanged (headers included,
so the signature still holds) and appends {"target": X-Amz-Target,
"body": the request JSON} to LOG, one line per request.  Lets a test see
exactly what idemkit sends to DynamoDB or SQS; killing it is an outage of
the service behind it (restart it with PORT to end the outage).  Writes
its port to PORTFILE once it listens.

Faults, when RECPROXY_FAULTS names a JSON file: a list of rules, each
  {"op": "UpdateItem", "skip": 0, "times": 1, "do": ACTION, ...}
"op" is the operation (the X-Amz-Target after its dot; "*" for any).  A
rule applies to the requests it matches after the first "skip" of them,
"times" of them (null: every one); the first rule that applies wins, and
the log line of that request gets "fault": ACTION.  ACTION is one of
  lose-response  forward the request (it takes effect upstream), then
                 reset the connection: the answer is lost
  reset          reset the connection without forwarding anything
  cut            forward, send the status line, headers and half the
                 body, then reset (a connection reset mid-response)
  error          answer "status" (default 400) without forwarding; with
                 "type", the body is an AWS JSON error of that type
                 ({"__type": "com.amazonaws.dynamodb.v20120810#TYPE"}),
                 else a plain text body
  delay          hold the request "ms" (default 50) milliseconds, then
                 forward it: calls in flight then overlap for certain
  slow-answer    forward the request at once (it takes effect upstream),
                 then hold the answer "after" (default 500) milliseconds
  fail-entries   a batch call (DeleteMessageBatch, SendMessageBatch,
                 ChangeMessageVisibilityBatch): the entries whose Id is in
                 "ids" are not forwarded and come back in "Failed" with
                 "code" (default InternalError) and "senderFault" (default
                 false); the log line gets "failed": their ReceiptHandle
                 (or MessageBody)
With "ms", any action waits that long first.  With "match", a rule applies
only to requests whose raw body contains that string.  A reset is a TCP RST (SO_LINGER 0), as a load balancer dropping a
connection sends.  Every log line has "inflight" (also as "concurrent"):
the requests this proxy was handling when it arrived, itself included
(calls in flight overlap when it is 2 or more), and "ms", when it arrived
(epoch milliseconds)."""
import http.client
import http.server
import json
import os
import socket
import struct
import sys
import threading
import time
import urllib.parse

UP = urllib.parse.urlsplit(sys.argv[1])
RULES = []
if os.environ.get("RECPROXY_FAULTS"):
    with open(os.environ["RECPROXY_FAULTS"]) as f:
        RULES = json.load(f)
SEEN = [0] * len(RULES)
LOCK = threading.Lock()


INFLIGHT = [0]


def fault_for(op, body):
    """The rule that applies to this request, counted under the lock."""
    with LOCK:
        for i, r in enumerate(RULES):
            if r.get("op", "*") not in ("*", op):
                continue
            if r.get("match") and r["match"].encode() not in body:
                continue
            SEEN[i] += 1
            k = SEEN[i] - r.get("skip", 0)
            t = r.get("times", 1)
            if k >= 1 and (t is None or k <= t):
                return r
    return None


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The answer goes out in two writes (headers, then body): with Nagle's
    # algorithm the body waits for the client's delayed ACK of the headers,
    # 40 ms added to every call made alone (a lease, a read), which no real
    # endpoint adds.
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def reset(self):
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def forward(self, body):
        c = http.client.HTTPConnection(UP.hostname, UP.port, timeout=30)
        hdrs = {k: v for k, v in self.headers.items()
                if k.lower() not in ("connection", "content-length")}
        c.request("POST", self.path, body=body, headers=hdrs)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r, data

    def answer(self, status, headers, data, cut=False):
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("connection", "transfer-encoding", "content-length", "date", "server"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if cut:
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.reset()
            return
        self.wfile.write(data)

    def do_POST(self):
        with LOCK:
            INFLIGHT[0] += 1
            now = INFLIGHT[0]
        try:
            self.handle_post(now)
        finally:
            with LOCK:
                INFLIGHT[0] -= 1

    def fail_entries(self, rule, parsed, line):
        """Forward the entries not named in rule["ids"]; fail those."""
        ids = set(rule.get("ids", []))
        keep = [e for e in parsed.get("Entries", []) if e.get("Id") not in ids]
        lost = [e for e in parsed.get("Entries", []) if e.get("Id") in ids]
        line["failed"] = [e.get("ReceiptHandle", e.get("MessageBody")) for e in lost]
        with open(sys.argv[3], "a") as f:
            f.write(json.dumps(line) + "\n")
        out = {"Successful": [], "Failed": []}
        status, hdrs = 200, [("Content-Type", "application/x-amz-json-1.0")]
        if keep:
            r, data = self.forward(json.dumps(dict(parsed, Entries=keep)).encode())
            if r.status != 200:
                return self.answer(r.status, r.getheaders(), data)
            out = json.loads(data)
            out.setdefault("Failed", [])
        out["Failed"] += [{"Id": e["Id"], "Code": rule.get("code", "InternalError"),
                           "Message": "injected by recproxy",
                           "SenderFault": rule.get("senderFault", False)} for e in lost]
        self.answer(status, hdrs, json.dumps(out).encode())

    def handle_post(self, inflight):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        try:
            parsed = json.loads(body or b"{}")
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        target = self.headers.get("X-Amz-Target") or ""
        rule = fault_for(target.rsplit(".", 1)[-1], body)
        # "concurrent" and "inflight" are the same count (two suites' names)
        line = {"target": target, "body": parsed, "inflight": inflight, "concurrent": inflight,
                "ms": int(time.time() * 1000)}
        if rule:
            line["fault"] = rule["do"]
        act = rule["do"] if rule else None
        if act and (act == "delay" or "ms" in rule):
            time.sleep(rule.get("ms", 50) / 1000.0)
        if act == "fail-entries" and isinstance(parsed, dict):
            return self.fail_entries(rule, parsed, line)
        with open(sys.argv[3], "a") as f:
            f.write(json.dumps(line) + "\n")

        if act == "reset":
            return self.reset()
        if act == "error":
            if rule.get("type"):
                svc = "com.amazonaws.dynamodb.v20120810" if target.startswith("DynamoDB") else "com.amazonaws.sqs"
                data = json.dumps({"__type": "%s#%s" % (svc, rule["type"]),
                                   "message": "injected by recproxy"}).encode()
                hdrs = [("Content-Type", "application/x-amz-json-1.0"),
                        ("x-amzn-ErrorType", rule["type"])]
            else:
                data, hdrs = b"injected by recproxy\n", [("Content-Type", "text/plain")]
            return self.answer(rule.get("status", 400), hdrs, data)
        r, data = self.forward(body)
        if act == "slow-answer":
            time.sleep(rule.get("after", 500) / 1000.0)
        if act == "lose-response":
            return self.reset()
        self.answer(r.status, r.getheaders(), data, cut=act == "cut")


http.server.ThreadingHTTPServer.allow_reuse_address = True
http.server.ThreadingHTTPServer.daemon_threads = True
# A burst of new connections (a client's calls in flight) is not refused
# by a listen queue of 5, socketserver's default, whose overflow costs the
# client a 1 s SYN retry: no real endpoint has one that short.
http.server.ThreadingHTTPServer.request_queue_size = 128
s = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[4]) if len(sys.argv) > 4 else 0), H)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write("%d\n" % s.server_address[1])
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
s.serve_forever()
