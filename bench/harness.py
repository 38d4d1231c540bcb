"""harness.py: how the bench makes and measures one run (bench.py says what
it measures): the knobs, bank-sim, the machine's durable commit limit, the
worker run with its CPU, latency and ledger, and what the cores allow."""

import json
import os
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
    pragmas the store and queue use (lib/conn/sqlite.c: journal_mode=WAL,
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


def proc_cpu_s(pid):
    """utime + stime of one process, in seconds (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def median(v):
    v = sorted(v)
    k = len(v)
    return None if not k else v[k // 2] if k % 2 else (v[k // 2 - 1] + v[k // 2]) / 2.0


def free_port():
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]
