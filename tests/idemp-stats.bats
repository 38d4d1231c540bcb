#!/usr/bin/env bats
# idemp-stats on every store (IDEMKIT_TEST_BACKEND=sqlite, the default,
# dynamodb against dynalite, postgres or redis on a server started for the
# file; each test on a fresh store): the counts per state, stuck and the DNF
# backlog with their ages, the JSON shape, the human view on a terminal, and
# on SQLite the proof that the stuck and DNF counts search the index
# instead of scanning the table (postgres: tests/postgres.bats, the plan).

bats_require_minimum_version 1.5.0
load helper

backend=${IDEMKIT_TEST_BACKEND:-sqlite}
case $backend in
postgres) load pg_helper ;;
redis) load redis_helper ;;
esac

# one server for the file, which some tests empty (FLUSHALL): the tests
# run one at a time (tests/run.sh)
BATS_NO_PARALLELIZE_WITHIN_FILE=true

setup_file() {
	case $backend in
	dynamodb) require_node; aws_test_env; dynalite_start ;;
	postgres) pg_start ;;
	redis) require_redis; redis_start ;;
	esac
}
teardown_file() {
	case $backend in
	dynamodb) dynalite_stop ;;
	postgres) pg_stop ;;
	redis) redis_stop ;;
	esac
}
setup() {
	case $backend in
	dynamodb) export IDEMKIT_STORE=dynamodb:st-$$-$RANDOM-${BATS_SUITE_TEST_NUMBER} ;;
	postgres)
		export TBL=st_${BATS_SUITE_TEST_NUMBER}_$RANDOM
		export IDEMKIT_STORE="$PG_URL?table=$TBL"
		;;
	redis)
		rcli FLUSHALL >/dev/null
		export IDEMKIT_STORE=redis://127.0.0.1:$REDIS_PORT
		;;
	*) export IDEMKIT_STORE=sqlite:$BATS_TEST_TMPDIR/s.db ;;
	esac
	idemp-init >/dev/null 2>&1
}

# record ID STATE: a record for ID in STATE (IN_PROGRESS: a live claim).
record() {
	env=$(ev "$1" | idemp-claim ${3:+--lease $3} 2>/dev/null)
	[ "$2" = IN_PROGRESS ] || printf '%s\n' "$env" | idemp-done --state "$2" >/dev/null 2>&1
}

# done_is N: the DONE count in $output is N on SQLite (exact); on DynamoDB
# it is the table's ItemCount less the open records, an estimate that
# dynalite never refreshes (its ItemCount stays 0): a number, not below 0.
# On PostgreSQL the estimate is the table's reltuples (less the open
# records): exact once ANALYZE has run, so it is run and stats read again.
# On Redis it is the size of the DONE index: exact on a store where no
# record expired.
done_is() {
	case $backend in
	dynamodb) [[ "$(jget "$output" states.DONE)" =~ ^[0-9]+$ ]] ;;
	postgres)
		pg_sql "ANALYZE $TBL"
		[ "$(jget "$(idemp-stats --json 2>/dev/null)" states.DONE)" -eq "$1" ]
		;;
	*) [ "$(jget "$output" states.DONE)" -eq "$1" ] ;;
	esac
}

@test "--help lists its exit codes; --version; stray arguments are 64" {
	run idemp-stats --help
	[ "$status" -eq 0 ]
	for c in "0  OK" "64  USAGE" "75  TEMPFAIL" "78  CONFIG"; do [[ "$output" == *"$c"* ]]; done
	run idemp-stats --version
	[ "$status" -eq 0 ]
	run idemp-stats extra
	[ "$status" -eq 64 ]
	run idemp-stats --nope
	[ "$status" -eq 64 ]
}

@test "an empty store: every count 0, exactly the documented JSON" {
	run --separate-stderr idemp-stats --json
	[ "$status" -eq 0 ]
	[ "$output" = '{"states":{"IN_PROGRESS":0,"DONE":0,"FAILED":0,"DEBITED_NOTIFICATION_FAILED":0},"stuck":0,"oldestStuckMs":0,"dnfBacklog":0,"oldestDnfMs":0}' ]
}

