"""report.py: results.md from the figures: the machine, the scenarios' table,
what the cores allow, the split per process and each cost's part."""

import json
import os
import time
from harness import BIG, CLAIMS, SMALL, log


def machine():
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
    mem = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = "%.1f GiB" % (int(line.split()[1]) / 1048576.0)
    return {"cpu": model, "nproc": os.cpu_count(), "memory": mem,
            "kernel": os.uname().release,
            "loadavg": open("/proc/loadavg").read().split()[:3],
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


PROC_NAMES = ("sqs-recv", "idemp-claim", "charge-debit", "charge-notify", "idemp-done",
              "sqs-ack", "tee")


def fmt(v, unit=""):
    return "-" if v is None else "%s%s" % (v, unit)


def log_cpu(s):
    if not s.get("machineCeilingPerSecond"):
        return
    parts = ["client %s" % s["clientCpuMsPerCharge"], "bank-sim %s" % s.get("bankCpuMsPerCharge")]
    if "serverCpuMsPerCharge" in s:
        parts.append("server %s" % s["serverCpuMsPerCharge"])
    parts += ["%s %s" % kv for kv in s.get("emulatorCpuMsPerMessage", {}).items()]
    log("  CPU ms per charge: %s; %d cores shared by them allow %s/s (%s of it)" % (
        ", ".join(parts), os.cpu_count() or 1, s["machineCeilingPerSecond"],
        s.get("ofMachineCeiling")))


def markdown(r):
    m = r["machine"]
    lim = r["limits"]
    out = ["# idemkit bench, %s%s" % (m["date"], " (BENCH_QUICK)" if r["params"]["quick"] else ""), "",
           "Machine: %s, %d CPUs (nproc), %s, Linux %s; load average at start %s." % (
               m["cpu"], m["nproc"], m["memory"], m["kernel"], " ".join(m["loadavg"])),
           "Embedded default (SQLite queue and store, WAL, synchronous=FULL), bank-sim "
           "on loopback, unless the backend says otherwise.", "",
           "This machine's limits, measured in this run: durable single-row SQLite commits "
           "(WAL, synchronous=FULL) %d/s at the start, %d/s at the end (mean %d/s), and again "
           "just before each embedded scenario (its ratio is against that one); a latency "
           "scenario's ceiling is inflight x jobs / bank latency; the emulators' ceiling is "
           "the lower of what their own CPU per message allows one node thread and what the "
           "client's, bank-sim's and theirs together allow this machine's cores; that last "
           "limit, the cores shared by every process a charge needs, is given for each "
           "scenario below the table.%s" % (
               lim["sqliteBefore"]["commitsPerSecond"], lim["sqliteAfter"]["commitsPerSecond"],
               lim["sqliteCommitsPerSecond"],
               "" if r["params"]["hasInflight"] else
               " (This build has no --inflight: one request in flight per step.)"), "",
           "| scenario | backend | mode | -j | inflight | bank latency | messages | charges/s "
           "| of the limit | client CPU ms/charge | p50 / p99 claim-to-ack ms | duplicates "
           "debited | peak RSS MB (one process) |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s in r["scenarios"]:
        if "ofCeiling" in s:
            of = "%d%% of %s/s" % (round(s["ofCeiling"] * 100), s["ceilingPerSecond"])
        elif "ofPgCommits" in s:
            of = "%.3f x %d PostgreSQL commits/s" % (s["ofPgCommits"], s["pgCommitsPerSecond"])
        elif "ofSqliteCommits" in s:
            of = "%.3f x %d commits/s" % (s["ofSqliteCommits"], s["sqliteCommitsPerSecondBefore"])
        else:
            of = "-"
        out.append("| %s | %s | %s | %d | %s | %d ms | %d | %s | %s | %s | %s / %s | %d | %.1f |" % (
            s["scenario"], s["backend"], s["mode"], s["jobs"], s["inflight"], s["bankLatencyMs"],
            s["messages"], fmt(s["chargesPerSecond"]), of, s["clientCpuMsPerCharge"],
            fmt(s["latencyP50Ms"]), fmt(s["latencyP99Ms"]), s["duplicatesDebited"],
            s["peakRssKb"] / 1024.0))
    for s in r["scenarios"]:
        if s.get("emulatorCpuMsPerMessage"):
            out += ["", "%s: the emulators' own CPU per message: %s; one node thread allows "
                    "%s/s, the client, bank-sim and the emulators on %d cores %s/s." % (
                        s["scenario"], ", ".join("%s %s ms" % kv for kv in
                                                 s["emulatorCpuMsPerMessage"].items()),
                        fmt(s["emulatorThreadCeilingPerSecond"]), os.cpu_count() or 1,
                        fmt(s["machineCeilingPerSecond"]))]
    rows = [s for s in r["scenarios"] if s.get("machineCeilingPerSecond")]
    if rows:
        out += ["", "The machine's CPU per charge: the toolkit's (the client), bank-sim's and "
                "the store's server's or the emulators' (outside the worker's tree, from "
                "/proc), and what %d cores shared by all of them allow (nproc x 1000 / their "
                "sum); in production the bank and the servers run elsewhere:" % (
                    os.cpu_count() or 1), "",
                "| scenario | client ms | bank-sim ms | server or emulators ms | all ms "
                "| the cores allow | charges/s, of that |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for s in rows:
            other = s.get("serverCpuMsPerCharge",
                          round(sum(s.get("emulatorCpuMsPerMessage", {}).values()), 3) or None)
            out.append("| %s | %s | %s | %s | %s | %s/s | %s, %s |" % (
                s["scenario"], s["clientCpuMsPerCharge"], fmt(s.get("bankCpuMsPerCharge")),
                fmt(other), s["cpuMsPerChargeAll"], fmt(s["machineCeilingPerSecond"]),
                fmt(s["chargesPerSecond"]), fmt(s.get("ofMachineCeiling"))))
    if "amqpVsSqs" in r:
        out += ["", "RabbitMQ against the SQS path (issue 46; the same store, mix and -j, only "
                "the queue differs): amqp's charges/s are %.3f x sqs-queue's (the bar: at "
                "least 0.8)." % r["amqpVsSqs"]]
    left = ["%s %d" % (s["scenario"], s["summary"].get("dupInProgress", 0))
            for s in r["scenarios"] if s.get("summary")]
    if left:
        out += ["", "Copies left on the queue DUP_IN_PROGRESS (each comes back after its "
                "backoff; a copy held in idemp-claim until its original finished is not "
                "counted): " + ", ".join(left) + "."]
    for s in r["scenarios"]:
        if s["scenario"] == "month-end":
            out += ["", "month-end: %d queued charges drained by %d pipelines at %d ms bank "
                    "latency in %.1f s: %s/s, %s of the ceiling of %s/s (%s received/s with the "
                    "copies received again), %s ms CPU per charge received." % (
                        s["messages"], s["jobs"], s["bankLatencyMs"], s["wallSeconds"],
                        fmt(s.get("drainedPerSecond")), fmt(s.get("drainedOfCeiling")),
                        fmt(s.get("ceilingPerSecond")), fmt(s["chargesPerSecond"]),
                        s["clientCpuMsPerCharge"])]
    for name, why in r.get("skipped", {}).items():
        out.append("")
        out.append("%s: skipped (%s)." % (name, why))
    rows = [s for s in r["scenarios"] if s.get("processes")]
    if rows:
        out += ["", "Per process (stream scenarios; sampled from /proc every 0.1 s, so a "
                "little under getrusage's total): CPU ms per charge / peak RSS MB of the "
                "largest process of that name; the largest process of all in the last column:", "",
                "| scenario | " + " | ".join(PROC_NAMES) + " | the rest (shells, sampling) | largest |",
                "| --- |" + " ---: |" * (len(PROC_NAMES) + 1) + " --- |"]
        for s in rows:
            rec = max(s["summary"].get("received", 0), 1)
            cells = []
            for pn in PROC_NAMES:
                b = s["processes"].get(pn)
                cells.append("-" if not b else "%.3f / %.1f" % (
                    b["cpuSeconds"] * 1000 / rec, b["peakRssKb"] / 1024.0))
            named = sum(b["cpuSeconds"] for pn, b in s["processes"].items() if pn in PROC_NAMES)
            cells.append("%.3f" % max(0.0, s["clientCpuMsPerCharge"] - named * 1000 / rec))
            big = max(s["processes"].items(), key=lambda kv: kv[1]["peakRssKb"])
            cells.append("%s %.1f MB" % (big[0], big[1]["peakRssKb"] / 1024.0))
            out.append("| %s | %s |" % (s["scenario"], " | ".join(cells)))
    jq = r.get("jqCost")
    if jq:
        out += ["", "jq mapping (issue 13): the stream scenario (%d messages, -j %d, bank "
                "latency 0), %d runs per variant, interleaved; median [min - max], ratio of "
                "medians to the default (per-round ratios in results.json):" % (
                    jq["messages"], jq["jobs"], jq["reps"]), "",
                "| variant | client CPU ms/charge | ratio | charge-debit CPU ms/charge | ratio "
                "| charge-debit's extra, of the pipeline |",
                "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for name, v in jq["variants"].items():
            out.append("| %s | %s [%s - %s] | %.3f | %s [%s - %s] | %.3f | %+.1f%% |" % (
                name, v["clientMedian"], v["clientMin"], v["clientMax"], v["clientRatio"],
                v["debitMedian"], v["debitMin"], v["debitMax"], v["debitRatio"],
                v["debitDeltaOfPipeline"] * 100))
        v = jq["variants"]["jq"]
        out += ["", "Target (%s): %s: whole pipeline ratio %.3f; charge-debit's extra CPU "
                "= %+.1f%% of the default pipeline's." % (
                    jq["target"], "holds" if jq["targetHolds"] else
                    "at the line (pipeline noise)" if jq["targetAtTheLine"] else "MISSED",
                    v["clientRatio"], v["debitDeltaOfPipeline"] * 100)]
    c = r.get("claimCost")
    if c:
        out += ["", "Claim cost (idemp-claim --stream, %d claims, 30%% of them duplicates "
                "of records already DONE):" % CLAIMS, "",
                "| records in store | store size MB | grouped: CPU / wall µs per claim "
                "| lockstep (one commit per claim): CPU / wall µs per claim |",
                "| ---: | ---: | ---: | ---: |"]
        for rows in (str(SMALL), str(BIG)):
            g, l = c[rows]["grouped"], c[rows]["lockstep"]
            out.append("| %s | %.0f | %s / %s | %s / %s |" % (
                rows, c[rows]["storeBytes"] / 1048576.0, g["cpuUsPerClaim"], g["wallUsPerClaim"],
                l["cpuUsPerClaim"], l["wallUsPerClaim"]))
        out.append("")
        out.append("%d vs %d records, ratio: grouped CPU %.2f, wall %.2f; lockstep CPU %.2f, "
                   "wall %.2f." % (BIG, SMALL, c["groupedCpuRatio"], c["groupedWallRatio"],
                                   c["lockstepCpuRatio"], c["lockstepWallRatio"]))
    rd = r.get("redis")
    if rd:
        nc, ca = rd["noCache"], rd["cache"]
        out += ["", "Redis store (redis-server 7 on loopback, appendonly yes, appendfsync "
                "always; idemp-claim --stream, one claim in flight, %d new charges): "
                "%s claims/s, %s µs client CPU per claim." % (
                    CLAIMS, rd["claimsPerSecond"], rd["cpuUsPerClaim"]), "",
                "Claim + record of %d messages (~30%% redeliveries, one at a time), "
                "store round trips (EVALSHA, SCRIPT LOAD): %d without the cache, %d with "
                "IDEMKIT_CACHE (outcomes %s vs %s): the cache saves %s%% of the store's "
                "round trips." % (nc["messages"], nc["storeCommands"], ca["storeCommands"],
                                  json.dumps(nc["outcomes"], sort_keys=True),
                                  json.dumps(ca["outcomes"], sort_keys=True),
                                  fmt(None if rd["storeRoundTripsSaved"] is None
                                      else round(rd["storeRoundTripsSaved"] * 100, 1)))]
    c = r.get("claimCostPostgres")
    if c:
        out += ["", "Claim cost on PostgreSQL %s (same claims; loopback, fsync and "
                "synchronous_commit on; client = idemp-claim, server = the postmaster and "
                "its backends):" % c.get("version", ""), "",
                "| records in table | grouped: client CPU / server CPU / wall µs per claim "
                "| lockstep: client CPU / server CPU / wall µs per claim |",
                "| ---: | ---: | ---: |"]
        for rows in (str(SMALL), str(BIG)):
            g, l = c[rows]["grouped"], c[rows]["lockstep"]
            out.append("| %s | %s / %s / %s | %s / %s / %s |" % (
                rows, g["cpuUsPerClaim"], g["serverCpuUsPerClaim"], g["wallUsPerClaim"],
                l["cpuUsPerClaim"], l["serverCpuUsPerClaim"], l["wallUsPerClaim"]))
        out.append("")
        out.append("%d vs %d records, wall ratio: grouped %.2f, lockstep %.2f." % (
            BIG, SMALL, c["groupedWallRatio"], c["lockstepWallRatio"]))
    elif r.get("claimCostPostgresSkipped"):
        out += ["", "Claim cost on PostgreSQL: skipped (%s)." % r["claimCostPostgresSkipped"]]
    c = r.get("outbox")
    if c:
        out += ["", "Outbox (%d messages, stream): client CPU %s ms per charge without, %s ms "
                "with IDEMKIT_OUTBOX (%+.1f %%; target at most +10 %%); the relay beside it: "
                "%s events/s, %s ms CPU per event, %s events waiting when the worker ended, "
                "none %s s later (target holds: %s)." % (
                    c["messages"], c["off"]["clientCpuMsPerCharge"],
                    c["on"]["clientCpuMsPerCharge"], c["clientCpuOverhead"] * 100,
                    c["relay"]["eventsPerSecond"], c["relay"]["cpuMsPerEvent"],
                    c["relay"]["waitingWhenWorkerEnded"], c["relay"]["lagAfterWorkerSeconds"],
                    "yes" if c["targetHolds"] else "NO")]
    c = r.get("outboxPg")
    if c:
        out += ["", "Outbox on PostgreSQL (%d messages, stream): client CPU %s ms per charge "
                "without, %s ms with IDEMKIT_OUTBOX (%+.1f %%); write transactions per charge "
                "%s / %s, WAL %s / %s bytes per charge; the relay: %s events/s, %s ms CPU and %s "
                "write transactions per event, %s waiting when the worker ended, none %s s later "
                "(target holds: %s)." % (
                    c["messages"], c["off"]["clientCpuMsPerCharge"],
                    c["on"]["clientCpuMsPerCharge"], c["clientCpuOverhead"] * 100,
                    c["off"]["writeTransactionsPerCharge"], c["on"]["writeTransactionsPerCharge"],
                    c["off"]["walBytesPerCharge"], c["on"]["walBytesPerCharge"],
                    c["relay"]["eventsPerSecond"], c["relay"]["cpuMsPerEvent"],
                    c["relay"]["writeTransactionsPerEvent"],
                    c["relay"]["waitingWhenWorkerEnded"], c["relay"]["lagAfterWorkerSeconds"],
                    "yes" if c["targetHolds"] else "NO")]
    c = r.get("idempRun")
    if c:
        out += ["", "idemp-run on the embedded store (%d runs of /bin/true each way, "
                "interleaved): %s ms alone, %s ms under idemp-run (p90 %s): it adds %s ms "
                "(target at most 5 ms: %s)." % (
                    c["runs"], c["bareMedianMs"], c["underMedianMs"], c["underP90Ms"],
                    c["overheadMs"], "holds" if c["targetHolds"] else "MISSED")]
    return "\n".join(out) + "\n"
