#!/usr/bin/env python3
"""credsrv.py CONFIG PORTFILE LOG: loopback stand-ins for the AWS credential
services, which have no emulator on npm or Debian.  Each checks the
request as the real service documents it and refuses what the real one
refuses; none is a mock of idemkit's code.

CONFIG is a JSON file:
  {"lifetime": 3600,                      seconds each issued credential lives
   "keys": {"AKIDSOURCE": "secret", ...}, long-term keys STS accepts as signers
   "web_token_file": PATH,                the OIDC token AssumeRoleWithWebIdentity wants
   "container_token_file": PATH,          the Authorization value the container endpoint wants
   "upstream": "http://127.0.0.1:N"}      where /proxy forwards JSON-protocol calls

Served on one loopback port:
  POST /sts        STS, query protocol (Action=AssumeRole | AssumeRoleWithWebIdentity,
                   Version=2011-06-15).  AssumeRole must carry a SigV4 signature
                   (service sts) by a known key, VERIFIED with botocore's signer
                   (python3-botocore, independent of libcurl), with the session
                   token of a temporary key in X-Amz-Security-Token; an expired key
                   is ExpiredToken.  AssumeRoleWithWebIdentity is unsigned and wants
                   the token of web_token_file.  Answers the XML STS documents
                   (AssumeRoleResponse / ErrorResponse).
  PUT  /latest/api/token                       IMDSv2 session token; wants the
                   X-aws-ec2-metadata-token-ttl-seconds header (1..21600), else 400.
  GET  /latest/meta-data/iam/security-credentials/[ROLE]  wants the
                   X-aws-ec2-metadata-token header of an issued token, else 401.
  GET  /container  container credentials (ECS/EKS); wants Authorization equal to
                   container_token_file's content when that is set, else 401.
  POST /proxy      forwards to upstream after verifying its SigV4 signature against
                   the keys issued here (and the long-term ones); logs which key
                   signed; an unknown, expired or badly signed request is refused
                   the way DynamoDB refuses it (400 UnrecognizedClient /
                   ExpiredTokenException / 403 InvalidSignatureException).
Every credential issued and every proxied call is one JSON line in LOG:
  {"event": "issue", "source": "sts-assume-role"|"sts-web-identity"|"imds"|"container",
   "key": ..., "signedBy": ...}
  {"event": "call", "key": ..., "target": ..., "status": ...}
"""
import datetime
import http.client
import http.server
import json
import os
import secrets
import sys
import threading
import time
import urllib.parse

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

CFG = json.load(open(sys.argv[1]))
LOG = sys.argv[3]
LOCK = threading.Lock()
ISSUED = {}        # access key -> (secret, token, expires epoch s)
IMDS_TOKENS = {}   # token -> expires epoch s
COUNT = [0]
ROLE = "idemkit-worker-role"
NS = "https://sts.amazonaws.com/doc/2011-06-15/"


def log(rec):
    with LOCK, open(LOG, "a") as f:
        f.write(json.dumps(rec) + "\n")


def iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def issue(source, signed_by=None):
    with LOCK:
        COUNT[0] += 1
        n = COUNT[0]
    ak = "ASIA%s%04d" % (source.upper().replace("-", "")[:8], n)
    sk = secrets.token_hex(20)
    tok = "FwoGZXIvYXdzE" + secrets.token_urlsafe(48)
    exp = time.time() + float(CFG.get("lifetime", 3600))
    with LOCK:
        ISSUED[ak] = (sk, tok, exp)
    log({"event": "issue", "source": source, "key": ak, "signedBy": signed_by})
    return ak, sk, tok, exp


