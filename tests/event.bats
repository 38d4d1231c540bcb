#!/usr/bin/env bats
# The ChargeDueEvent v1 validation table (DESIGN.md), rule by rule, through
# idemp-claim: each bad body is DATAERR (65) with a reason naming the field,
# and the body travels on intact in the envelope.

bats_require_minimum_version 1.5.0
load helper

# bad BODY FIELD-AND-REASON-PATTERN
bad() {
	run --separate-stderr idemp-claim <<<"$1"
	echo "status=$status stdout=${output:0:300} stderr=${stderr:0:300}"
	[ "$status" -eq 65 ]
	[ "$(jget "$output" claim.outcome)" = DATAERR ]
	[[ "$(jget "$output" claim.error)" == $2 ]]
	[ "$(jget "$output" body)" = "$1" ]
}

base='"chargeId":"CHG-1","accountId":"ACC-1","currency":"INR","chargeType":"SMS_ALERT_FEE"'

@test "fractional amount" { bad "{$base,\"amount\":2500.5}" "amount: fraction not allowed*"; }
@test "integral-looking fraction 2500.0" { bad "{$base,\"amount\":2500.0}" "amount: fraction*"; }
@test "exponent 1e3" { bad "{$base,\"amount\":1e3}" "amount: exponent not allowed*"; }
@test "negative amount" { bad "{$base,\"amount\":-5}" "amount: negative*"; }
@test "zero amount" { bad "{$base,\"amount\":0}" "amount: must be at least 1*"; }
@test "string amount" { bad "{$base,\"amount\":\"2500\"}" "amount: *not a string*"; }
@test "amount over 10^12" { bad "{$base,\"amount\":1000000000001}" "amount: *exceeds*"; }
@test "amount missing" { bad "{$base}" "amount: missing"; }
@test "amount duplicated" { bad "{$base,\"amount\":1,\"amount\":2}" "amount: appears more than once"; }

@test "129-character chargeId" {
	long=$(printf 'C%.0s' $(seq 1 129))
	bad "{\"chargeId\":\"$long\",\"accountId\":\"ACC-1\",\"amount\":1,\"currency\":\"INR\",\"chargeType\":\"X\"}" \
		"chargeId: 129 characters, at most 128 allowed"
}
@test "128-character chargeId is fine" {
	long=$(printf 'C%.0s' $(seq 1 128))
	run --separate-stderr idemp-claim <<<"{\"chargeId\":\"$long\",\"accountId\":\"ACC-1\",\"amount\":1,\"currency\":\"INR\",\"chargeType\":\"X\"}"
	[ "$status" -eq 0 ]
}
@test "chargeId with a character outside the alphabet" {
	bad '{"chargeId":"CHG/1","accountId":"ACC-1","amount":1,"currency":"INR","chargeType":"X"}' \
		'chargeId: character 4 of "CHG/1" is not in*'
}
@test "chargeId not a string" {
	bad '{"chargeId":123,"accountId":"ACC-1","amount":1,"currency":"INR","chargeType":"X"}' "chargeId: must be a string"
}
@test "accountId missing" {
	bad '{"chargeId":"C1","amount":1,"currency":"INR","chargeType":"X"}' "accountId: missing"
}
@test "accountId too long" {
	long=$(printf 'A%.0s' $(seq 1 65))
	bad "{\"chargeId\":\"C1\",\"accountId\":\"$long\",\"amount\":1,\"currency\":\"INR\",\"chargeType\":\"X\"}" \
		"accountId: 65 characters*"
}
@test "lower-case currency" {
	bad '{"chargeId":"C1","accountId":"A1","amount":1,"currency":"inr","chargeType":"X"}' \
		'currency: "inr" is not an ISO 4217 code*'
}
@test "unknown currency" {
	bad '{"chargeId":"C1","accountId":"A1","amount":1,"currency":"ABC","chargeType":"X"}' \
		'currency: unknown ISO 4217 code "ABC"'
}
@test "currency missing" {
	bad '{"chargeId":"C1","accountId":"A1","amount":1,"chargeType":"X"}' "currency: missing"
}
@test "chargeType lower case" {
	bad '{"chargeId":"C1","accountId":"A1","amount":1,"currency":"INR","chargeType":"sms"}' 'chargeType: "sms" must match*'
}
@test "chargeType missing" {
	bad '{"chargeId":"C1","accountId":"A1","amount":1,"currency":"INR"}' "chargeType: missing"
}
@test "bad dueDate" {
	bad '{"chargeId":"C1","accountId":"A1","amount":1,"currency":"INR","chargeType":"X","dueDate":"2026-02-30"}' \
		'dueDate: "2026-02-30" is not a date*'
}
@test "non-JSON body" { bad 'this is not json' "body: not valid JSON"; }
@test "JSON but not an object" { bad '[1,2,3]' "body: not a JSON object"; }
@test "trailing garbage" { bad "{$base,\"amount\":1} x" "body: trailing data*"; }
@test "control characters in a chargeId" {
	bad '{"chargeId":"C\u0001X","accountId":"A1","amount":1,"currency":"INR","chargeType":"X"}' 'chargeId: control character U+0001 after unescaping; not allowed'
}
@test "raw control characters anywhere are refused (JSON has none; cJSON would let them through)" {
	bad "{$base,\"amount\":1,\"note\":\"a$(printf '\001')b\"}" "body: control character 0x01 at byte *"
	bad "{$base,$(printf '\037')\"amount\":1}" "body: control character 0x1f at byte *"
	run --separate-stderr idemp-claim <<<"$(printf '{%s,\t"amount":1}' "$base")"
	[ "$status" -eq 0 ]
}
@test "escaped field names are refused" {
	bad "{$base,\"\\u0061mount\":1}" "body: escaped characters in a field name*"
}
@test "body over 256 KiB" {
	pad=$(head -c 270000 /dev/zero | tr '\0' x)
	bad "{$base,\"amount\":1,\"pad\":\"$pad\"}" "body: * bytes, larger than 256 KiB"
}
@test "unknown fields are kept and ignored; dueDate optional" {
	run --separate-stderr idemp-claim <<<"{$base,\"amount\":1,\"note\":{\"x\":[1,2]}}"
	[ "$status" -eq 0 ]
	[[ "$(jget "$output" body)" == *'"note":{"x":[1,2]}'* ]]
}
@test "a malformed envelope is DATAERR and its line travels as the body" {
	run --separate-stderr idemp-claim <<<'{"v":1,"body":42}'
	[ "$status" -eq 65 ]
	[[ "$(jget "$output" claim.error)" == "envelope: \"body\" missing or not a string" ]]
	[ "$(jget "$output" body)" = '{"v":1,"body":42}' ]
}
@test "fingerprint: same business fields, same fingerprint, whatever the field order" {
	a=$(idemp-claim 2>/dev/null <<<'{"chargeId":"F1","accountId":"A1","amount":7,"currency":"INR","chargeType":"X"}')
	b='{"chargeType":"X","currency":"INR","amount":7,"accountId":"A1","chargeId":"F1","extra":1}'
	run --separate-stderr idemp-claim <<<"$b"
	[ "$status" -eq 11 ]
	want=$(printf 'A1|7|INR|X' | sha256sum | cut -d' ' -f1)
	[ "$(jget "$(idemp-show --json F1)" fingerprint)" = "$want" ]
}

