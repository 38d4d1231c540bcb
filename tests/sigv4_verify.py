# sigv4_verify.py LOG N ACCESS_KEY SECRET [TOKEN]: checks the Authorization
# header of request N in LOG (from sigv4_capture.py) with botocore's SigV4
# signer (Debian python3-botocore), an implementation independent of
# libcurl's.  Recomputes the signature over exactly the headers the request
# says it signed, at the request's own X-Amz-Date, and also checks that a
# tampered body would NOT verify (so this check can fail).
import json, sys
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

log, n, ak, sk = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
token = sys.argv[5] if len(sys.argv) > 5 else None
rec = [json.loads(l) for l in open(log)][n]
hdrs = {k.lower(): v for k, v in rec["headers"]}

algo, rest = hdrs["authorization"].split(" ", 1)
assert algo == "AWS4-HMAC-SHA256", algo
parts = dict(p.strip().split("=", 1) for p in rest.split(","))
signed = parts["SignedHeaders"].split(";")
stamp = hdrs["x-amz-date"]
assert parts["Credential"] == f"{ak}/{stamp[:8]}/us-east-1/sqs/aws4_request", parts["Credential"]
for h in ("host", "x-amz-date", "x-amz-target", "content-type"):
    assert h in signed, (h, signed)
if token:
    assert hdrs.get("x-amz-security-token") == token, "session token header missing"
    assert "x-amz-security-token" in signed, signed
else:
    assert "x-amz-security-token" not in hdrs

def sign(body):
    req = AWSRequest(method=rec["method"], url="http://" + hdrs["host"] + rec["path"],
                     data=body.encode(), headers={h: hdrs[h] for h in signed})
    signer = SigV4Auth(Credentials(ak, sk, token), "sqs", "us-east-1")
    req.context["timestamp"] = stamp
    canonical = signer.canonical_request(req)
    assert signer.signed_headers(signer.headers_to_sign(req)) == parts["SignedHeaders"]
    return signer.signature(signer.string_to_sign(req, canonical), req)

good = sign(rec["body"])
assert good == parts["Signature"], ("signature mismatch", good, parts["Signature"])
assert sign(rec["body"] + " ") != parts["Signature"], "a tampered body verified"
print("ok", hdrs["x-amz-target"], parts["SignedHeaders"])
