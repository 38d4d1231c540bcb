#!/usr/bin/env bats
# idemp-init on the embedded store (the DynamoDB side is in dynamodb.bats):
# creates, is idempotent, and every documented exit code it can reach
# without a network.

bats_require_minimum_version 1.5.0
load helper

@test "sqlite: creates the store, prints its URL, and is idempotent" {
	db=$BATS_TEST_TMPDIR/s/idem.db
	mkdir -p "${db%/*}"
	run --separate-stderr idemp-init --store "sqlite:$db"
	[ "$status" -eq 0 ]
	[ "$output" = "sqlite:$db" ]
	[ -f "$db" ]
	run --separate-stderr idemp-init --store "sqlite:$db"
	[ "$status" -eq 0 ]
	IDEMKIT_STORE=sqlite:$db run --separate-stderr idemp-claim < <(ev "$(uid a)")
	[ "$status" -eq 0 ]
}

@test "default store: the state directory" {
	run --separate-stderr idemp-init
	[ "$status" -eq 0 ]
	[ "$output" = "sqlite:$IDEMKIT_STATE_DIR/idempotency.db" ]
	[ -f "$IDEMKIT_STATE_DIR/idempotency.db" ]
}

@test "unknown store scheme -> 78" {
	run --separate-stderr idemp-init --store redis:x
	[ "$status" -eq 78 ]
	[[ $stderr == *"unknown scheme"* ]]
}

@test "usage -> 64; --help and --version -> 0" {
	run --separate-stderr idemp-init a b
	[ "$status" -eq 64 ]
	[[ $stderr == *"usage: idemp-init [--store URL]"* ]]
	run idemp-init --help
	[ "$status" -eq 0 ]
	[[ $output == *"usage: idemp-init"* ]]
	run idemp-init --version
	[ "$status" -eq 0 ]
}

@test "DynamoDB without credentials or region -> 78 (no network needed)" {
	aws_test_env
	unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
	run --separate-stderr idemp-init --store dynamodb:some-table
	[ "$status" -eq 78 ]
	[[ $stderr == *"no AWS credentials"* ]]
}

@test "a retention not longer than the lease (IDEMKIT_RETENTION, IDEMKIT_LEASE) is 78, the store untouched (issue 24 item 15)" {
	db=$BATS_TEST_TMPDIR/r/idem.db
	mkdir -p "${db%/*}"
	IDEMKIT_RETENTION=1m run --separate-stderr idemp-init --store "sqlite:$db"
	[ "$status" -eq 78 ]
	[ "$stderr" = "idemp-init: IDEMKIT_RETENTION (60s) is not longer than the lease (120s): a record would expire while its claim is live and a second worker claim it afresh" ]
	[ ! -e "$db" ]
	IDEMKIT_RETENTION=1h IDEMKIT_LEASE=2h run --separate-stderr idemp-init --store "sqlite:$db"
	[ "$status" -eq 78 ]
	IDEMKIT_LEASE=48h run --separate-stderr idemp-init --store "sqlite:$db"
	[ "$status" -eq 78 ]
	[[ "$stderr" == *'IDEMKIT_LEASE: "48h" is not a duration'* ]]
	[ ! -e "$db" ]
	IDEMKIT_RETENTION=3h IDEMKIT_LEASE=2h run --separate-stderr idemp-init --store "sqlite:$db"
	[ "$status" -eq 0 ]
	[ -f "$db" ]
}