@test "counts per state, stuck and the DNF backlog with their ages" {
	record "$(uid d1)" DONE
	record "$(uid d2)" DONE
	record "$(uid f1)" FAILED
	record "$(uid n1)" DEBITED_NOTIFICATION_FAILED
	record "$(uid n2)" DEBITED_NOTIFICATION_FAILED
	record "$(uid live)" IN_PROGRESS
	record "$(uid s1)" IN_PROGRESS 1s
	record "$(uid s2)" IN_PROGRESS 1s
	sleep 1.2   # the two 1s leases end
	# not a pipe: JSON is the default off a terminal
	run --separate-stderr idemp-stats
	[ "$status" -eq 0 ]
	[ "$(jget "$output" states.IN_PROGRESS)" -eq 3 ]
	[ "$(jget "$output" states.FAILED)" -eq 1 ]
	[ "$(jget "$output" states.DEBITED_NOTIFICATION_FAILED)" -eq 2 ]
	done_is 2
	[ "$(jget "$output" stuck)" -eq 2 ]
	[ "$(jget "$output" dnfBacklog)" -eq 2 ]
	[ "$(jget "$output" oldestStuckMs)" -ge 1000 ]
	[ "$(jget "$output" oldestDnfMs)" -ge 1000 ]
	# a stuck record claimed again is no longer stuck
	ev "$(uid s1)" | idemp-claim >/dev/null 2>&1
	run --separate-stderr idemp-stats --json
	[ "$(jget "$output" stuck)" -eq 1 ]
	[ "$(jget "$output" states.IN_PROGRESS)" -eq 3 ]
	# a re-notified DNF leaves the backlog
	idemp-list --state DEBITED_NOTIFICATION_FAILED --format envelope | head -1 \
		| sed 's/}$/,"notify":{"outcome":"OK"}}/' | idemp-done --renotified >/dev/null 2>&1
	run --separate-stderr idemp-stats --json
	[ "$(jget "$output" dnfBacklog)" -eq 1 ]
	done_is 3
}

@test "on a terminal: the short human view" {
	command -v script >/dev/null || skip "script(1) not installed"
	record "$(uid n1)" DEBITED_NOTIFICATION_FAILED
	record "$(uid s1)" IN_PROGRESS 1s
	sleep 1.2
	run script -qec "idemp-stats" /dev/null
	[ "$status" -eq 0 ]
	out=$(printf '%s' "$output" | tr -d '\r')
	shown=$IDEMKIT_STORE
	# the password as *** (postgres)
	[ "$backend" != postgres ] || shown=${IDEMKIT_STORE/:$PG_PASSWORD@/:***@}
	[[ "$out" == *"store        $shown"* ]]
	[ "$backend" != postgres ] || [[ "$out" != *"$PG_PASSWORD"* ]]
	[[ "$out" == *"IN_PROGRESS  1"* ]]
	if [ "$backend" != sqlite ]; then
		[[ "$out" =~ "DONE         ~"[0-9]+" (estimate)" ]]
	else
		[[ "$out" == *"DONE         0"$'\n'* ]]
	fi
	[[ "$out" == *"DEBITED_NOTIFICATION_FAILED 1"* ]]
	[[ "$out" =~ "stuck        1 IN_PROGRESS with an ended lease, oldest "[0-9]+s ]]
	[[ "$out" =~ "DNF backlog  1 to re-notify, oldest "[0-9]+s ]]
	# --json on a terminal too
	run script -qec "idemp-stats --json" /dev/null
	[[ "$output" == '{"states":'* ]]
}

@test "a bad store URL is 78; an unreachable store is 75" {
	run --separate-stderr idemp-stats --store nosuch:x
	[ "$status" -eq 78 ]
	[[ "$stderr" == "idemp-stats: "* ]]
	if [ "$backend" = dynamodb ]; then
		AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:1 IDEMKIT_AWS_MAX_ATTEMPTS=1 \
			run --separate-stderr idemp-stats
		[ "$status" -eq 75 ]
	elif [ "$backend" = postgres ]; then
		run --separate-stderr idemp-stats --store "postgres://idemkit@127.0.0.1:1/idemkit"
		[ "$status" -eq 75 ]
	elif [ "$backend" = redis ]; then
		run --separate-stderr idemp-stats --store "redis://127.0.0.1:1"
		[ "$status" -eq 75 ]
	else
		run --separate-stderr idemp-stats --store "sqlite:$BATS_TEST_TMPDIR/no/such/dir/s.db"
		[ "$status" -eq 78 ]
	fi
	[ -z "$output" ]
}