# Escapes that decode to a control character: cJSON would hand the C string
# over cut at a NUL ("ACC-1\u0000EVIL" as "ACC-1"), so each is refused by name.
@test "\\u0000 in accountId is DATAERR, not truncated to ACC-1" {
	bad '{"chargeId":"C1","accountId":"ACC-1\u0000EVIL","amount":1,"currency":"INR","chargeType":"X"}' \
		'accountId: control character U+0000 after unescaping; not allowed'
	# nothing written: no record, or no store at all (a refused event opens
	# none, and idemp-show creates none)
	run idemp-show C1
	[ "$status" -eq 1 ] || [ "$status" -eq 78 ]
	[[ "$output" == *"no record in "* || "$output" == *"no store at "* ]]
}
@test "control characters after unescaping, field by field" {
	bad '{"chargeId":"C1\u001f","accountId":"A1","amount":1,"currency":"INR","chargeType":"X"}' \
		'chargeId: control character U+001F after unescaping*'
	bad '{"chargeId":"C1","accountId":"A1","amount":1,"currency":"IN\u0000R","chargeType":"X"}' \
		'currency: control character U+0000*'
	bad '{"chargeId":"C1","accountId":"A1","amount":1,"currency":"INR","chargeType":"X\u007F"}' \
		'chargeType: control character U+007F*'
	bad '{"chargeId":"C1","accountId":"A1","amount":1,"currency":"INR","chargeType":"X","dueDate":"2026-11-30\u0085"}' \
		'dueDate: control character U+0085*'
	bad '{"chargeId":"C1","accountId":"A\n1","amount":1,"currency":"INR","chargeType":"X"}' \
		'accountId: control character [\\]n after unescaping*'
	bad '{"chargeId":"C1\t","accountId":"A1","amount":1,"currency":"INR","chargeType":"X"}' \
		'chargeId: control character [\\]t after*'
}
@test "escapes that are not control characters still reach the field rules" {
	# \u0041 is "A": allowed by the escape check, then judged as the text it is
	run --separate-stderr idemp-claim <<<'{"chargeId":"C\u0041","accountId":"A1","amount":1,"currency":"INR","chargeType":"X"}'
	[ "$status" -eq 0 ]
	[ "$(jget "$output" claim.chargeId)" = CA ]
	bad '{"chargeId":"C\/1","accountId":"A1","amount":1,"currency":"INR","chargeType":"X"}' \
		'chargeId: character 2 of "C/1" is not in*'
	# an unknown field is kept and ignored, escapes and all
	run --separate-stderr idemp-claim <<<'{"chargeId":"C2","accountId":"A1","amount":1,"currency":"INR","chargeType":"X","note":"a\nb"}'
	[ "$status" -eq 0 ]
}
