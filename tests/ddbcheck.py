#!/usr/bin/env python3
"""ddbcheck.py LOG MARKER...: reads the DynamoDB requests recproxy.py
logged and checks that data only ever travelled as a value: every
*Expression is made of #name and :value placeholders, keywords, functions
and operators only; no MARKER (a piece of data the test sent) appears in an
expression or an attribute name; and each MARKER did reach DynamoDB (in
Key, Item or ExpressionAttributeValues), so the check saw the data flow.
One line per finding; exit 1 when any."""
import json
import re
import sys

WORDS = {"SET", "REMOVE", "ADD", "DELETE", "AND", "OR", "NOT", "BETWEEN", "IN",
         "attribute_not_exists", "attribute_exists", "attribute_type",
         "if_not_exists", "list_append", "begins_with", "contains", "size"}
TOKEN = re.compile(r"\s*(#\w+|:\w+|[A-Za-z_]\w*|<>|<=|>=|[=<>+\-,()])")

bad = []
seen = {m: False for m in sys.argv[2:]}
reqs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not reqs:
    bad.append("no request was logged")
for n, r in enumerate(reqs, 1):
    b = r["body"]
    if not isinstance(b, dict):
        bad.append("request %d: not a JSON object" % n)
        continue
    for k, v in b.items():
        if k.endswith("Expression"):
            pos = 0
            while pos < len(v):
                m = TOKEN.match(v, pos)
                if not m:
                    bad.append("request %d %s: unexpected text at %r" % (n, k, v[pos:pos + 20]))
                    break
                t = m.group(1)
                if t[0] not in "#:" and t[0].isalpha() and t not in WORDS:
                    bad.append("request %d %s: %r is neither a placeholder nor a keyword" % (n, k, t))
                pos = m.end()
            for mk in seen:
                if mk in v:
                    bad.append("request %d %s holds data %r" % (n, k, mk))
    for name in (b.get("ExpressionAttributeNames") or {}).values():
        for mk in seen:
            if mk in name:
                bad.append("request %d: attribute name holds data %r" % (n, mk))
    carried = json.dumps([b.get("Key"), b.get("Item"), b.get("ExpressionAttributeValues")])
    for mk in seen:
        if mk in carried:
            seen[mk] = True
for mk, ok in seen.items():
    if not ok:
        bad.append("marker %r never reached DynamoDB as a value (the check saw nothing)" % mk)
for line in bad:
    print(line)
print("%d requests checked" % len(reqs))
sys.exit(1 if bad else 0)