@test "sqlite: no stats statement scans the table (EXPLAIN QUERY PLAN, full-scan steps)" {
	[ "${IDEMKIT_TEST_BACKEND:-sqlite}" = sqlite ] || skip "the SQLite store's plan"
	run "$IDEMKIT_TEST_BIN/sqlite_stats_plan" "$BATS_TEST_TMPDIR/plan.db"
	echo "$output"
	[ "$status" -eq 0 ]
	for q in COUNT STUCK DNF; do
		grep -q "^$q plan SEARCH records USING .*INDEX records_state (state=?)" <<<"$output"
		grep -qx "$q fullscan 0" <<<"$output"
		# 2000 DONE records in the store: a search of one state does not
		# step through them
		steps=$(awk -v q="$q" '$1 == q && $2 == "steps" {print $3}' <<<"$output")
		[ "$steps" -lt 200 ]
	done
	if grep -q ' plan SCAN' <<<"$output"; then false; fi
	grep -qx "STUCK row 1" <<<"$output"
	grep -qx "DNF row 1" <<<"$output"
}

@test "FAILED is exact: idemp-forget takes one off; claimed afresh it counts as IN_PROGRESS" {
	record "$(uid f1)" FAILED
	record "$(uid f2)" FAILED
	record "$(uid f3)" FAILED
	record "$(uid d1)" DONE
	run --separate-stderr idemp-stats --json
	[ "$(jget "$output" states.FAILED)" -eq 3 ]
	done_is 1
	idemp-forget "$(uid f2)" >/dev/null 2>&1
	run --separate-stderr idemp-stats --json
	[ "$(jget "$output" states.FAILED)" -eq 2 ]
	[ "$(jget "$output" states.IN_PROGRESS)" -eq 0 ]
	# forgotten and claimed again: IN_PROGRESS, not FAILED
	record "$(uid f2)" IN_PROGRESS
	run --separate-stderr idemp-stats --json
	[ "$(jget "$output" states.FAILED)" -eq 2 ]
	[ "$(jget "$output" states.IN_PROGRESS)" -eq 1 ]
	[ "$(jget "$output" stuck)" -eq 0 ]
}

@test "redis: records past their retention drop out of the counts the moment Redis forgets them" {
	[ "$backend" = redis ] || skip "the Redis store's live sets"
	# expiresAt is whole seconds: a 10s retention ends 9 to 10s from now
	# (room for the five records and the first look on a loaded machine:
	# CI's sanitized pass spent 4 s of it before that look)
	IDEMKIT_RETENTION=10s record "$(uid f1)" FAILED 1s
	IDEMKIT_RETENTION=10s record "$(uid n1)" DEBITED_NOTIFICATION_FAILED 1s
	IDEMKIT_RETENTION=10s record "$(uid s1)" IN_PROGRESS 1s
	record "$(uid f2)" FAILED
	record "$(uid n2)" DEBITED_NOTIFICATION_FAILED
	run --separate-stderr idemp-stats --json
	[ "$(jget "$output" states.FAILED)" -eq 2 ]
	[ "$(jget "$output" dnfBacklog)" -eq 2 ]
	[ "$(jget "$output" states.IN_PROGRESS)" -eq 1 ]
	# until Redis has forgotten the three (9 to 10 s), not a fixed sleep
	for _ in $(seq 300); do
		[ "$(rcli EXISTS "idemkit:rec:$(uid f1)" "idemkit:rec:$(uid n1)" "idemkit:rec:$(uid s1)")" = 0 ] && break
		sleep 0.1
	done
	[ "$(rcli EXISTS "idemkit:rec:$(uid f1)" "idemkit:rec:$(uid n1)" "idemkit:rec:$(uid s1)")" = 0 ]
	run --separate-stderr idemp-stats --json
	[ "$status" -eq 0 ]
	[ "$(jget "$output" states.FAILED)" -eq 1 ]
	[ "$(jget "$output" states.DEBITED_NOTIFICATION_FAILED)" -eq 1 ]
	[ "$(jget "$output" dnfBacklog)" -eq 1 ]
	[ "$(jget "$output" states.IN_PROGRESS)" -eq 0 ]
	[ "$(jget "$output" stuck)" -eq 0 ]
	[ "$(jget "$output" oldestStuckMs)" -eq 0 ]
	# the expired members were dropped from the indexes as stats met them
	[ "$(rcli ZCARD idemkit:idx:IN_PROGRESS)" = 0 ]
	[ "$(rcli ZCARD idemkit:idx:DEBITED_NOTIFICATION_FAILED)" = 1 ]
}
