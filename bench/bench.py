#!/usr/bin/env python3
"""bench.py: `make bench` -- idemkit end to end on this machine, as ratios
against this machine's own limits measured in the same run.

N charges (BENCH_N, default 10 000; about 30% of the messages are
redeliveries of an earlier charge) go through the embedded default (SQLite
queue and store, durable commits) with bank-sim as the core-banking API:

  limits        always: durable single-row SQLite commits/s (WAL,
                synchronous=FULL, as lib/conn/sqlite.c), at the start and the
                end
  oneshot       charge-worker, one process per step per receive of up to 10
                messages (per message before issue 30) (-j 2)
  stream        charge-worker --stream (-j BENCH_J, default 1)
  oneshot-lat   one-shot, bank latency 50 ms, -j 32
  stream-lat    --stream, bank latency 50 ms: -j 1 --inflight 64 when
                charge-worker has --inflight, else -j 32 (one in flight)
  emulators     the stream scenario on dynalite (store) and local-aws-sqs
                (queue, DLQ) from node_modules (BENCH_EMU_N messages)
  sqs-queue     the stream scenario on local-aws-sqs (queue, DLQ) with the
                embedded store (BENCH_EMU_N messages)
  amqp          the same on a throwaway RabbitMQ broker's queue (needs
                rabbitmq-server): its charges/s over sqs-queue's is
                amqpVsSqs (issue 46's bar: at least 0.8)
  postgres      the stream scenario on a throwaway PostgreSQL store
                (root needed, else skipped; BENCH_PG_N messages), beside
                the server's single-row durable commits/s (pgbench)
  postgres-lat  the same at the bank latency, as stream-lat
  month-end     a backlog of BENCH_MONTH_N (100 000) queued charges drained by
                charge-worker -j 2 --stream at the bank latency: time to
                drain, charges/s against inflight x jobs / latency
  jq            the jq mapping's cost (issue 13), BENCH_JQ_REPS rounds
  claim-cost    idemp-claim with 10^3 and BENCH_BIG (10^6) records stored
  redis         the Redis store and the cache in front of it
  claim-cost-pg the claim cost on PostgreSQL
  idemp-run     the wall time idemp-run adds to a command on the embedded
                store (claim + finish; BENCH_RUN_N runs each way)
  outbox        the stream scenario without and with IDEMKIT_OUTBOX (the
                relay idemp-outbox --follow beside it): client CPU per
                charge each way, the relay's events/s, CPU and lag
  outbox-redis  the same on a Redis store (redis-server on loopback, AOF
                with appendfsync always), with the store's round trips and
                append-only-file transactions per charge each way
  outbox-pg     the same on a throwaway PostgreSQL store (root needed,
                BENCH_PG_N messages), with each run's write transactions
                and WAL bytes per charge

BENCH_ONLY=a,b,... runs only those; BENCH_QUICK=1 makes every count small
(1 000 messages, 100 one-shot, 10^5 records, 1 000 claims, 300 on the
emulators, one jq round) so the whole bench takes a few minutes.  Every
scenario's duplicates debited must be 0: the bench says so loudly and
exits 1 otherwise.

Client CPU is user+sys of the toolkit's own processes only: the rusage
wait4 gives for charge-worker, which waits for all of its descendants
(bank-sim and the emulators are not in that tree); peak RSS is the
largest single process of that tree, from GNU time's %M (the bench's own
python would otherwise count: Linux keeps the peak RSS across exec).  Stream
scenarios also sample /proc for the split per command.  bank-sim's CPU
and the PostgreSQL server's, outside that tree, are read from /proc around
the run: with the client's, what the machine's cores allow when every
process a charge needs shares them (cpu_ceiling).  Claim-to-ack
latency is taken for the charges a worker acquired: from the claim
(claim.leaseUntil minus the lease) to ack.at, in the envelopes sqs-ack
writes, kept by a tee after sqs-ack (stream); one-shot latency comes from a
separate, smaller run with a tap wrapper, so that the wrapper's CPU does
not count.  Duplicates debited come from bank-sim's ledger: a charge
debited twice, or a debit request the bank had to answer as a replay of one
it already had.

Results: build/bench/results.json and build/bench/results.md.
"""

import glob
import json
import os
import subprocess
import sys
from harness import (BIG, BIN, CLAIMS, EMU_N, HAS_INFLIGHT, INFLIGHT, J, LAT_INFLIGHT, LAT_J,
    LAT_MS, MONTH_N, N, N1, ONLY, OUT, PG_N, QUICK, RUN_N, SMALL, log, oneshot_latency,
    sqlite_commit_limit, worker_run)
from servers import amqp_run, emulator_run, postgres_lat_run, postgres_run, sqs_queue_run
from costs import (JQ_REPS, claim_cost, claim_cost_pg, idemp_run_cost, jq_cost, outbox_cost,
    outbox_cost_redis, outbox_pg_cost, redis_bench)
