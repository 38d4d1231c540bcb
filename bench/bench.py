#!/usr/bin/env python3
"""bench.py: `make bench` -- idemkit end to end on this machine, as ratios
against this machine's own limits measured in the same run.

N charges (BENCH_N, default 10 000; about 30% of the messages are
redeliveries of an earlier charge) go through the embedded default (SQLite
queue and store, durable commits) with bank-sim as the core-banking API:

  limits        always: durable single-row SQLite commits/s (WAL,
                synchronous=FULL, as lib/sqlite.c), at the start and the end
  oneshot       charge-worker, one process per step per receive of up to 10
                messages (per message before issue 30) (-j 2)
  stream        charge-worker --stream (-j BENCH_J, default 1)
  oneshot-lat   one-shot, bank latency 50 ms, -j 32
  stream-lat    --stream, bank latency 50 ms: -j 1 --inflight 64 when
                charge-worker has --inflight, else -j 32 (one in flight)
  emulators     the stream scenario on dynalite (store) and local-aws-sqs
                (queue, DLQ) from node_modules (BENCH_EMU_N messages)
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
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")


def knob(name, full, quick):
    return int(os.environ.get(name, str(quick if QUICK else full)))


N = knob("BENCH_N", 10000, 1000)
N1 = min(N, knob("BENCH_ONESHOT_N", 1000, 100))
J = knob("BENCH_J", 1, 1)
LAT_MS = knob("BENCH_LATENCY_MS", 50, 50)
BIG = knob("BENCH_BIG", 1000000, 100000)
SMALL = 1000
LEASE_MS = 120000          # charge-worker's default --lease
CLAIMS = knob("BENCH_CLAIMS", 5000, 1000)
EMU_N = knob("BENCH_EMU_N", 3000, 300)
PG_N = knob("BENCH_PG_N", 5000, 500)
MONTH_N = knob("BENCH_MONTH_N", 100000, 5000)
RUN_N = knob("BENCH_RUN_N", 300, 60)
ONLY = set(filter(None, os.environ.get("BENCH_ONLY", "").split(",")))


def worker_help():
    try:
        return subprocess.run([os.path.join(BIN, "charge-worker"), "--help"],
                              capture_output=True, text=True).stdout
    except OSError:
        return ""


# charge-worker --inflight N (requests outstanding per --stream step): passed
# when this build has it, so the bench runs before and after that option.
HAS_INFLIGHT = "--inflight" in worker_help()
# One-shot: one process per step for each receive, up to 10 messages in
# flight per loop (issue 30 item 3); before, one message at a time.
ONESHOT_INFLIGHT = 10 if "for each receive (up to 10" in worker_help() else 1
INFLIGHT = knob("BENCH_INFLIGHT", 0, 0)            # 0: the command's default
LAT_INFLIGHT = knob("BENCH_LATENCY_INFLIGHT", 64, 64) if HAS_INFLIGHT else 1
LAT_J = knob("BENCH_LATENCY_J", 1 if HAS_INFLIGHT else 32, 1 if HAS_INFLIGHT else 32)


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
        # The bank must not be the limit: one-shot -j 32 at 10 messages a
        # receive holds up to 640 connections (debit and notify), past
        # bank-sim's default 256, and a connection it turns away is an
        # empty reply the worker must take as unknown (TEMPFAIL): the
        # charge then waits out its lease and the scenario measures that.
        if "--max-conns" not in args_extra:
            args += ["--max-conns", "4096"]
        args += list(args_extra)
        self.out = open(os.path.join(state, "bank.out"), "w+")
        self.err = os.path.join(state, "bank.err")
        with open(self.err, "w") as err:
            self.p = subprocess.Popen(args, stdout=self.out, stderr=err, env=env_for(state))
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

    def refused(self):
        """Connections bank-sim turned away at its limit (microhttpd's own
        words in its log): each one a charge that waited out its lease."""
        try:
            with open(self.err, errors="replace") as f:
                return sum("reached connection limit" in line for line in f)
        except OSError:
            return 0

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def sqlite_commit_limit(seconds=None):
    """Durable single-row commits per second SQLite does here, with the
    pragmas the store and queue use (lib/sqlite.c: journal_mode=WAL,
    synchronous=FULL): one INSERT per transaction, on the file system the
    bench's stores are on (TMPDIR), for about `seconds`."""
    seconds = seconds or (1.0 if QUICK else 3.0)
    d = tempfile.mkdtemp(prefix="idemkit-bench-commit.", dir=os.environ.get("TMPDIR"))
    try:
        c = sqlite3.connect(os.path.join(d, "c.db"), isolation_level=None)
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA synchronous=FULL")
        c.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)")
        n, t0 = 0, time.monotonic()
        cpu0 = time.process_time()
        while True:
            c.execute("BEGIN IMMEDIATE")
            c.execute("INSERT INTO t VALUES (?, ?)", ("k%09d" % n, "x" * 100))
            c.execute("COMMIT")
            n += 1
            el = time.monotonic() - t0
            if el >= seconds and n >= 200:
                break
        cpu = time.process_time() - cpu0
        c.close()
        return {"commitsPerSecond": round(n / el), "commits": n,
                "cpuUsPerCommit": round(cpu * 1e6 / n, 1)}
    finally:
        shutil.rmtree(d, ignore_errors=True)


