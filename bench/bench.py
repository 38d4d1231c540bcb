#!/usr/bin/env python3
"""bench.py: `make bench` -- idemkit end to end on this machine.

N charges (BENCH_N, default 10 000; about 30% of the messages are
redeliveries of an earlier charge) go through the embedded default (SQLite
queue and store, durable commits) with bank-sim as the core-banking API:

  oneshot       charge-worker, one process per step per message (-j 2)
  stream        charge-worker --stream (-j BENCH_J, default 1)
  oneshot-lat   one-shot, bank latency 50 ms, -j 32
  stream-lat    --stream, bank latency 50 ms, -j 32
  claim-cost    idemp-claim with 10^3 and 10^6 records already in the store
  redis         the Redis store (redis-server 7, AOF appendfsync always, on
                loopback): claims/s and CPU per claim (idemp-claim --stream,
                one claim in flight); then claim + record of BENCH_CLAIMS
                messages (~30% redeliveries) on the Redis store with and
                without IDEMKIT_CACHE, counting the commands the store
                server ran (INFO commandstats): the share the cache saves
  jq            the stream scenario (zero bank latency, -j BENCH_J) with
                the default request body, with the same body built by a jq
                request program and a jq ref filter, and with the
                open-banking mapping; BENCH_JQ_REPS (5) rounds, interleaved:
                client CPU per charge and charge-debit's own, the ratios
                (issue 13's target: the jq request within 10%)
  claim-cost-pg the same on the PostgreSQL store: a throwaway PostgreSQL
                (run as the postgres user: root needed, else skipped),
                seeded with generate_series; client CPU and the server's
                CPU (the postmaster and its backends) reported apart

One-shot runs use BENCH_ONESHOT_N messages (default 1000): per-charge
figures do not need 10 000 forks of six processes.

Client CPU is user+sys of the toolkit's own processes only: getrusage
(RUSAGE_CHILDREN) around charge-worker, which waits for all of its
descendants; bank-sim is started before and reaped after the window, and
the producer (sqs-send) runs outside it.  Claim-to-ack latency is taken
for the charges a worker acquired: from the claim (claim.leaseUntil minus
the lease) to ack.at, in the envelopes sqs-ack writes, kept by a tee after
sqs-ack (stream); one-shot latency comes from a separate, smaller run with
a tap wrapper, so that the wrapper's CPU does not count.
Duplicates debited come from bank-sim's ledger: a charge debited twice, or
a debit request the bank had to answer as a replay of one it already had.

Results: build/bench/results.json and build/bench/results.md.
"""
import glob
import json
import os
import secrets
import socket
import random
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("IDEMKIT_BIN", os.path.join(SRC, "build", "bin"))
OUT = os.environ.get("BENCH_OUT", os.path.join(SRC, "build", "bench"))
N = int(os.environ.get("BENCH_N", "10000"))
N1 = min(N, int(os.environ.get("BENCH_ONESHOT_N", "1000")))
J = int(os.environ.get("BENCH_J", "1"))
LAT_MS = int(os.environ.get("BENCH_LATENCY_MS", "50"))
LAT_J = int(os.environ.get("BENCH_LATENCY_J", "32"))
BIG = int(os.environ.get("BENCH_BIG", "1000000"))
SMALL = 1000
LEASE_MS = 120000          # charge-worker's default --lease
CLAIMS = int(os.environ.get("BENCH_CLAIMS", "5000"))
ONLY = set(filter(None, os.environ.get("BENCH_ONLY", "").split(",")))


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def env_for(state, extra=None):
    e = dict(os.environ)
    for k in ("IDEMKIT_STORE", "IDEMKIT_QUEUE", "IDEMKIT_DLQ", "IDEMKIT_LEASE"):
        e.pop(k, None)
    e["PATH"] = BIN + os.pathsep + e.get("PATH", "")
    e["IDEMKIT_STATE_DIR"] = state
    e.update(extra or {})
    return e


def event(cid, acct="ACC-0042", amount=2500):
    return json.dumps({"chargeId": cid, "accountId": acct, "amount": amount,
                       "currency": "INR", "chargeType": "SMS_ALERT_FEE",
                       "dueDate": "2026-11-30"}, separators=(",", ":"))


def messages(n, prefix, seed=8):
    """n bodies: ~70% new charges, ~30% redeliveries of an earlier one,
    a redelivery arriving a little later (so some meet their first copy in
    flight, some after it is done)."""
    rnd = random.Random(seed)
    out, ids = [], []
    for i in range(n):
        if ids and rnd.random() < 0.30:
            cid = ids[max(0, len(ids) - 1 - int(rnd.expovariate(1 / 200.0)))]
        else:
            cid = "%s-%07d" % (prefix, i)
            ids.append(cid)
        out.append(event(cid))
    return out, len(ids)


