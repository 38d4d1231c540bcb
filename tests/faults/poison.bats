#!/usr/bin/env bats
# Poison messages among good ones: invalid JSON, missing fields, a
# fractional amount, control characters, a 10 000-character chargeId, an
# unknown currency (and more) -> each in the DLQ with its body byte for
# byte and the reason in its attributes; the good charges are debited
# exactly once; the worker keeps going and the queue ends empty.  Embedded
# default, and SQS + DynamoDB emulators.  A body over 256 KiB never gets
# that far: both queues refuse it at send, as SQS does (65, the line named,
# the lines around it sent).

load faults

setup() { bank_start; }
teardown() {
	bank_stop
	aws_stop
}

# poison_bodies FILE: one poison body per line, and its expected reason (a
# substring of idemkit.error) in FILE.why.
poison_bodies() {
	python3 - "$1" <<'PY'
import json, sys
out = sys.argv[1]
ok = {"chargeId": "P-OK", "accountId": "ACC-1", "amount": 100, "currency": "INR", "chargeType": "FEE"}
def ev(**kw):
    d = dict(ok); d.update(kw)
    return json.dumps({k: v for k, v in d.items() if v is not None}, separators=(",", ":"))
cases = [
    ("not json at all {", "not valid JSON"),
    ('{"chargeId":"P-TRUNC","accountId":"ACC-1","amount":1', "not valid JSON"),
    ("[1,2,3]", ""),
    (ev(chargeId="P-NOACC", accountId=None), "accountId: missing"),
    (ev(chargeId=None), "chargeId"),
    (ev(chargeId="P-NOAMT", amount=None), "amount: missing"),
    (ev(chargeId="P-FRAC").replace('"amount":100', '"amount":12.5'), "amount"),
    (ev(chargeId="P-EXP").replace('"amount":100', '"amount":1e3'), "amount"),
    (ev(chargeId="P-NEG", amount=-5), "amount"),
    (ev(chargeId="P-STR", amount="100"), "amount"),
    (ev(chargeId="P-CTL\u0001X"), "chargeId"),
    ('{"chargeId":"P-RAWCTL","accountId":"ACC-1","amount":100,"currency":"INR","chargeType":"FEE","note":"a\x01\x1fb"}', "control character 0x01"),
    (ev(chargeId="P-" + "L" * 9998), "chargeId"),
    (ev(chargeId="P-CUR", currency="XYZ"), "currency"),
    (ev(chargeId="P-CUR2", currency="inr"), "currency"),
]
with open(out, "w") as f, open(out + ".why", "w") as w:
    for body, why in cases:
        assert "\n" not in body
        f.write(body + "\n"); w.write(why + "\n")
PY
}

# poison LABEL [WORKER OPTION...]
poison() {
	poison_bodies "$BATS_TEST_TMPDIR/poison"
	charges 30 "$BATS_TEST_TMPDIR/charges" "GOOD$BATS_TEST_NUMBER"
	# poison first, then good charges, then more poison: the worker must go on
	{ head -8 "$BATS_TEST_TMPDIR/poison"; cat "$BATS_TEST_TMPDIR/charges"; tail -n +9 "$BATS_TEST_TMPDIR/poison"; } \
		> "$BATS_TEST_TMPDIR/messages"
	sqs-send < "$BATS_TEST_TMPDIR/messages" > /dev/null
	# one worker, so "keeps going" is one process's doing
	drain 60 -j 1 "${@:2}"
	# the good ones: once each; and the DLQ holds exactly the poison
	sqs-recv --queue "$IDEMKIT_DLQ" --max 10 --drain --visibility 60 > "$BATS_TEST_TMPDIR/dlq"
	python3 - "$BATS_TEST_TMPDIR/poison" "$BATS_TEST_TMPDIR/dlq" <<'PY'
import json, sys
want = open(sys.argv[1], encoding="utf-8", newline="\n").read().split("\n")[:-1]
why = open(sys.argv[1] + ".why").read().split("\n")[:-1]
got = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
bodies = [g["body"] for g in got]
bad = []
if sorted(bodies) != sorted(want):
    bad.append("DLQ bodies differ: %d in DLQ, %d poison; missing %s; extra %s" % (
        len(bodies), len(want), [w[:40] for w in want if w not in bodies][:5],
        [b[:40] for b in bodies if b not in want][:5]))
for g in got:
    a = g.get("attributes") or {}
    if a.get("idemkit.reason") != "DATAERR" or not a.get("idemkit.error"):
        bad.append("no reason on %r: %r" % (g["body"][:40], a))
    elif g["body"] in want and why[want.index(g["body"])] not in a["idemkit.error"]:
        bad.append("reason for %r is %r, want %r" % (g["body"][:40], a["idemkit.error"], why[want.index(g["body"])]))
print("\n".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
PY
	# now empty the DLQ we just read, then the usual exactly-once checks
	sqs-ack --queue "$IDEMKIT_DLQ" --stream < <(sed 's/}$/,"claim":{"outcome":"DUP_DONE"}}/' "$BATS_TEST_TMPDIR/dlq") >/dev/null 2>&1 || true
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
	report "poison $1: $(wc -l < "$BATS_TEST_TMPDIR/poison") poison bodies -> DLQ intact with reasons; 30 good charges debited once"
}

@test "poison, embedded default: every poison body reaches the DLQ intact with its reason; good charges debited once" {
	embedded_queue 2
	# the body over 256 KiB, between two good ones: refused at send, by
	# line, the two sent; the queue holds nothing else of it
	python3 -c 'import json
ok = {"accountId": "ACC-1", "amount": 100, "currency": "INR", "chargeType": "FEE"}
for c, note in (("BIG-BEFORE", ""), ("P-BIG", "x" * (256 * 1024)), ("BIG-AFTER", "")):
    print(json.dumps(dict(ok, chargeId=c, note=note), separators=(",", ":")))' > "$BATS_TEST_TMPDIR/big"
	run sqs-send < "$BATS_TEST_TMPDIR/big"
	[ "$status" -eq 65 ]
	[[ "$output" == *"line 2 not sent: message of "*" bytes"*"the largest a queue takes is 262144 (256 KiB"* ]]
	[ "$(grep -c '^{' <<< "$output")" -eq 2 ]
	[ "$(sqs-stat)" = '{"visible":2,"inflight":0,"delayed":0}' ]
	sqs-recv --max 10 --visibility 60 | sed 's/}$/,"claim":{"outcome":"DUP_DONE"}}/' | sqs-ack --stream >/dev/null
	[ "$(sqs-stat)" = '{"visible":0,"inflight":0,"delayed":0}' ]
	poison embedded
}

@test "poison, SQS + DynamoDB emulators: the same (bodies SQS accepts)" {
	aws_queue_store
	poison aws --stream
}