class ProcWatch:
    """Samples /proc every 0.1 s for the processes under a root pid: CPU
    (utime+stime) and peak RSS (VmHWM) per command name.  A process's last
    tenth of a second can be missed; the total client CPU comes from
    getrusage, this only splits it (and gives RSS per process)."""

    def __init__(self, root):
        import threading
        self.root, self.seen, self.stop_ = root, {}, False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        tck = os.sysconf("SC_CLK_TCK")
        while not self.stop_:
            kids, procs = {}, {}
            for d in os.listdir("/proc"):
                if not d.isdigit():
                    continue
                try:
                    with open("/proc/%s/stat" % d) as f:
                        st = f.read()
                    comm = st[st.index("(") + 1:st.rindex(")")]
                    f2 = st[st.rindex(")") + 2:].split()
                    procs[int(d)] = (comm, int(f2[1]), (int(f2[11]) + int(f2[12])) / tck)
                except (OSError, ValueError, IndexError):
                    continue
            for pid, (comm, ppid, cpu) in procs.items():
                kids.setdefault(ppid, []).append(pid)
            todo, mine = [self.root], []
            while todo:
                p = todo.pop()
                for k in kids.get(p, ()):
                    mine.append(k)
                    todo.append(k)
            for pid in mine:
                comm, _, cpu = procs[pid]
                hwm = 0
                try:
                    with open("/proc/%d/status" % pid) as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                hwm = int(line.split()[1])
                except OSError:
                    pass
                key = (pid, comm)
                old = self.seen.get(key, (0, 0))
                self.seen[key] = (max(old[0], cpu), max(old[1], hwm))
            time.sleep(0.1)

    def finish(self):
        self.stop_ = True
        self.t.join()
        by = {}
        for (pid, comm), (cpu, hwm) in self.seen.items():
            b = by.setdefault(comm, {"processes": 0, "cpuSeconds": 0.0, "peakRssKb": 0})
            b["processes"] += 1
            b["cpuSeconds"] = round(b["cpuSeconds"] + cpu, 3)
            b["peakRssKb"] = max(b["peakRssKb"], hwm)
        return by


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