class Bank:
    """bank-sim outside the measured process tree (reaped after)."""

    def __init__(self, state, latency_ms=0, args_extra=()):
        self.dir = state
        self.db = os.path.join(state, "ledger.db")
        port = os.path.join(state, "bank.port")
        args = [os.path.join(BIN, "bank-sim"), "--port", "0", "--db", self.db,
                "--port-file", port]
        if latency_ms:
            args += ["--latency", "%dms" % latency_ms]
        args += list(args_extra)
        self.out = open(os.path.join(state, "bank.out"), "w+")
        self.p = subprocess.Popen(args, stdout=self.out, stderr=subprocess.DEVNULL,
                                  env=env_for(state))
        for _ in range(200):
            self.out.seek(0)
            line = self.out.readline()
            if line.startswith("listening "):
                self.url = line.split()[1]
                return
            if self.p.poll() is not None:
                raise SystemExit("bank-sim did not start")
            time.sleep(0.05)
        raise SystemExit("bank-sim did not start")

    def ledger(self):
        c = sqlite3.connect(self.db)
        try:
            rows, distinct, replays = c.execute(
                "SELECT COUNT(*), COUNT(DISTINCT charge_id), COALESCE(SUM(replays), 0)"
                " FROM debits").fetchone()
        finally:
            c.close()
        return {"debits": rows, "chargesDebited": distinct,
                "duplicateDebits": rows - distinct, "replayedDebitRequests": replays}

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def children_usage():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime, r.ru_maxrss


def pct(v, p):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def latencies(path_glob_dir):
    lat = []
    for name in os.listdir(path_glob_dir):
        if not name.startswith("ack."):
            continue
        with open(os.path.join(path_glob_dir, name)) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                c, a = e.get("claim") or {}, e.get("ack") or {}
                if c.get("outcome") == "ACQUIRED" and "leaseUntil" in c and "at" in a:
                    lat.append(a["at"] - (c["leaseUntil"] - LEASE_MS))
    return lat


TAP = r"""#!/bin/sh
# bench tap: sqs-ack, its output also kept for the latency figures.
f=$BENCH_TAP_DIR/ack.$PPID
case " $* " in
*" --stream "*) sqs-ack "$@" | tee -a "$f"; exit 0 ;;
esac
out=$(sqs-ack "$@"); rc=$?
printf '%s\n' "$out" | tee -a "$f"
exit $rc
"""


DEBIT_TAP = r"""#!/bin/bash
# bench tap: charge-debit, then its own CPU kept for the per-step figure:
# bash's times (no pipe: a subshell would have no children), whose second
# line is the children's user and sys, from getrusage.
charge-debit "$@"
rc=$?
times >> "$BENCH_DEBIT_CPU"
exit $rc
"""


def tap_seconds(path):
    """Sum of the children's lines `times` wrote ("0m1.234s 0m0.056s"):
    every second line (the first of each pair is bash's own)."""
    total = 0.0
    with open(path) as f:
        for i, line in enumerate(f):
            if i % 2 == 0:
                continue
            for w in line.split():
                m, sec = w.rstrip("s").split("m")
                total += int(m) * 60 + float(sec)
    return total