def verify_sigv4(method, path, headers, body, service):
    """Returns (access key, None) or (key or None, (status, code, message))."""
    hdrs = {k.lower(): v for k, v in headers.items()}
    auth = hdrs.get("authorization")
    if not auth:
        return None, (403, "MissingAuthenticationToken", "Request is missing Authentication Token")
    try:
        algo, rest = auth.split(" ", 1)
        parts = dict(p.strip().split("=", 1) for p in rest.split(","))
        ak, day, region, svc, term = parts["Credential"].split("/")
        signed = parts["SignedHeaders"].split(";")
        stamp = hdrs["x-amz-date"]
    except (ValueError, KeyError):
        return None, (403, "IncompleteSignature", "malformed Authorization header")
    if algo != "AWS4-HMAC-SHA256" or svc != service or term != "aws4_request" or day != stamp[:8]:
        return ak, (403, "IncompleteSignature", "bad credential scope")
    with LOCK:
        if ak in CFG.get("keys", {}):
            sk, tok, exp = CFG["keys"][ak], None, None
        elif ak in ISSUED:
            sk, tok, exp = ISSUED[ak]
        else:
            return ak, (403, "InvalidClientTokenId", "The security token included in the request is invalid.")
    if tok is not None:
        if hdrs.get("x-amz-security-token") != tok or "x-amz-security-token" not in signed:
            return ak, (403, "InvalidClientTokenId", "The security token included in the request is invalid.")
        if time.time() >= exp:
            return ak, (400, "ExpiredToken", "The security token included in the request is expired")
    req = AWSRequest(method=method, url="http://" + hdrs["host"] + path, data=body,
                     headers={h: hdrs[h] for h in signed})
    signer = SigV4Auth(Credentials(ak, sk, tok), service, region)
    req.context["timestamp"] = stamp
    canonical = signer.canonical_request(req)
    good = signer.signature(signer.string_to_sign(req, canonical), req)
    if good != parts["Signature"]:
        return ak, (403, "SignatureDoesNotMatch",
                    "The request signature we calculated does not match the signature you provided.")
    return ak, None


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, status, body, ctype):
        out = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    # ---- STS ----
    def sts_error(self, status, code, msg):
        typ = "Sender" if status < 500 else "Receiver"
        self.reply(status, '<ErrorResponse xmlns="%s"><Error><Type>%s</Type><Code>%s</Code>'
                   '<Message>%s</Message></Error><RequestId>%s</RequestId></ErrorResponse>'
                   % (NS, typ, code, msg, secrets.token_hex(8)), "text/xml")

    def sts(self):
        raw = self.body()
        form = {k: v[0] for k, v in urllib.parse.parse_qs(raw.decode(), keep_blank_values=True).items()}
        action = form.get("Action")
        if form.get("Version") != "2011-06-15":
            return self.sts_error(400, "InvalidAction", "Could not find operation for version")
        if not form.get("RoleArn", "").startswith("arn:aws:iam::") or not form.get("RoleSessionName"):
            return self.sts_error(400, "ValidationError", "RoleArn and RoleSessionName are required")
        if action == "AssumeRole":
            signer, bad = verify_sigv4("POST", self.path, dict(self.headers), raw, "sts")
            if bad:
                log({"event": "refused", "action": action, "key": signer, "code": bad[1]})
                return self.sts_error(*bad)
            ak, sk, tok, exp = issue("sts-assume-role", signer)
            log({"event": "assume-role", "role": form["RoleArn"], "session": form["RoleSessionName"],
                 "externalId": form.get("ExternalId"), "signedBy": signer, "key": ak})
        elif action == "AssumeRoleWithWebIdentity":
            if self.headers.get("Authorization"):
                return self.sts_error(400, "InvalidAction", "AssumeRoleWithWebIdentity is not signed")
            want = open(CFG["web_token_file"]).read().strip()
            if form.get("WebIdentityToken") != want:
                log({"event": "refused", "action": action, "code": "InvalidIdentityToken"})
                return self.sts_error(400, "InvalidIdentityToken", "Couldn't verify the token")
            ak, sk, tok, exp = issue("sts-web-identity")
            log({"event": "web-identity", "role": form["RoleArn"], "session": form["RoleSessionName"], "key": ak})
        else:
            return self.sts_error(400, "InvalidAction", "Could not find operation %s" % action)
        self.reply(200, '<%sResponse xmlns="%s"><%sResult><Credentials>'
                   '<AccessKeyId>%s</AccessKeyId><SecretAccessKey>%s</SecretAccessKey>'
                   '<SessionToken>%s</SessionToken><Expiration>%s</Expiration></Credentials>'
                   '<AssumedRoleUser><Arn>%s/%s</Arn><AssumedRoleId>AROA:%s</AssumedRoleId></AssumedRoleUser>'
                   '</%sResult><ResponseMetadata><RequestId>%s</RequestId></ResponseMetadata></%sResponse>'
                   % (action, NS, action, ak, sk, tok, iso(exp), form["RoleArn"], form["RoleSessionName"],
                      form["RoleSessionName"], action, secrets.token_hex(8), action), "text/xml")

    # ---- IMDSv2 ----
    def do_PUT(self):
        self.body()
        if self.path != "/latest/api/token":
            return self.reply(404, "", "text/plain")
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        if not ttl or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
            return self.reply(400, "", "text/plain")
        tok = secrets.token_urlsafe(40)
        with LOCK:
            IMDS_TOKENS[tok] = time.time() + int(ttl)
        log({"event": "imds-token", "ttl": int(ttl)})
        self.reply(200, tok, "text/plain")

    def imds(self):
        tok = self.headers.get("X-aws-ec2-metadata-token")
        with LOCK:
            ok = tok in IMDS_TOKENS and IMDS_TOKENS[tok] > time.time()
        if not ok:
            log({"event": "imds-refused", "path": self.path})
            return self.reply(401, "", "text/plain")
        rest = self.path[len("/latest/meta-data/iam/security-credentials/"):]
        if rest == "":
            return self.reply(200, ROLE, "text/plain")
        if rest != ROLE:
            return self.reply(404, "", "text/plain")
        ak, sk, tok, exp = issue("imds")
        self.reply(200, json.dumps({"Code": "Success", "LastUpdated": iso(time.time()), "Type": "AWS-HMAC",
                                    "AccessKeyId": ak, "SecretAccessKey": sk, "Token": tok,
                                    "Expiration": iso(exp)}), "text/plain")

    # ---- container ----
    def container(self):
        f = CFG.get("container_token_file")
        if f:
            want = open(f).read().strip()
            if self.headers.get("Authorization") != want:
                log({"event": "container-refused"})
                return self.reply(401, json.dumps({"message": "invalid token"}), "application/json")
        ak, sk, tok, exp = issue("container")
        self.reply(200, json.dumps({"AccessKeyId": ak, "SecretAccessKey": sk, "Token": tok,
                                    "AccountId": "123456789012", "Expiration": iso(exp)}), "application/json")

    def do_GET(self):
        if self.path.startswith("/latest/meta-data/iam/security-credentials/"):
            return self.imds()
        if self.path.startswith("/container"):
            return self.container()
        self.reply(404, "", "text/plain")

    # ---- the signing check in front of the service ----
    def proxy(self):
        raw = self.body()
        target = self.headers.get("X-Amz-Target")
        service = "dynamodb" if (target or "").startswith("DynamoDB") else "sqs"
        path = self.path[len("/proxy"):] or "/"
        ak, bad = verify_sigv4("POST", self.path, dict(self.headers), raw, service)
        if bad:
            log({"event": "call", "key": ak, "target": target, "status": bad[0], "code": bad[1]})
            names = {"InvalidClientTokenId": "UnrecognizedClientException",
                     "ExpiredToken": "ExpiredTokenException",
                     "SignatureDoesNotMatch": "InvalidSignatureException"}
            return self.reply(bad[0], json.dumps({"__type": "com.amazon.coral.service#" + names.get(bad[1], bad[1]),
                                                  "message": bad[2]}), "application/x-amz-json-1.0")
        up = urllib.parse.urlsplit(CFG["upstream"])
        c = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
        hdrs = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        try:
            c.request("POST", path, body=raw, headers=hdrs)
            r = c.getresponse()
            data = r.read()
        except OSError:
            log({"event": "call", "key": ak, "target": target, "status": 502})
            return self.reply(502, "", "text/plain")
        log({"event": "call", "key": ak, "target": target, "status": r.status})
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length", "date", "server"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        c.close()

    def do_POST(self):
        if self.path == "/sts" or self.path.startswith("/sts/"):
            return self.sts()
        if self.path.startswith("/proxy"):
            return self.proxy()
        self.body()
        self.reply(404, "", "text/plain")


http.server.ThreadingHTTPServer.daemon_threads = True
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write("%d\n" % s.server_address[1])
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
s.serve_forever()