TAP_BESIDE = r"""#!/bin/bash
# bench tap beside charge-worker: sqs-ack (%s), its output also kept.
"%s" "$@" | tee -a "$BENCH_TAP_DIR/ack.$PPID"
exit "${PIPESTATUS[0]}"
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
               bank_args=(), debit_tap=False, inflight=0, env_extra=None, backend="embedded",
               meter=None, server_cpu=None):
    """Sends n messages, runs charge-worker --drain over them; returns the
    figures.  bank_env(url) -> extra environment for the bank's mapping;
    debit_tap: charge-debit's own CPU, measured in the same run; meter:
    start() just before the worker starts, stop(res) after it ended;
    server_cpu() -> seconds of CPU the store's server has used (it is
    outside the worker's tree, as bank-sim is)."""
    state = tempfile.mkdtemp(prefix="idemkit-bench.", dir=os.environ.get("TMPDIR"))
    try:
        bank = Bank(state, latency_ms, bank_args)
        extra = {"IDEMKIT_BANK_URL": bank.url + "/debits",
                 "IDEMKIT_NOTIFY_URL": bank.url + "/notifications"}
        if bank_env:
            extra.update(bank_env(bank.url))
        extra.update(env_extra or {})
        if debit_tap:
            dtap = os.path.join(state, "debit-tap")
            with open(dtap, "w") as f:
                f.write(DEBIT_TAP)
            os.chmod(dtap, 0o755)
            extra.update({"CHARGE_DEBIT_CMD": dtap,
                          "BENCH_DEBIT_CPU": os.path.join(state, "debit.cpu")})
        worker = os.path.join(BIN, "charge-worker")
        if tap:
            tapdir = os.path.join(state, "tap")
            os.mkdir(tapdir)
            extra["BENCH_TAP_DIR"] = tapdir
            if stream or ONESHOT_INFLIGHT == 1:
                tapsh = os.path.join(state, "ack-tap")
                with open(tapsh, "w") as f:
                    f.write(TAP)
                os.chmod(tapsh, 0o755)
                extra["SQS_ACK_CMD"] = tapsh
            else:
                # One-shot takes a message at a time when a step is
                # replaced through the environment: the tap is put
                # beside a copy of charge-worker instead, which finds
                # its steps beside itself first.
                tapbin = os.path.join(state, "tapbin")
                os.mkdir(tapbin)
                shutil.copy(worker, tapbin)
                worker = os.path.join(tapbin, "charge-worker")
                with open(os.path.join(tapbin, "sqs-ack"), "w") as f:
                    f.write(TAP_BESIDE % ((os.path.join(BIN, "sqs-ack"),) * 2))
                os.chmod(os.path.join(tapbin, "sqs-ack"), 0o755)
        env = env_for(state, extra)
        bodies, unique = messages(n, "CHG-" + name.upper())
        subprocess.run([os.path.join(BIN, "sqs-send")], input="\n".join(bodies) + "\n",
                       text=True, env=env, check=True, stdout=subprocess.DEVNULL)
        args = [worker, "--drain", "--no-lock", "-j", str(jobs)]
        if stream:
            args.append("--stream")
        if inflight and HAS_INFLIGHT:
            args += ["--inflight", str(inflight)]
        err = open(os.path.join(state, "worker.err"), "w+")
        # Linux keeps a process's peak RSS across exec, so anything this
        # (large) python forks starts with python's: GNU time, small, forks
        # charge-worker and reports the peak of that tree alone (%M).
        rssf = os.path.join(state, "worker.rss")
        if os.access("/usr/bin/time", os.X_OK):
            args = ["/usr/bin/time", "-f", "%M", "-o", rssf] + args
        if meter:
            meter.start()
        bank0 = proc_cpu_s(bank.p.pid)
        srv0 = server_cpu() if server_cpu else None
        t0 = time.monotonic()
        p = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=err)
        watch = ProcWatch(p.pid) if stream else None
        # wait4: the worker's own rusage, which holds every descendant it
        # waited for (all of them: it waits for its pipelines).
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = rc = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        bank1 = proc_cpu_s(bank.p.pid)
        srv1 = server_cpu() if server_cpu else None
        cpu0, cpu1, maxrss = 0.0, ru.ru_utime + ru.ru_stime, ru.ru_maxrss
        procs = watch.finish() if watch else None
        try:
            with open(rssf) as f:
                maxrss = int(f.read().split()[-1])
        except (OSError, ValueError, IndexError):
            pass   # no GNU time: the wait4 figure, python's size included
        err.seek(0)
        summary = {}
        for line in err:
            if line.startswith('{"summary"'):
                summary = json.loads(line)
        ledger = bank.ledger()
        refused = bank.refused()
        bank.stop()
        lat = latencies(tapdir) if tap else []
        received = summary.get("received", 0)
        res = {
            "scenario": name, "backend": backend,
            "mode": "stream" if stream else "one-shot", "jobs": jobs,
            "inflight": ((inflight or "default") if HAS_INFLIGHT else 1) if stream else
                        ONESHOT_INFLIGHT,
            "bankLatencyMs": latency_ms, "messages": n, "uniqueCharges": unique,
            "workerExit": rc, "wallSeconds": round(wall, 3),
            "chargesPerSecond": round(received / wall, 1) if wall else None,
            "clientCpuMsPerCharge": round((cpu1 - cpu0) * 1000 / max(received, 1), 3),
            "clientCpuSeconds": round(cpu1 - cpu0, 3),
            "peakRssKb": maxrss,
            "latencyP50Ms": pct(lat, 50), "latencyP99Ms": pct(lat, 99),
            "latencySamples": len(lat),
            "processes": procs,
            "summary": summary, "ledger": ledger,
            "duplicatesDebited": ledger["duplicateDebits"] + ledger["replayedDebitRequests"],
            "bankRefusedConnections": refused,
        }
        if debit_tap:
            d = tap_seconds(os.path.join(state, "debit.cpu"))
            res["debitCpuMsPerCharge"] = round(d * 1000 / max(received, 1), 4)
            res["debitCpuMsPerDebit"] = round(d * 1000 / max(ledger["debits"], 1), 4)
        per = max(received, 1)
        res["bankCpuMsPerCharge"] = round((bank1 - bank0) * 1000 / per, 3)
        if server_cpu:
            res["serverCpuMsPerCharge"] = round((srv1 - srv0) * 1000 / per, 3)
        if meter:
            meter.stop(res)
        cpu_ceiling(res)
        if latency_ms:
            inf = (inflight if HAS_INFLIGHT and inflight else 1) if stream else ONESHOT_INFLIGHT
            res["ceilingPerSecond"] = round(inf * jobs * 1000.0 / latency_ms, 1)
            res["ofCeiling"] = round(res["chargesPerSecond"] / res["ceilingPerSecond"], 3)
            # the messages sent / wall: a copy left DUP_IN_PROGRESS and
            # received again counts once here (month-end's time to drain)
            res["drainedPerSecond"] = round(n / wall, 1) if wall else None
            res["drainedOfCeiling"] = round(n / wall / res["ceilingPerSecond"], 3) if wall else None
        if refused:
            log("bench: %s: bank-sim turned away %d connections at its limit: those "
                "charges waited out their lease, and the figures say so" % (name, refused))
        if res["duplicatesDebited"]:
            log("bench: %s: %d DUPLICATE DEBITS (ledger %s)" % (
                name, res["duplicatesDebited"], json.dumps(ledger)))
        return res
    finally:
        shutil.rmtree(state, ignore_errors=True)


