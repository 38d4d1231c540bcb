#!/usr/bin/env bats
# Duplicate storm: 2 000 charges, each delivered 1-5 times in random order,
# drained by 8 concurrent workers -> exactly 2 000 debits at the bank, no
# message lost (queue and DLQ empty), every record DONE.  On the embedded
# default, on DynamoDB (dynalite) + SQS (local-aws-sqs) and on AWS's
# DynamoDB Local + SQS (a duplicate decided from the ALL_OLD item there),
# and with IDEMKIT_TEST_QUEUE_BACKEND=amqp on a RabbitMQ quorum queue (one
# broker for the file, tests/rabbit_helper.bash; that run has the RabbitMQ
# test only, the others run without it).  The workers
# run in stream mode (-j 8 --stream: 8 pipelines of long-lived steps).
# STORM_N overrides the number of charges; STORM_ONESHOT=1 runs the
# one-process-per-step loops instead.

load faults
load ../rabbit_helper
# One storm at a time in this file: each keeps 8 workers busy.
BATS_NO_PARALLELIZE_WITHIN_FILE=true

N=${STORM_N:-2000}
MODE=--stream
[ -z "${STORM_ONESHOT:-}" ] || MODE=

QBACKEND=${IDEMKIT_TEST_QUEUE_BACKEND:-}
setup_file() {
	[ "$QBACKEND" != amqp ] || { require_rabbit; rabbit_start; }
}
teardown_file() {
	[ "$QBACKEND" != amqp ] || rabbit_stop
}

setup() {
	case $BATS_TEST_DESCRIPTION in
	*RabbitMQ*) [ "$QBACKEND" = amqp ] || skip "RabbitMQ: IDEMKIT_TEST_QUEUE_BACKEND=amqp (make faults)" ;;
	*) [ "$QBACKEND" != amqp ] || skip "the RabbitMQ run has the RabbitMQ storm only" ;;
	esac
	bank_start
}
teardown() {
	bank_stop
	aws_stop
}

storm() {
	charges "$N" "$BATS_TEST_TMPDIR/charges" "STORM$1"
	deliveries "$BATS_TEST_TMPDIR/charges" "$BATS_TEST_TMPDIR/messages" 42
	M=$(wc -l < "$BATS_TEST_TMPDIR/messages")
	sqs-send < "$BATS_TEST_TMPDIR/messages" > /dev/null
	[ "$(qdepth)" -eq "$M" ]
	start=$SECONDS
	# shellcheck disable=SC2086
	drain 500 -j 8 $MODE
	check_exactly_once "$BATS_TEST_TMPDIR/charges"
	report "storm $1: $N charges, $M messages, 8 workers ${MODE:---oneshot}: drained in $((SECONDS - start))s; bank debits $(stat_of "$(bank_stats)" debits), attempts $(stat_of "$(bank_stats)" attempts), replays $REPLAYS"
}

@test "duplicate storm, embedded default: $N charges x 1-5 deliveries, 8 workers -> $N debits, queue and DLQ empty, all DONE" {
	embedded_queue 2
	storm embedded
}

@test "duplicate storm, DynamoDB + SQS emulators: $N charges x 1-5 deliveries, 8 workers -> $N debits, queue and DLQ empty, all DONE" {
	aws_queue_store
	storm aws
}

@test "duplicate storm, DynamoDB Local + SQS: $N charges x 1-5 deliveries, 8 workers -> $N debits, queue and DLQ empty, all DONE" {
	aws_queue_store dynamodb-local
	storm aws-ddblocal
}

@test "duplicate storm, RabbitMQ quorum queue: $N charges x 1-5 deliveries, 8 workers -> $N debits, queue and DLQ empty, nothing held, all DONE" {
	require_rabbit
	local q=storm$$x$RANDOM
	export IDEMKIT_QUEUE IDEMKIT_DLQ IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/idem.db
	IDEMKIT_QUEUE=$(rabbit_url "$q" "visibility=2")
	IDEMKIT_DLQ=$(rabbit_url "$q-dlq")
	storm amqp
}