def worker_run(name, n, stream, jobs, latency_ms=0, tap=True, bank_env=None,
               bank_args=(), debit_tap=False):
    """Sends n messages, runs charge-worker --drain over them; returns the
    figures.  bank_env(url) -> extra environment for the bank's mapping;
    debit_tap: charge-debit's own CPU, measured in the same run."""
    state = tempfile.mkdtemp(prefix="idemkit-bench.", dir=os.environ.get("TMPDIR"))
    try:
        bank = Bank(state, latency_ms, bank_args)
        extra = {"IDEMKIT_BANK_URL": bank.url + "/debits",
                 "IDEMKIT_NOTIFY_URL": bank.url + "/notifications"}
        if bank_env:
            extra.update(bank_env(bank.url))
        if debit_tap:
            dtap = os.path.join(state, "debit-tap")
            with open(dtap, "w") as f:
                f.write(DEBIT_TAP)
            os.chmod(dtap, 0o755)
            extra.update({"CHARGE_DEBIT_CMD": dtap,
                          "BENCH_DEBIT_CPU": os.path.join(state, "debit.cpu")})
        if tap:
            tapdir = os.path.join(state, "tap")
            os.mkdir(tapdir)
            tapsh = os.path.join(state, "ack-tap")
            with open(tapsh, "w") as f:
                f.write(TAP)
            os.chmod(tapsh, 0o755)
            extra.update({"SQS_ACK_CMD": tapsh, "BENCH_TAP_DIR": tapdir})
        env = env_for(state, extra)
        bodies, unique = messages(n, "CHG-" + name.upper())
        subprocess.run([os.path.join(BIN, "sqs-send")], input="\n".join(bodies) + "\n",
                       text=True, env=env, check=True, stdout=subprocess.DEVNULL)
        args = [os.path.join(BIN, "charge-worker"), "--drain", "--no-lock", "-j", str(jobs)]
        if stream:
            args.append("--stream")
        err = open(os.path.join(state, "worker.err"), "w+")
        cpu0, _ = children_usage()
        t0 = time.monotonic()
        rc = subprocess.run(args, env=env, stdout=subprocess.DEVNULL, stderr=err).returncode
        wall = time.monotonic() - t0
        cpu1, maxrss = children_usage()
        err.seek(0)
        summary = {}
        for line in err:
            if line.startswith('{"summary"'):
                summary = json.loads(line)
        ledger = bank.ledger()
        bank.stop()
        lat = latencies(tapdir) if tap else []
        received = summary.get("received", 0)
        res = {
            "scenario": name, "mode": "stream" if stream else "one-shot", "jobs": jobs,
            "bankLatencyMs": latency_ms, "messages": n, "uniqueCharges": unique,
            "workerExit": rc, "wallSeconds": round(wall, 3),
            "chargesPerSecond": round(received / wall, 1) if wall else None,
            "clientCpuMsPerCharge": round((cpu1 - cpu0) * 1000 / max(received, 1), 3),
            "clientCpuSeconds": round(cpu1 - cpu0, 3),
            "peakRssKb": maxrss,
            "latencyP50Ms": pct(lat, 50), "latencyP99Ms": pct(lat, 99),
            "latencySamples": len(lat),
            "summary": summary, "ledger": ledger,
            "duplicatesDebited": ledger["duplicateDebits"] + ledger["replayedDebitRequests"],
        }
        if debit_tap:
            d = tap_seconds(os.path.join(state, "debit.cpu"))
            res["debitCpuMsPerCharge"] = round(d * 1000 / max(received, 1), 4)
            res["debitCpuMsPerDebit"] = round(d * 1000 / max(ledger["debits"], 1), 4)
        if latency_ms:
            res["ceilingPerSecond"] = round(jobs * 1000.0 / latency_ms, 1)
            res["ofCeiling"] = round(res["chargesPerSecond"] / res["ceilingPerSecond"], 3)
        return res
    finally:
        shutil.rmtree(state, ignore_errors=True)


def oneshot_latency(name, n, jobs, latency_ms=0):
    """A smaller one-shot run with the tap, only for the latency figures."""
    r = worker_run(name + "-tap", n, False, jobs, latency_ms, tap=True)
    return r["latencyP50Ms"], r["latencyP99Ms"], r["latencySamples"]


# ---- the cost of jq mapping (issue 13) -------------------------------------

JQ_REPS = int(os.environ.get("BENCH_JQ_REPS", "5"))


def bank_env_file(name):
    """examples/banks/NAME.env as a dict (KEY=VALUE, VALUE maybe in single
    quotes), bank-sim's demo address left for the caller to replace."""
    out = {}
    with open(os.path.join(SRC, "examples", "banks", name + ".env")) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            k, v = line.split("=", 1)
            if len(v) >= 2 and v[0] == v[-1] == "'":
                v = v[1:-1]
            out[k] = v
    return out


def jq_variants():
    """(name, bank_env, bank_args): the default body; the same body built by
    jq on bank-sim's own endpoint (examples/banks/bank-sim.env: same bytes on
    the wire and the same answer, so the difference is jq alone); the
    open-banking mapping against bank-sim's open-banking endpoint (a bigger
    nested body, $key and $amountMajor, another answer: shown, not the A/B)."""
    own, ob = bank_env_file("bank-sim"), bank_env_file("open-banking")
    demo = "http://127.0.0.1:8080"

    def jq_own(url):
        return {"IDEMKIT_BANK_REQUEST": own["IDEMKIT_BANK_REQUEST"],
                "IDEMKIT_BANK_REF": own["IDEMKIT_BANK_REF"]}

    def jq_ob(url):
        e = {k: v.replace(demo, url) for k, v in ob.items() if k.startswith("IDEMKIT_BANK_")}
        e["IDEMKIT_BANK_OAUTH_CLIENT_SECRET_FILE"] = secret
        # bank-sim with OAuth2 asks a token of every endpoint: charge-notify
        # (default body, /notifications) gets the same client credentials.
        for k in list(e):
            if k.startswith("IDEMKIT_BANK_OAUTH_"):
                e["IDEMKIT_NOTIFY_" + k[len("IDEMKIT_BANK_"):]] = e[k]
        return e
    secret = os.path.join(SRC, ob["IDEMKIT_BANK_OAUTH_CLIENT_SECRET_FILE"])
    return [("default", None, ()), ("jq", jq_own, ()),
            ("jq-openbanking", jq_ob, ("--oauth-client-id", ob["IDEMKIT_BANK_OAUTH_CLIENT_ID"],
                                       "--oauth-client-secret-file", secret))]