def oneshot_latency(name, n, jobs, latency_ms=0):
    """A smaller one-shot run with the tap, only for the latency figures."""
    r = worker_run(name + "-tap", n, False, jobs, latency_ms, tap=True)
    return r["latencyP50Ms"], r["latencyP99Ms"], r["latencySamples"]


# ---- the emulators and PostgreSQL ------------------------------------------

AWS_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
           "AWS_CONFIG_FILE": "/nonexistent/config", "IDEMKIT_AWS_MAX_BACKOFF": "100ms"}


def node_server(args, ready, d, name):
    """A node emulator from node_modules on a loopback port; ready(log
    text) -> port or None."""
    logf = os.path.join(d, name + ".log")
    out = open(logf, "w+")
    p = subprocess.Popen(["node"] + args, cwd=SRC, stdout=out, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL)
    for _ in range(200):
        out.seek(0)
        port = ready(out.read())
        if port:
            return p, port
        if p.poll() is not None:
            break
        time.sleep(0.05)
    p.kill()
    p.wait()
    raise RuntimeError("%s did not start" % name)


def aws_call(url, target, body):
    import urllib.request
    req = urllib.request.Request(url + "/", data=json.dumps(body).encode(), headers={
        "X-Amz-Target": "AmazonSQS." + target, "Content-Type": "application/x-amz-json-1.0"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"{}")


def proc_cpu_s(pid):
    """utime + stime of one process, in seconds (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class EmulatorMeter:
    """The emulators' own CPU while the worker runs (they are outside its
    process tree), and the limit it implies: each is one node thread, so
    it can serve at most 1000 / (its ms per message) messages/s; and the
    machine's cores shared by the client and both emulators."""

    def __init__(self, procs):
        self.procs = procs     # [(name, Popen)]

    def start(self):
        self.c0 = [proc_cpu_s(p.pid) for _, p in self.procs]

    def stop(self, res):
        got = max(res["summary"].get("received", 0), 1)
        per = {}
        for (name, p), c0 in zip(self.procs, self.c0):
            per[name] = round((proc_cpu_s(p.pid) - c0) * 1000 / got, 3)
        res["emulatorCpuMsPerMessage"] = per
        one = min(1000.0 / v for v in per.values() if v > 0) if any(per.values()) else None
        res["emulatorThreadCeilingPerSecond"] = round(one, 1) if one else None
        cpu_ceiling(res)
        lims = [v for v in (res["emulatorThreadCeilingPerSecond"],
                            res["machineCeilingPerSecond"]) if v]
        if lims:
            res["ceilingPerSecond"] = min(lims)
            res["ofCeiling"] = round(res["chargesPerSecond"] / res["ceilingPerSecond"], 3)


def cpu_ceiling(res):
    """What this machine's cores allow when every process a charge needs
    shares them: the toolkit's, bank-sim's, and the store's server's or the
    emulators' (each outside the worker's tree, read from /proc), as
    nproc x 1000 / their ms of CPU per charge summed; and the share of it
    the scenario reached.  On a machine whose bank and servers run
    elsewhere, as in production, only the first would count."""
    total = (res["clientCpuMsPerCharge"] + res.get("bankCpuMsPerCharge", 0)
             + res.get("serverCpuMsPerCharge", 0)
             + sum(res.get("emulatorCpuMsPerMessage", {}).values()))
    cores = os.cpu_count() or 1
    res["cpuMsPerChargeAll"] = round(total, 3)
    res["machineCeilingPerSecond"] = round(cores * 1000.0 / total, 1) if total else None
    if res["machineCeilingPerSecond"] and res.get("chargesPerSecond"):
        res["ofMachineCeiling"] = round(res["chargesPerSecond"] / res["machineCeilingPerSecond"], 3)