from report import log_cpu, machine, markdown


def want(name):
    return not ONLY or name in ONLY


def main():
    for tool in ("charge-worker", "bank-sim", "sqs-send", "sqs-ack", "idemp-claim"):
        if not os.access(os.path.join(BIN, tool), os.X_OK):
            raise SystemExit("bench: %s/%s missing; run make first" % (BIN, tool))
    os.makedirs(OUT, exist_ok=True)
    r = {"machine": machine(), "params": {"quick": QUICK, "N": N, "oneshotN": N1, "j": J,
                                          "latencyMs": LAT_MS, "latencyJ": LAT_J,
                                          "hasInflight": HAS_INFLIGHT, "inflight": INFLIGHT,
                                          "latencyInflight": LAT_INFLIGHT, "big": BIG,
                                          "claims": CLAIMS, "emulatorN": EMU_N, "postgresN": PG_N,
                                          "monthEndN": MONTH_N},
         "scenarios": []}
    if True:   # always: the ratios need it
        log("bench: this machine's durable SQLite commits/s (WAL, synchronous=FULL)...")
        r["limits"] = {"sqliteBefore": sqlite_commit_limit()}
        log("  %d commits/s" % r["limits"]["sqliteBefore"]["commitsPerSecond"])
    plan = [
        ("oneshot", N1, False, 2, 0, 0),
        ("stream", N, True, J, 0, INFLIGHT),
        ("oneshot-lat", N1, False, 32, LAT_MS, 0),
        ("stream-lat", N, True, LAT_J, LAT_MS, LAT_INFLIGHT),
        # a month-end backlog: everything queued first, two pipelines
        ("month-end", MONTH_N, True, 2, LAT_MS, LAT_INFLIGHT),
    ]
    for name, n, stream, jobs, lat, inflight in plan:
        if not want(name):
            continue
        log("bench: %s (%d messages, -j %d, bank latency %d ms%s)..." % (
            name, n, jobs, lat, ", --inflight %d" % inflight if inflight and HAS_INFLIGHT else ""))
        # the machine drifts: its commit limit again, just before
        limit = sqlite_commit_limit(0.5 if QUICK else 1.0)["commitsPerSecond"]
        s = worker_run(name, n, stream, jobs, lat, tap=stream, inflight=inflight)
        s["sqliteCommitsPerSecondBefore"] = limit
        if not stream:
            s["latencyP50Ms"], s["latencyP99Ms"], s["latencySamples"] = \
                oneshot_latency(name, max(50, n // 4), jobs, lat)
            s["latencyFrom"] = "a separate run of %d messages with the tap" % max(50, n // 4)
        log("  %s/s, %s ms CPU per charge, p50 %s ms, p99 %s ms, duplicates debited %d" % (
            s["chargesPerSecond"], s["clientCpuMsPerCharge"], s["latencyP50Ms"],
            s["latencyP99Ms"], s["duplicatesDebited"]))
        log_cpu(s)
        r["scenarios"].append(s)
    for name, fn, n in (("emulators", emulator_run, EMU_N), ("sqs-queue", sqs_queue_run, EMU_N),
                        ("amqp", amqp_run, EMU_N), ("postgres", postgres_run, PG_N),
                        ("postgres-lat", postgres_lat_run, PG_N)):
        if not want(name):
            continue
        log("bench: %s (%d messages, stream, -j %d)..." % (name, n, J))
        try:
            s = fn(n, J)
        except RuntimeError as e:
            log("  skipped: %s" % e)
            r.setdefault("skipped", {})[name] = str(e)
            continue
        log("  %s/s, %s ms CPU per charge, p50 %s ms, p99 %s ms, duplicates debited %d" % (
            s["chargesPerSecond"], s["clientCpuMsPerCharge"], s["latencyP50Ms"],
            s["latencyP99Ms"], s["duplicatesDebited"]))
        log_cpu(s)
        if s.get("emulatorCpuMsPerMessage"):
            log("  emulators' CPU ms per message %s; ceiling %s/s (%s of it)" % (
                json.dumps(s["emulatorCpuMsPerMessage"]), s.get("ceilingPerSecond"),
                s.get("ofCeiling")))
        r["scenarios"].append(s)
    # RabbitMQ against the SQS path, the same store and mix (issue 46's bar:
    # at least 0.8)
    by = {s["scenario"]: s for s in r["scenarios"]}
    if "amqp" in by and "sqs-queue" in by and by["sqs-queue"].get("chargesPerSecond"):
        r["amqpVsSqs"] = round(by["amqp"]["chargesPerSecond"] / by["sqs-queue"]["chargesPerSecond"], 3)
        log("bench: RabbitMQ --stream throughput %.3f x the SQS path (local-aws-sqs), the bar 0.8"
            % r["amqpVsSqs"])
    if want("jq"):
        log("bench: jq mapping cost (%d messages x %d rounds x 3 variants, stream)..." % (N, JQ_REPS))
        r["jqCost"] = jq_cost()
    if want("claim-cost"):
        log("bench: claim cost with %d vs %d records in the store..." % (SMALL, BIG))
        r["claimCost"] = claim_cost()
    if want("redis"):
        log("bench: Redis store and cache (%d claims)..." % CLAIMS)
        r["redis"] = redis_bench()
    if want("claim-cost-pg"):
        log("bench: claim cost on PostgreSQL with %d vs %d records..." % (SMALL, BIG))
        try:
            r["claimCostPostgres"] = claim_cost_pg()
            r["claimCostPostgres"]["version"] = subprocess.run(
                [sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1] + "/postgres", "--version"],
                capture_output=True, text=True).stdout.split()[2]
        except RuntimeError as e:
            log("  skipped: %s" % e)
            r["claimCostPostgresSkipped"] = str(e)
    if want("idemp-run"):
        log("bench: idemp-run's cost (%d runs each way)..." % RUN_N)
        r["idempRun"] = idemp_run_cost()
        log("  adds %s ms (median %s vs %s ms)" % (
            r["idempRun"]["overheadMs"], r["idempRun"]["underMedianMs"],
            r["idempRun"]["bareMedianMs"]))
    if want("outbox"):
        log("bench: the outbox's cost (%d messages, stream, without and with it)..." % N)
        r["outbox"] = o = outbox_cost()
        log("  client CPU %s -> %s ms per charge (%+.1f %%); relay %s events/s, %s waiting "
            "when the worker ended, drained %s s later" % (
                o["off"]["clientCpuMsPerCharge"], o["on"]["clientCpuMsPerCharge"],
                o["clientCpuOverhead"] * 100, o["relay"]["eventsPerSecond"],
                o["relay"]["waitingWhenWorkerEnded"], o["relay"]["lagAfterWorkerSeconds"]))
    if want("outbox-redis"):
        log("bench: the outbox's cost on Redis (%d messages, stream, without and with it)..." % N)
        r["outboxRedis"] = o = outbox_cost_redis()
        if o:
            log("  client CPU %s -> %s ms per charge (%+.1f %%); store round trips %s -> %s, "
                "AOF transactions %s -> %s per charge (the relay's included); relay %s "
                "events/s, %s waiting when the worker ended, drained %s s later" % (
                    o["off"]["clientCpuMsPerCharge"], o["on"]["clientCpuMsPerCharge"],
                    o["clientCpuOverhead"] * 100, o["off"]["storeRoundTripsPerCharge"],
                    o["on"]["storeRoundTripsPerCharge"], o["off"]["aofTransactionsPerCharge"],
                    o["on"]["aofTransactionsPerCharge"], o["relay"]["eventsPerSecond"],
                    o["relay"]["waitingWhenWorkerEnded"], o["relay"]["lagAfterWorkerSeconds"]))
    if want("outbox-pg"):
        log("bench: the outbox's cost on PostgreSQL (%d messages, stream, without and with it)..."
            % PG_N)
        try:
            r["outboxPg"] = o = outbox_pg_cost()
            log("  client CPU %s -> %s ms per charge (%+.1f %%); write tx/charge %s -> %s; "
                "relay %s events/s, drained %s s after the worker" % (
                    o["off"]["clientCpuMsPerCharge"], o["on"]["clientCpuMsPerCharge"],
                    o["clientCpuOverhead"] * 100, o["off"]["writeTransactionsPerCharge"],
                    o["on"]["writeTransactionsPerCharge"], o["relay"]["eventsPerSecond"],
                    o["relay"]["lagAfterWorkerSeconds"]))
        except RuntimeError as e:
            log("  skipped: %s" % e)
            r["outboxPgSkipped"] = str(e)
    r["limits"]["sqliteAfter"] = sqlite_commit_limit()
    lim = (r["limits"]["sqliteBefore"]["commitsPerSecond"] +
           r["limits"]["sqliteAfter"]["commitsPerSecond"]) / 2.0
    r["limits"]["sqliteCommitsPerSecond"] = round(lim)
    for s in r["scenarios"]:
        if s["backend"] == "embedded":
            s["ofSqliteCommits"] = round(s["chargesPerSecond"] / s["sqliteCommitsPerSecondBefore"], 3)
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(r, f, indent=1)
    md = markdown(r)
    with open(os.path.join(OUT, "results.md"), "w") as f:
        f.write(md)
    print(md)
    bad = [s["scenario"] for s in r["scenarios"] if s["duplicatesDebited"]]
    if r.get("outbox", {}).get("duplicatesDebited"):
        bad.append("outbox")
    if r.get("outboxPg", {}).get("duplicatesDebited"):
        bad.append("outbox-pg")
    bad += ["jq-" + k for k, v in r.get("jqCost", {}).get("variants", {}).items()
            if v["duplicatesDebited"]]
    if bad:
        log("bench: DUPLICATE DEBITS in %s" % ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