def median(v):
    v = sorted(v)
    k = len(v)
    return None if not k else v[k // 2] if k % 2 else (v[k // 2 - 1] + v[k // 2]) / 2.0


def jq_cost():
    """The stream scenario (zero bank latency, -j BENCH_J) JQ_REPS times per
    variant, the variants interleaved in each round (the machine drifts):
    client CPU per charge of the whole pipeline, and charge-debit's own."""
    variants = jq_variants()
    runs = {v[0]: [] for v in variants}
    for rep in range(JQ_REPS):
        order = variants if rep % 2 == 0 else variants[::-1]
        for name, benv, bargs in order:
            s = worker_run("jq-" + name, N, True, J, 0, tap=False, bank_env=benv,
                           bank_args=bargs, debit_tap=True)
            sm = s["summary"]
            if s["workerExit"] != 0 or (sm.get("debited", 0) + sm.get("debitedNotificationFailed", 0)
                                       != s["ledger"]["chargesDebited"]):
                raise SystemExit("bench jq %s: worker exit %d, summary %s, ledger %s" % (
                    name, s["workerExit"], json.dumps(sm), json.dumps(s["ledger"])))
            log("  %-15s round %d: %s ms CPU/charge, charge-debit %s ms/charge, %s/s" % (
                name, rep + 1, s["clientCpuMsPerCharge"], s["debitCpuMsPerCharge"],
                s["chargesPerSecond"]))
            runs[name].append(s)
    res = {"reps": JQ_REPS, "messages": N, "jobs": J, "variants": {}}
    for name in runs:
        cpu = [s["clientCpuMsPerCharge"] for s in runs[name]]
        deb = [s["debitCpuMsPerCharge"] for s in runs[name]]
        res["variants"][name] = {
            "clientCpuMsPerCharge": cpu, "debitCpuMsPerCharge": deb,
            "clientMedian": round(median(cpu), 4), "clientMin": min(cpu), "clientMax": max(cpu),
            "debitMedian": round(median(deb), 4), "debitMin": min(deb), "debitMax": max(deb),
            "debitsPerRun": runs[name][0]["ledger"]["debits"],
            "duplicatesDebited": sum(s["duplicatesDebited"] for s in runs[name])}
    base = res["variants"]["default"]
    for name, v in res["variants"].items():
        v["clientRatio"] = round(v["clientMedian"] / base["clientMedian"], 3)
        v["debitRatio"] = round(v["debitMedian"] / base["debitMedian"], 3)
        # per round: each jq run against the default run of the same round
        v["clientRatioPerRound"] = [round(a["clientCpuMsPerCharge"] / b["clientCpuMsPerCharge"], 3)
                                    for a, b in zip(runs[name], runs["default"])]
        v["debitRatioPerRound"] = [round(a["debitCpuMsPerCharge"] / b["debitCpuMsPerCharge"], 3)
                                   for a, b in zip(runs[name], runs["default"])]
        # The five other steps run the same code on the same envelopes in
        # every variant, so charge-debit's extra CPU (measured apart, and
        # steadier than the whole pipeline's) is the mapping's cost.
        v["debitDeltaOfPipeline"] = round(
            (v["debitMedian"] - base["debitMedian"]) / base["clientMedian"], 3)
        v["debitDeltaOfPipelinePerRound"] = [
            round((a["debitCpuMsPerCharge"] - b["debitCpuMsPerCharge"]) / b["clientCpuMsPerCharge"], 3)
            for a, b in zip(runs[name], runs["default"])]
    res["target"] = ("jq request + ref filter: client CPU per charge within 10% of the "
                     "default body's")
    jq = res["variants"]["jq"]
    res["targetHolds"] = jq["debitDeltaOfPipeline"] <= 0.10 and jq["clientRatio"] <= 1.10
    res["targetAtTheLine"] = (not res["targetHolds"] and jq["debitDeltaOfPipeline"] <= 0.10)
    return res


# ---- claim cost with 10^3 vs 10^6 records already in the store ----------

def preload(path, rows, env):
    subprocess.run([os.path.join(BIN, "idemp-init"), "--store", "sqlite:" + path],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=OFF")
    now = int(time.time() * 1000)
    c.execute("BEGIN")
    batch = []
    for i in range(rows):
        k = "PRE-%08d" % i
        batch.append((k, "%032x" % i, "0" * 64, event(k), "TXN-%d" % i,
                      now - i, now - i, now // 1000 + 30 * 86400))
        if len(batch) == 10000:
            c.executemany("INSERT INTO records(key, state, owner, lease_until, attempts,"
                          " fingerprint, event, debit_ref, created_at, updated_at, expires_at)"
                          " VALUES (?, 'DONE', ?, 0, 1, ?, ?, ?, ?, ?, ?)", batch)
            batch = []
    if batch:
        c.executemany("INSERT INTO records(key, state, owner, lease_until, attempts,"
                      " fingerprint, event, debit_ref, created_at, updated_at, expires_at)"
                      " VALUES (?, 'DONE', ?, 0, 1, ?, ?, ?, ?, ?, ?)", batch)
    c.execute("COMMIT")
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()


def claim_batch(path, rows, env, lockstep, store=None, server_cpu=None):
    """CLAIMS claims: 70% new keys, 30% keys already DONE in the store.
    lockstep: one line in, wait for its answer (a group of one: one durable
    commit per claim); else the whole batch at once (group commit)."""
    rnd = random.Random(rows)
    lines = []
    for i in range(CLAIMS):
        if rnd.random() < 0.30:
            lines.append(event("PRE-%08d" % rnd.randrange(rows)))
        else:
            lines.append(event("NEW-%d-%08d" % (lockstep, i)))
    cpu0, _ = children_usage()
    scpu0 = server_cpu() if server_cpu else 0
    t0 = time.monotonic()
    p = subprocess.Popen([os.path.join(BIN, "idemp-claim"), "--stream", "--store",
                          store or "sqlite:" + path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1)
    outcomes = {}
    if lockstep:
        for l in lines:
            p.stdin.write(l + "\n")
            p.stdin.flush()
            o = json.loads(p.stdout.readline())["claim"]["outcome"]
            outcomes[o] = outcomes.get(o, 0) + 1
        p.stdin.close()
        p.stdout.read()
    else:
        out, _ = p.communicate("\n".join(lines) + "\n")
        for l in out.splitlines():
            o = json.loads(l)["claim"]["outcome"]
            outcomes[o] = outcomes.get(o, 0) + 1
    p.wait()
    wall = time.monotonic() - t0
    cpu1, _ = children_usage()
    r = {"claims": CLAIMS, "outcomes": outcomes,
         "wallUsPerClaim": round(wall * 1e6 / CLAIMS, 1),
         "cpuUsPerClaim": round((cpu1 - cpu0) * 1e6 / CLAIMS, 1)}
    if server_cpu:
        r["serverCpuUsPerClaim"] = round((server_cpu() - scpu0) * 1e6 / CLAIMS, 1)
    return r


def claim_cost():
    state = tempfile.mkdtemp(prefix="idemkit-bench.", dir=os.environ.get("TMPDIR"))
    env = env_for(state)
    res = {}
    try:
        for rows in (SMALL, BIG):
            path = os.path.join(state, "store-%d.db" % rows)
            t0 = time.monotonic()
            preload(path, rows, env)
            log("  preloaded %d records in %.1fs" % (rows, time.monotonic() - t0))
            res[str(rows)] = {
                "grouped": claim_batch(path, rows, env, False),
                "lockstep": claim_batch(path, rows, env, True),
                "storeBytes": os.path.getsize(path),
            }
            os.unlink(path)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    for mode in ("grouped", "lockstep"):
        a, b = res[str(SMALL)][mode], res[str(BIG)][mode]
        res[mode + "CpuRatio"] = round(b["cpuUsPerClaim"] / a["cpuUsPerClaim"], 2)
        res[mode + "WallRatio"] = round(b["wallUsPerClaim"] / a["wallUsPerClaim"], 2)
    return res


# ---- the Redis store and the cache in front of it ------------------------

def free_port():
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def redis_start(d):
    port = free_port()
    os.makedirs(d, exist_ok=True)
    p = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port),
                          "--dir", d, "--appendonly", "yes", "--appendfsync", "always",
                          "--save", "", "--logfile", os.path.join(d, "log")],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    for _ in range(200):
        r = subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True, text=True)
        if r.stdout.strip() == "PONG":
            return p, port
        time.sleep(0.05)
    p.kill()
    raise SystemExit("bench: redis-server did not start")


def redis_calls(port):
    """Round trips the store served since the last reset: the scripts
    (EVALSHA: claim, finish) and the reads outside them; the commands a
    script runs inside count in commandstats too, but are no round trip."""
    out = subprocess.run(["redis-cli", "-p", str(port), "INFO", "commandstats"],
                         capture_output=True, text=True).stdout
    n = 0
    for line in out.splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_script|load:")):
            n += int(line.split("calls=")[1].split(",")[0])
    return n


def redis_reset(port):
    subprocess.run(["redis-cli", "-p", str(port), "CONFIG", "RESETSTAT"], capture_output=True)


def claim_done_lockstep(bodies, env):
    """Each message claimed, and when acquired recorded DONE, one at a time
    (so a redelivery meets its first copy finished); outcome counts."""
    cl = subprocess.Popen([os.path.join(BIN, "idemp-claim"), "--stream"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                          text=True, bufsize=1)
    dn = subprocess.Popen([os.path.join(BIN, "idemp-done"), "--stream", "--state", "DONE"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1)
    outcomes = {}
    for b in bodies:
        cl.stdin.write(b + "\n")
        cl.stdin.flush()
        line = cl.stdout.readline()
        o = json.loads(line)["claim"]["outcome"]
        outcomes[o] = outcomes.get(o, 0) + 1
        if o == "ACQUIRED":
            dn.stdin.write(line)
            dn.stdin.flush()
            dn.stdout.readline()
    for p in (cl, dn):
        p.stdin.close()
        p.stdout.read()
        p.wait()
    return outcomes


def redis_bench():
    if not shutil.which("redis-server"):
        log("  redis-server not installed: skipped")
        return None
    state = tempfile.mkdtemp(prefix="idemkit-bench.", dir=os.environ.get("TMPDIR"))
    store, sport = redis_start(os.path.join(state, "store"))
    cache, cport = redis_start(os.path.join(state, "cache"))
    res = {}
    try:
        env = env_for(state, {"IDEMKIT_STORE": "redis://127.0.0.1:%d" % sport})
        # claims/s and CPU per claim: every claim a new key, one in flight
        lines = [event("RCL-%08d" % i) for i in range(CLAIMS)]
        cpu0, _ = children_usage()
        t0 = time.monotonic()
        p = subprocess.Popen([os.path.join(BIN, "idemp-claim"), "--stream"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1)
        for l in lines:
            p.stdin.write(l + "\n")
            p.stdin.flush()
            p.stdout.readline()
        p.stdin.close()
        p.stdout.read()
        p.wait()
        wall = time.monotonic() - t0
        cpu1, _ = children_usage()
        res["claimsPerSecond"] = round(CLAIMS / wall)
        res["cpuUsPerClaim"] = round((cpu1 - cpu0) * 1e6 / CLAIMS, 1)
        # round trips the cache saves on ~30% redeliveries
        for name, extra in (("noCache", {}),
                            ("cache", {"IDEMKIT_CACHE": "redis://127.0.0.1:%d" % cport})):
            bodies, _ = messages(CLAIMS, "RCA-" + name)
            redis_reset(sport)
            e = env_for(state, dict(extra, IDEMKIT_STORE="redis://127.0.0.1:%d" % sport))
            t0 = time.monotonic()
            outcomes = claim_done_lockstep(bodies, e)
            res[name] = {"messages": len(bodies), "outcomes": outcomes,
                         "storeCommands": redis_calls(sport),
                         "wallUsPerMessage": round((time.monotonic() - t0) * 1e6 / len(bodies), 1)}
        a, b = res["noCache"]["storeCommands"], res["cache"]["storeCommands"]
        res["storeRoundTripsSaved"] = round(1 - b / a, 3) if a else None
    finally:
        for p in (store, cache):
            p.terminate()
            p.wait()
        shutil.rmtree(state, ignore_errors=True)
# ---- claim cost on PostgreSQL ----------------------------------------------

class Pg:
    """A throwaway PostgreSQL (tests/pg_helper.bash does the same for the
    tests): the postgres user, a loopback port, SCRAM, the password in a
    pgpass file (never in argv).  Durable defaults (fsync, synchronous_commit)."""

    def __init__(self):
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
        if not bins or os.geteuid() != 0:
            raise RuntimeError("needs PostgreSQL (apt-get install postgresql) and root")
        self.bin = bins[-1]
        self.dir = tempfile.mkdtemp(prefix="idemkit-bench-pg.", dir="/tmp")
        shutil.chown(self.dir, "postgres", "postgres")
        pw = secrets.token_hex(12)
        with open(os.path.join(self.dir, "pw"), "w") as f:
            f.write(pw + "\n")
        shutil.chown(os.path.join(self.dir, "pw"), "postgres", "postgres")
        self.as_pg(["initdb", "-D", self.data(), "-U", "postgres", "--auth-local=trust",
                    "--auth-host=scram-sha-256", "--pwfile=" + os.path.join(self.dir, "pw"),
                    "--no-instructions"])
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        with open(os.path.join(self.data(), "postgresql.conf"), "a") as f:
            f.write("listen_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n"
                    "port = %d\nshared_buffers = 256MB\n" % (self.dir, self.port))
        self.as_pg(["pg_ctl", "-D", self.data(), "-l", os.path.join(self.dir, "log"), "-w", "start"])
        self.sql("CREATE ROLE idemkit LOGIN PASSWORD '%s'" % pw, "postgres")
        self.sql("CREATE DATABASE idemkit OWNER idemkit", "postgres")
        self.pgpass = os.path.join(self.dir, "pgpass")
        with open(self.pgpass, "w") as f:
            f.write("127.0.0.1:%d:idemkit:idemkit:%s\n" % (self.port, pw))
        os.chmod(self.pgpass, 0o600)
        self.url = "postgres://idemkit@127.0.0.1:%d/idemkit" % self.port

    def data(self):
        return os.path.join(self.dir, "data")

    def as_pg(self, argv):
        subprocess.run(["runuser", "-u", "postgres", "--", os.path.join(self.bin, argv[0])] + argv[1:],
                       cwd="/", check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def sql(self, q, db="idemkit"):
        subprocess.run([os.path.join(self.bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                        "-h", self.dir, "-p", str(self.port), "-U", "postgres", "-d", db, "-c", q],
                       check=True, stdout=subprocess.DEVNULL)

    def cpu(self):
        """Seconds of CPU of the server: the postmaster, its live children,
        and the backends it has reaped (cutime + cstime)."""
        tck = os.sysconf("SC_CLK_TCK")
        pm = int(open(os.path.join(self.data(), "postmaster.pid")).readline())
        total = 0
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                st = open("/proc/%s/stat" % d).read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid, ppid = int(d), int(st[1])
            if pid == pm:
                total += sum(int(x) for x in st[11:15])
            elif ppid == pm:
                total += int(st[11]) + int(st[12])
        return total / tck

    def stop(self):
        try:
            self.as_pg(["pg_ctl", "-D", self.data(), "-m", "fast", "-w", "stop"])
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def claim_cost_pg():
    state = tempfile.mkdtemp(prefix="idemkit-bench.", dir=os.environ.get("TMPDIR"))
    pg = Pg()
    env = env_for(state, {"PGPASSFILE": pg.pgpass})
    res = {}
    try:
        for rows in (SMALL, BIG):
            table = "bench_%d" % rows
            url = "%s?table=%s" % (pg.url, table)
            t0 = time.monotonic()
            subprocess.run([os.path.join(BIN, "idemp-init"), "--store", url], env=env,
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # Seeded by the server itself, not through idemkit; the same rows
            # as the SQLite preload (DONE, a fingerprint no event has).
            pg.sql("INSERT INTO %s (key, state, owner, lease_until, attempts, fingerprint,"
                   " event, debit_ref, created_at, updated_at, expires_at)"
                   " SELECT 'PRE-' || lpad(g::text, 8, '0'), 'DONE', md5(g::text), 0, 1,"
                   " repeat('0', 64), '{\"chargeId\":\"PRE-' || lpad(g::text, 8, '0') ||"
                   " '\",\"accountId\":\"ACC-0042\",\"amount\":2500,\"currency\":\"INR\","
                   "\"chargeType\":\"SMS_ALERT_FEE\",\"dueDate\":\"2026-11-30\"}',"
                   " 'TXN-' || g, %d - g, %d - g, %d FROM generate_series(0, %d) g"
                   % (table, int(time.time() * 1000), int(time.time() * 1000),
                      int(time.time()) + 30 * 86400, rows - 1))
            pg.sql("VACUUM ANALYZE %s" % table)
            pg.sql("CHECKPOINT")
            log("  postgres: seeded %d records in %.1fs" % (rows, time.monotonic() - t0))
            res[str(rows)] = {
                "grouped": claim_batch(None, rows, env, False, url, pg.cpu),
                "lockstep": claim_batch(None, rows, env, True, url, pg.cpu),
            }
    finally:
        pg.stop()
        shutil.rmtree(state, ignore_errors=True)
    for mode in ("grouped", "lockstep"):
        a, b = res[str(SMALL)][mode], res[str(BIG)][mode]
        res[mode + "WallRatio"] = round(b["wallUsPerClaim"] / a["wallUsPerClaim"], 2)
    return res


# ---- the report ------------------------------------------------------------

def machine():
    model, flags = "?", ""
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


def fmt(v, unit=""):
    return "-" if v is None else "%s%s" % (v, unit)


def markdown(r):
    m = r["machine"]
    out = ["# idemkit bench, %s" % m["date"], "",
           "Machine: %s, %d CPUs (nproc), %s, Linux %s; load average at start %s." % (
               m["cpu"], m["nproc"], m["memory"], m["kernel"], " ".join(m["loadavg"])),
           "Embedded default (SQLite queue and store, WAL, synchronous=FULL), bank-sim "
           "on loopback.", "",
           "| scenario | mode | -j | bank latency | messages | charges/s | client CPU ms/charge "
           "| p50 / p99 claim-to-ack ms | duplicates debited | peak RSS MB |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s in r["scenarios"]:
        rate = fmt(s["chargesPerSecond"])
        if "ofCeiling" in s:
            rate += " (%d%% of j/latency)" % round(s["ofCeiling"] * 100)
        out.append("| %s | %s | %d | %d ms | %d | %s | %s | %s / %s | %d | %.1f |" % (
            s["scenario"], s["mode"], s["jobs"], s["bankLatencyMs"], s["messages"], rate,
            s["clientCpuMsPerCharge"], fmt(s["latencyP50Ms"]), fmt(s["latencyP99Ms"]),
            s["duplicatesDebited"], s["peakRssKb"] / 1024.0))
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
        out.append("10^6 vs 10^3 ratio: grouped CPU %.2f, wall %.2f; lockstep CPU %.2f, "
                   "wall %.2f." % (c["groupedCpuRatio"], c["groupedWallRatio"],
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
        out.append("10^6 vs 10^3 wall ratio: grouped %.2f, lockstep %.2f." % (
            c["groupedWallRatio"], c["lockstepWallRatio"]))
    elif r.get("claimCostPostgresSkipped"):
        out += ["", "Claim cost on PostgreSQL: skipped (%s)." % r["claimCostPostgresSkipped"]]
    return "\n".join(out) + "\n"


def want(name):
    return not ONLY or name in ONLY


def main():
    for tool in ("charge-worker", "bank-sim", "sqs-send", "sqs-ack", "idemp-claim"):
        if not os.access(os.path.join(BIN, tool), os.X_OK):
            raise SystemExit("bench: %s/%s missing; run make first" % (BIN, tool))
    os.makedirs(OUT, exist_ok=True)
    r = {"machine": machine(), "params": {"N": N, "oneshotN": N1, "j": J,
                                          "latencyMs": LAT_MS, "latencyJ": LAT_J},
         "scenarios": []}
    plan = [
        ("oneshot", N1, False, 2, 0),
        ("stream", N, True, J, 0),
        ("oneshot-lat", N1, False, LAT_J, LAT_MS),
        ("stream-lat", N, True, LAT_J, LAT_MS),
    ]
    for name, n, stream, jobs, lat in plan:
        if not want(name):
            continue
        log("bench: %s (%d messages, -j %d, bank latency %d ms)..." % (name, n, jobs, lat))
        s = worker_run(name, n, stream, jobs, lat, tap=stream)
        if not stream:
            s["latencyP50Ms"], s["latencyP99Ms"], s["latencySamples"] = \
                oneshot_latency(name, max(50, n // 4), jobs, lat)
            s["latencyFrom"] = "a separate run of %d messages with the tap" % max(50, n // 4)
        log("  %s/s, %s ms CPU per charge, p50 %s ms, p99 %s ms, duplicates debited %d" % (
            s["chargesPerSecond"], s["clientCpuMsPerCharge"], s["latencyP50Ms"],
            s["latencyP99Ms"], s["duplicatesDebited"]))
        r["scenarios"].append(s)
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
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(r, f, indent=1)
    md = markdown(r)
    with open(os.path.join(OUT, "results.md"), "w") as f:
        f.write(md)
    print(md)
    bad = [s["scenario"] for s in r["scenarios"] if s["duplicatesDebited"]]
    bad += ["jq-" + k for k, v in r.get("jqCost", {}).get("variants", {}).items()
            if v["duplicatesDebited"]]
    if bad:
        log("bench: DUPLICATE DEBITS in %s" % ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