def emulator_run(n, jobs):
    """The stream scenario on dynalite (store) and local-aws-sqs (queue and
    DLQ), both from node_modules on loopback: the same message mix."""
    if not shutil.which("node") or not os.path.isdir(os.path.join(SRC, "node_modules", "dynalite")):
        raise RuntimeError("needs node and node_modules (npm ci)")
    d = tempfile.mkdtemp(prefix="idemkit-bench-emu.", dir=os.environ.get("TMPDIR"))
    procs = []
    try:
        port = free_port()
        procs.append(node_server(["node_modules/dynalite/cli.js", "--host", "127.0.0.1",
                                  "--port", str(port), "--createTableMs", "20",
                                  "--deleteTableMs", "20"],
                                 lambda t: port if "listening" in t else None, d, "dynalite"))
        procs.append(node_server(["tests/sqs-server.js"],
                                 lambda t: int(t.split()[0]) if t.strip().split()
                                 and t.strip().split()[0].isdigit() and t.endswith("\n") else None,
                                 d, "sqs"))
        sqs = "http://127.0.0.1:%d" % procs[1][1]
        q = "bench%d" % os.getpid()
        aws_call(sqs, "CreateQueue", {"QueueName": q + "-dlq"})
        aws_call(sqs, "CreateQueue", {"QueueName": q, "Attributes": {"VisibilityTimeout": "120"}})
        extra = dict(AWS_ENV, AWS_ENDPOINT_URL_DYNAMODB="http://127.0.0.1:%d" % port,
                     AWS_ENDPOINT_URL_SQS=sqs,
                     IDEMKIT_QUEUE="%s/123456789012/%s" % (sqs, q),
                     IDEMKIT_DLQ="%s/123456789012/%s-dlq" % (sqs, q),
                     IDEMKIT_STORE="dynamodb:bench-%d" % os.getpid())
        subprocess.run([os.path.join(BIN, "idemp-init")], env=env_for(d, extra), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        meter = EmulatorMeter([("dynalite", procs[0][0]), ("local-aws-sqs", procs[1][0])])
        return worker_run("emulators", n, True, jobs, 0, tap=True, inflight=INFLIGHT,
                          env_extra=extra, backend="dynalite + local-aws-sqs", meter=meter)
    finally:
        for p, _ in procs:
            p.terminate()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)


def postgres_run(n, jobs, latency_ms=0, name="postgres", inflight=None):
    """The stream scenario with the PostgreSQL store (a throwaway server,
    Pg below) and the embedded queue; the server's own single-row durable
    commits/s (Pg.commit_limit) measured just before, on the same server,
    and the charges/s as a share of it."""
    pg = Pg()
    try:
        url = "%s?table=bench_stream" % pg.url
        extra = {"PGPASSFILE": pg.pgpass, "IDEMKIT_STORE": url}
        st = tempfile.mkdtemp(prefix="idemkit-bench.", dir=os.environ.get("TMPDIR"))
        subprocess.run([os.path.join(BIN, "idemp-init")], env=env_for(st, extra), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(st, ignore_errors=True)
        limit = pg.commit_limit(2 if QUICK else 5)
        log("  PostgreSQL single-row durable commits/s (pgbench, one client): %d" % limit)
        s = worker_run(name, n, True, jobs, latency_ms, tap=True,
                       inflight=INFLIGHT if inflight is None else inflight,
                       env_extra=extra, backend="PostgreSQL store, SQLite queue",
                       server_cpu=pg.cpu)
        s["pgCommitsPerSecond"] = limit
        if s.get("chargesPerSecond") and limit and not latency_ms:
            s["ofPgCommits"] = round(s["chargesPerSecond"] / limit, 3)
        return s
    finally:
        pg.stop()


def postgres_lat_run(n, jobs):
    """postgres at the bank latency, one pipeline, as stream-lat."""
    return postgres_run(n, LAT_J, LAT_MS, "postgres-lat", LAT_INFLIGHT)


# ---- the cost of jq mapping (issue 13) -------------------------------------

JQ_REPS = knob("BENCH_JQ_REPS", 5, 1)


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
    # The client secret as charge-debit takes it: a file only its owner may
    # read (a git checkout keeps no such mode), copied under OUT.
    os.makedirs(OUT, exist_ok=True)
    secret = os.path.join(OUT, "demo-client-secret")
    with open(os.path.join(SRC, ob["IDEMKIT_BANK_OAUTH_CLIENT_SECRET_FILE"]), "rb") as f:
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        os.write(fd, f.read())
        os.close(fd)
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


# ---- idemp-run's cost: what it adds to a command's wall time -------------

def idemp_run_cost():
    """RUN_N runs of /bin/true alone and under idemp-run (a fresh key each,
    so every run claims, runs and finishes DONE on the embedded store),
    interleaved; the overhead is the difference of the medians.  Target:
    at most 5 ms (issue 28)."""
    d = tempfile.mkdtemp(prefix="idemkit-bench-run-")
    env = env_for(d, {"IDEMKIT_LOG": "quiet"})
    run_bin = os.path.join(BIN, "idemp-run")
    subprocess.run([os.path.join(BIN, "idemp-init")], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    bare, under = [], []
    for i in range(RUN_N):
        for which, argv in (("bare", ["/bin/true"]),
                            ("under", [run_bin, "--key", "bench-run-%d" % i, "--", "/bin/true"])):
            t = time.perf_counter()
            rc = subprocess.run(argv, env=env).returncode
            ms = (time.perf_counter() - t) * 1000
            if rc != 0:
                raise SystemExit("bench idemp-run: %s exited %d" % (argv[0], rc))
            (bare if which == "bare" else under).append(ms)
    con = sqlite3.connect(os.path.join(d, "idempotency.db"))
    done = con.execute("SELECT count(*) FROM records WHERE state = 'DONE'").fetchone()[0]
    con.close()
    shutil.rmtree(d, ignore_errors=True)
    over = median(under) - median(bare)
    return {"runs": RUN_N, "bareMedianMs": round(median(bare), 3),
            "underMedianMs": round(median(under), 3), "overheadMs": round(over, 3),
            "underP90Ms": round(pct(under, 90), 3), "recordsDone": done,
            "target": "idemp-run adds at most 5 ms of wall time (claim + finish)",
            "targetHolds": over <= 5.0 and done == RUN_N}


# ---- the outbox's cost: the pipeline with and without it, and the relay --

class RelayMeter:
    """idemp-outbox --follow beside the worker, from just before it starts;
    at its end: how long until nothing waits (the relay's lag), and the
    relay's own CPU (wait4)."""

    def __init__(self, env):
        self.env = env

    def waiting(self):
        out = subprocess.run([os.path.join(BIN, "idemp-outbox"), "--stats"], env=self.env,
                             capture_output=True, text=True).stdout
        return json.loads(out)["waiting"]

    def start(self):
        self.t0 = time.monotonic()
        self.p = subprocess.Popen([os.path.join(BIN, "idemp-outbox"), "--follow",
                                   "--poll", "20ms"], env=self.env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self, res):
        t_end = time.monotonic()
        waiting_at_end = self.waiting()
        deadline = t_end + 300
        while self.waiting() and time.monotonic() < deadline:
            time.sleep(0.05)
        drained = time.monotonic()
        self.p.terminate()
        _, _, ru = os.wait4(self.p.pid, 0)
        received = res["summary"].get("received", res["messages"])
        res["relay"] = {
            "waitingWhenWorkerEnded": waiting_at_end,
            "lagAfterWorkerSeconds": round(drained - t_end, 3),
            "eventsPerSecond": round(res["uniqueCharges"] / (drained - self.t0), 1),
            "cpuMsPerEvent": round((ru.ru_utime + ru.ru_stime) * 1000 / res["uniqueCharges"], 4),
            "cpuMsPerCharge": round((ru.ru_utime + ru.ru_stime) * 1000 / max(received, 1), 4),
        }


def outbox_cost():
    """The stream scenario twice, without and with IDEMKIT_OUTBOX (the
    relay running beside the second): the client CPU per charge each way
    (target: the outbox adds at most 10 %%), and whether the relay keeps
    up (nothing much waiting when the worker ends).  The event is written
    by the finish's own statement, so the pipeline's commits are the same
    by construction (tests/outbox.bats checks the group commit)."""
    d = tempfile.mkdtemp(prefix="idemkit-bench-outbox-")
    try:
        off = worker_run("outbox-off", N, True, J, tap=False, inflight=INFLIGHT)
        # (the worker's summary is read from its stderr: at its default log
        # level, as the Redis and PostgreSQL variants; quiet drops it)
        extra = {"IDEMKIT_STORE": "sqlite:" + os.path.join(d, "store.db"),
                 "IDEMKIT_OUTBOX": "sqlite:%s#events" % os.path.join(d, "events.db")}
        meter = RelayMeter(env_for(d, extra))
        on = worker_run("outbox-on", N, True, J, tap=False, inflight=INFLIGHT,
                        env_extra=extra, meter=meter)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    over = on["clientCpuMsPerCharge"] / off["clientCpuMsPerCharge"] - 1
    return {"messages": N, "off": {k: off[k] for k in ("chargesPerSecond", "clientCpuMsPerCharge")},
            "on": {k: on[k] for k in ("chargesPerSecond", "clientCpuMsPerCharge")},
            "relay": on["relay"], "clientCpuOverhead": round(over, 3),
            "duplicatesDebited": off["duplicatesDebited"] + on["duplicatesDebited"],
            "target": "at most 10 % more client CPU per charge; the relay keeps up",
            "targetHolds": over <= 0.10 and on["relay"]["lagAfterWorkerSeconds"] < 5}


RELAY_WRITES = ("SELECT COALESCE(sum(n_tup_ins + n_tup_upd), 0) FROM pg_stat_user_tables"
                " WHERE relname = 'idemkit_outbox_relay'")


def outbox_pg_cost():
    """outbox_cost on the PostgreSQL store: one server (wal_level =
    logical both ways), a table each way; each run's write transactions
    (pg_current_xact_id) and WAL bytes, so "no durable commit added" is
    measured, not assumed."""
    pg = Pg()
    d = tempfile.mkdtemp(prefix="idemkit-bench-outbox-pg-")
    try:
        res = {}
        for mode in ("off", "on"):
            extra = {"PGPASSFILE": pg.pgpass,
                     "IDEMKIT_STORE": "%s?table=bench_obx_%s" % (pg.url, mode)}
            if mode == "on":
                extra["IDEMKIT_OUTBOX"] = "sqlite:%s#events" % os.path.join(d, "events.db")
            subprocess.run([os.path.join(BIN, "idemp-init")], env=env_for(d, extra), check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            x0, w0 = pg.value("SELECT pg_current_xact_id(), pg_current_wal_lsn()").split("|")
            y0 = int(pg.value(RELAY_WRITES))
            meter = RelayMeter(env_for(d, dict(extra, IDEMKIT_LOG="quiet"))) if mode == "on" else None
            r = worker_run("outbox-pg-" + mode, PG_N, True, J, tap=False, inflight=INFLIGHT,
                           env_extra=extra, meter=meter, backend="PostgreSQL store, SQLite queue")
            x1, w1 = pg.value("SELECT pg_current_xact_id(), pg_current_wal_lsn()").split("|")
            wal = int(pg.value("SELECT pg_wal_lsn_diff('%s', '%s')" % (w1, w0)).split(".")[0])
            # the relay's own writes (its lease and checkpoints, one row
            # each) counted apart from the pipeline's
            relay = int(pg.value(RELAY_WRITES)) - y0
            r["writeTransactionsPerCharge"] = round((int(x1) - int(x0) - 1 - relay) / PG_N, 4)
            r["relayWriteTransactionsPerEvent"] = round(relay / PG_N, 4)
            r["walBytesPerCharge"] = round(wal / PG_N)
            res[mode] = r
    finally:
        shutil.rmtree(d, ignore_errors=True)
        pg.stop()
    off, on = res["off"], res["on"]
    over = on["clientCpuMsPerCharge"] / off["clientCpuMsPerCharge"] - 1
    keys = ("chargesPerSecond", "clientCpuMsPerCharge", "writeTransactionsPerCharge",
            "walBytesPerCharge")
    return {"messages": PG_N, "off": {k: off[k] for k in keys}, "on": {k: on[k] for k in keys},
            "relay": dict(on["relay"], writeTransactionsPerEvent=on["relayWriteTransactionsPerEvent"]),
            "clientCpuOverhead": round(over, 3),
            "duplicatesDebited": off["duplicatesDebited"] + on["duplicatesDebited"],
            "target": "at most 10 % more client CPU per charge, no write transaction added; "
                      "the relay keeps up",
            "targetHolds": (over <= 0.10 and on["relay"]["lagAfterWorkerSeconds"] < 5 and
                            on["writeTransactionsPerCharge"] <= off["writeTransactionsPerCharge"]
                            * 1.1 + 0.01)}


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
    return res

def redis_aof_transactions(port):
    """Writes the server fsynced, as transactions (a script's writes are
    one MULTI/EXEC; appendfsync always: one fsync each) since it started:
    the EXEC lines of its append-only file."""
    d = subprocess.run(["redis-cli", "-p", str(port), "CONFIG", "GET", "dir"],
                       capture_output=True, text=True).stdout.split()[1]
    n = 0
    for f in glob.glob(os.path.join(d, "appendonlydir", "*.incr.aof")):
        with open(f, "rb") as fh:
            n += fh.read().count(b"\r\nEXEC\r\n")
    return n


def outbox_cost_redis():
    """outbox_cost on the Redis store: the stream scenario without and with
    IDEMKIT_OUTBOX (the relay beside the second), each on a fresh server;
    besides the client CPU, the store's round trips and fsynced
    transactions per charge each way (the event is XADDed by the finish's
    own script: the same by construction, tests/outbox-redis.bats checks
    it too)."""
    if not shutil.which("redis-server"):
        log("  redis-server not installed: skipped")
        return None
    d = tempfile.mkdtemp(prefix="idemkit-bench-outbox-redis-")
    res = {}
    try:
        for name in ("off", "on"):
            srv, port = redis_start(os.path.join(d, name))
            try:
                extra = {"IDEMKIT_STORE": "redis://127.0.0.1:%d" % port}
                meter = None
                if name == "on":
                    extra["IDEMKIT_OUTBOX"] = "sqlite:%s#events" % os.path.join(d, "events.db")
                    meter = RelayMeter(env_for(d, extra))
                tx0 = redis_aof_transactions(port)
                redis_reset(port)
                w = worker_run("outbox-redis-" + name, N, True, J, tap=False,
                               inflight=INFLIGHT, env_extra=extra, meter=meter)
                charges = max(w["uniqueCharges"], 1)
                res[name] = {k: w[k] for k in ("chargesPerSecond", "clientCpuMsPerCharge")}
                res[name]["storeRoundTripsPerCharge"] = round(redis_calls(port) / charges, 3)
                # the relay's own (lease, read, checkpoint) included when on
                res[name]["aofTransactionsPerCharge"] = round(
                    (redis_aof_transactions(port) - tx0) / charges, 3)
                res[name]["duplicatesDebited"] = w["duplicatesDebited"]
                res[name]["workerExit"] = w["workerExit"]
                if meter:
                    res["relay"] = w["relay"]
            finally:
                srv.terminate()
                srv.wait()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    over = res["on"]["clientCpuMsPerCharge"] / res["off"]["clientCpuMsPerCharge"] - 1
    res.update({"messages": N, "clientCpuOverhead": round(over, 3),
                "duplicatesDebited": res["off"]["duplicatesDebited"] +
                res["on"]["duplicatesDebited"],
                "target": "at most 10 % more client CPU per charge; no more store round "
                          "trips or fsyncs in the pipeline; the relay keeps up",
                "targetHolds": over <= 0.10 and res["relay"]["lagAfterWorkerSeconds"] < 5})
    return res

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
                    "port = %d\nshared_buffers = 256MB\n"
                    # the outbox's logical decoding (outbox-pg); the other
                    # scenarios write a little more WAL for it
                    "wal_level = logical\nmax_replication_slots = 10\n" % (self.dir, self.port))
        self.as_pg(["pg_ctl", "-D", self.data(), "-l", os.path.join(self.dir, "log"), "-w", "start"])
        self.sql("CREATE ROLE idemkit LOGIN REPLICATION PASSWORD '%s'" % pw, "postgres")
        self.sql("CREATE DATABASE idemkit OWNER idemkit", "postgres")
        self.pgpass = os.path.join(self.dir, "pgpass")
        with open(self.pgpass, "w") as f:
            f.write("127.0.0.1:%d:idemkit:idemkit:%s\n" % (self.port, pw))
        os.chmod(self.pgpass, 0o600)
        self.url = "postgres://idemkit@127.0.0.1:%d/idemkit" % self.port

    def data(self):
        return os.path.join(self.dir, "data")

    def commit_limit(self, seconds):
        """Single-row durable commits/s this server does (fsync and
        synchronous_commit on, the defaults): pgbench, one client, one
        one-row INSERT per transaction."""
        self.sql("CREATE TABLE IF NOT EXISTS bench_commits (id bigserial PRIMARY KEY, v text)")
        script = os.path.join(self.dir, "insert.sql")
        with open(script, "w") as f:
            f.write("INSERT INTO bench_commits (v) VALUES ('x');\n")
        shutil.chown(script, "postgres", "postgres")
        out = subprocess.run(["runuser", "-u", "postgres", "--", os.path.join(self.bin, "pgbench"),
                              "-n", "-c", "1", "-T", str(seconds), "-f", script, "-h", self.dir,
                              "-p", str(self.port), "-U", "postgres", "idemkit"],
                             cwd="/", check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("tps = "):
                return round(float(line.split()[2]))
        raise RuntimeError("pgbench: no tps in its output")

    def as_pg(self, argv):
        subprocess.run(["runuser", "-u", "postgres", "--", os.path.join(self.bin, argv[0])] + argv[1:],
                       cwd="/", check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def value(self, q, db="idemkit"):
        return subprocess.run([os.path.join(self.bin, "psql"), "-X", "-q", "-At", "-h", self.dir,
                               "-p", str(self.port), "-U", "postgres", "-d", db, "-c", q],
                              check=True, capture_output=True, text=True).stdout.strip()

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
    for name, fn, n in (("emulators", emulator_run, EMU_N), ("postgres", postgres_run, PG_N),
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
