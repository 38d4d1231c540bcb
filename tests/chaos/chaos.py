#!/usr/bin/env python3
"""tests/chaos/chaos.py: a fault campaign (Jepsen's method) against idemkit.

A generated workload (charges sent 1-5 times, declined accounts, poison and
mismatched copies, DLQ re-drives and re-notifications while the workers
run), a nemesis that injects faults drawn from the seed (nemesis.py), and a
checker that judges the history against the invariants (checker.py), with
workers, store, queue and bank on separate hosts (network namespaces,
net.py).  docs/RELIABILITY.md gives the method and the figures.

usage: chaos.py [--seed N] [--duration S] [--backend B] [--bin DIR] [--out DIR]
                [--only KIND,...] [--charges N | --rate R] [--schedule FILE] [--pg-async]
                [--worker CMD [--worker-clock]]
  B: embedded (SQLite store and queue, several workers on one host),
     postgres (primary + synchronous replica; SQS emulator queue),
     redis (primary + replica; SQS emulator queue),
     dynamodb (DynamoDB Local + the SQS emulator),
     rabbitmq (RabbitMQ on the queue host: amqp:// queue and DLQ; the
     PostgreSQL store of the postgres backend).
exit: 0 every invariant held; 1 a violation (the verdict says which);
      2 the harness itself failed; 77 cannot run here (not root, no netns).
The commands come from PATH as a deployment's would: --bin DIR (default
build/bin) is put first on PATH, and CHARGE_DEBIT_CMD and the other step
overrides in the environment pass through to the workers unchanged.

--worker CMD judges another consumer (any language): CMD is run with
/bin/sh -c on each worker host in place of charge-worker, in the directory
chaos.py was started from (the others run in /), restarted when it
exits, with the queue (IDEMKIT_QUEUE, IDEMKIT_DLQ: SQS queue URLs;
AWS_ENDPOINT_URL_SQS, AWS_REGION and the AWS credentials), the store where
the backend has one the SDKs reach (AWS_ENDPOINT_URL_DYNAMODB), the bank
and the notification gateway (IDEMKIT_BANK_URL, IDEMKIT_NOTIFY_URL, their
CA and OAuth2 client credentials) in its environment; it is killed,
stopped, signalled and partitioned as charge-worker is (its clock is
skewed only with --worker-clock: libfaketime's preload breaks Python's
time.sleep), and judged by
the invariants that need no idemkit record (checker.py).  It needs a backend
whose queue is SQS (postgres, redis, dynamodb).  --rate R offers R charges
a second over the sending window (three quarters of the run), in place of
--charges.
"""
import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True   # nothing written into the source tree
sys.path.insert(0, HERE)
import net as netmod        # noqa: E402
import servers              # noqa: E402
import backends             # noqa: E402
from nemesis import KINDS, Nemesis, schedule   # noqa: E402
import checker              # noqa: E402
import outbox as outboxmod  # noqa: E402

SRC = os.path.dirname(os.path.dirname(HERE))
LEASE_S = 16
WORKER_ARGS = ["--lease", "%ds" % LEASE_S, "--debit-timeout", "2", "--notify-timeout", "1",
               "--notify-retries", "1", "--no-lock"]
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
DECLINED = ["ACC-DECL-1", "ACC-DECL-2", "ACC-DECL-3"]
# Steps a user may override; passed to the workers exactly as given.
OVERRIDES = ("SQS_RECV_CMD", "IDEMP_CLAIM_CMD", "CHARGE_DEBIT_CMD", "CHARGE_NOTIFY_CMD",
             "IDEMP_DONE_CMD", "SQS_ACK_CMD")
# The workers' backoff cap (sqs-ack --backoff-cap, IDEMKIT_BACKOFF_CAP): a
# copy left after a failure comes back within it.  The default, 900 s,
# would hide a copy left just before the heal for 15 minutes, longer than
# any bound worth stating; a team sets the cap its drain budget allows, and
# the campaign runs as such a deployment.
BACKOFF_CAP_S = 30
# A copy received and left without a change of its visibility (its DLQ
# move or its delete failed: a send connection that died while idle) comes
# back after the queue's visibility timeout, 30 s on every queue here (the
# SQS default; RabbitMQ's holder's), not within a lease: the drain waits
# that long with no claim before it calls the backlog drained (seed 8 on
# rabbitmq: a DUP_FAILED copy whose DLQ move met a dead connection came
# back 30 s later, after the workers had been stopped at 20 s of quiet).
QUEUE_VISIBILITY_S = 30
QUIET_S = max(LEASE_S, QUEUE_VISIBILITY_S) + 4
# Liveness: once the last fault is healed, the backlog must drain within
# this bound: two leases (a claim taken just before the heal runs out, its
# redelivery waits at most one more) plus the backoff cap and a margin for
# a server coming back (failover included).
DRAIN_BOUND_S = 2 * LEASE_S + BACKOFF_CAP_S + 15
# ... on an idle machine.  The machine is shared (other suites, other
# campaigns): the bound is multiplied by the run queue per core (the 1-minute
# load average over the cores) measured while draining, at least 1 and at
# most DRAIN_LOAD_MAX, and the verdict gives the load it was scaled by.
DRAIN_LOAD_MAX = 4


def drain_bound(loads):
    """The liveness bound for the loads sampled during the drain."""
    per_cpu = sum(loads) / len(loads) / (os.cpu_count() or 1) if loads else 1.0
    return int(DRAIN_BOUND_S * min(DRAIN_LOAD_MAX, max(1.0, per_cpu))), round(per_cpu, 2)


def redrive_due(backend, unsettled, queued, quiet_s):
    """After the heal: is the backlog drained (the embedded queue empty;
    elsewhere, whose queue counts are not to be trusted, no claim for a
    lease and a bit) with charges still open?  What is left of them is
    then in the DLQ, and the operator re-drives it (once)."""
    if not unsettled:
        return False
    return queued == 0 if backend == "embedded" else quiet_s >= LEASE_S + 4


def now_ms():
    return int(time.time() * 1000)


class World:
    def __init__(self, a, run):
        self.a, self.run = a, run
        self.rng = random.Random("world-%d" % a.seed)
        self.backend = a.backend
        self.a_src = SRC
        hosts = {"bank": 2, "w1": 11}
        if a.backend != "embedded":
            hosts.update(queue=3, store=4, w2=12, w3=13)
            if a.backend in ("postgres", "redis", "rabbitmq"):
                hosts["store2"] = 5
        self.net = netmod.Net(hosts)
        self.workers = sorted(h for h in hosts if h.startswith("w"))
        self.procs = servers.Procs(self.net, run)
        path = os.path.abspath(a.bin) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        os.makedirs(os.path.join(run, "home"), exist_ok=True)
        self.procs.env = {"PATH": path, "HOME": os.path.join(run, "home"), "LANG": "C.UTF-8",
                          "IDEMKIT_LOG": "info"}
        self.secrets = []
        self.bank = None
        self.store = None
        self.broker = None         # backends.Rabbit on rabbitmq
        self.links = {}            # "store"/"queue": [servers.Link]
        self.outbox = None         # outbox.Outbox with --outbox
        self.slots = []            # (host, name, stream, jobs)
        self.stopping = threading.Event()
        self.clock_files = {}
        self.seen = {}             # log file: (bytes read, matches), for activity()
        self.cwd = os.getcwd()     # where --worker's command was given (relative paths)

    # ---- set-up ------------------------------------------------------
    def up(self):
        self.net.up()
        self.bank = servers.Bank(self.procs, "bank", SRC, self.a.seed, DECLINED)
        self.bank.start()
        self.secrets.append(("OAuth client secret", self.bank.secret))
        env = dict(self.procs.env)
        self.bank.worker_env(env)
        self.store, extra, secrets_ = backends.start(self)
        env.update(extra)
        if self.a.outbox:
            self.outbox = outboxmod.Outbox(self)
            env.update(self.outbox.env())
        self.secrets.extend(secrets_)
        for k in OVERRIDES:
            if os.environ.get(k):
                env[k] = os.environ[k]
        env["IDEMKIT_BACKOFF_CAP"] = str(BACKOFF_CAP_S)
        if self.backend == "rabbitmq" and not self.a.worker:
            # Every delivery of every message id in the workers' logs: at
            # debug the receiver's holder writes a line per delivery, ack,
            # return (and why) and lost connection, with the delivery tag
            # and the connection it belongs to (idemkit(7) "RabbitMQ").
            env["IDEMKIT_LOG"] = "debug"
        self.wenv = env
        r = self.procs.sh(self.workers[0], ["idemp-init"], env=env, check=False)
        with open(self.procs.log("idemp-init"), "a") as f:
            f.write(r.stderr)   # its warnings (PostgreSQL replicating asynchronously)
        if r.returncode not in (0, 1):
            raise RuntimeError("idemp-init: %s" % r.stderr.strip()[-300:])
        # Worker slots: a mix of --stream and one-shot, -j 1..4, drawn
        # from the seed; on the embedded default, several on one host.
        # There, a seed that draws only one-shot slots keeps them so: that
        # is the demo's and a cron host's deployment, where every
        # connection to the queue's file comes and goes (a long-lived
        # --stream worker's hides what happens when the last one closes).
        n = 3 if self.backend == "embedded" else 1
        for h in self.workers:
            for i in range(n):
                stream = self.rng.random() < 0.5
                self.slots.append((h, "%s.%d" % (h, i), stream, self.rng.randint(1, 4)))
        if not any(s[2] for s in self.slots) and self.backend != "embedded":
            h, nm, _, j = self.slots[0]
            self.slots[0] = (h, nm, True, j)
        if all(s[2] for s in self.slots):
            h, nm, _, j = self.slots[-1]
            self.slots[-1] = (h, nm, False, j)
        for h in self.workers:
            self.set_clock(h, 0)

    def host_env(self, host):
        env = dict(self.wenv)
        st = os.path.join(self.run, "hosts", host, "state")
        os.makedirs(st, exist_ok=True)
        env["IDEMKIT_STATE_DIR"] = st
        if self.backend != "embedded" and os.path.exists(FAKETIME) and \
                (not self.a.worker or self.a.worker_clock):
            # The wall clock skewed or jumping, the monotonic clock left alone.
            env.update(LD_PRELOAD=FAKETIME, FAKETIME_TIMESTAMP_FILE=self.clock_files[host],
                       FAKETIME_DONT_FAKE_MONOTONIC="1", FAKETIME_CACHE_DURATION="1")
        return env

    def set_clock(self, host, skew):
        f = self.clock_files.setdefault(host, os.path.join(self.run, "hosts", host, "faketime"))
        os.makedirs(os.path.dirname(f), exist_ok=True)
        with open(f + ".tmp", "w") as fh:
            fh.write("%+ds\n" % int(skew))
        os.replace(f + ".tmp", f)

    # ---- workers -----------------------------------------------------
    def supervise(self, slot):
        host, name, stream, jobs = slot
        k = 0
        while not self.stopping.is_set():
            k += 1
            if self.a.worker:
                argv = ["/bin/sh", "-c", self.a.worker]
            else:
                argv = ["charge-worker", "-j", str(jobs)] + WORKER_ARGS + \
                    (["--stream"] if stream else ["--drain", "--wait", "1"])
            with open(self.procs.log("worker-" + name), "a") as f:
                f.write(json.dumps({"ts": now_ms(), "harness": "launch", "host": host,
                                    "argv": argv}) + "\n")
            p = self.procs.spawn(host, "worker-%s#%d" % (name, k), argv, env=self.host_env(host),
                                 log=self.procs.log("worker-" + name),
                                 cwd=self.cwd if self.a.worker else None)
            while p.poll() is None and not self.stopping.is_set():
                time.sleep(0.2)
            if self.stopping.is_set():
                break
            self.procs.procs.pop("worker-%s#%d" % (name, k), None)
            self.stopping.wait(0.3 if not stream else 1.0)

    def worker_pgids(self, host):
        return [p.pid for n, p in list(self.procs.procs.items())
                if n.startswith("worker-%s." % host) and p.poll() is None]

    def stop_workers(self):
        self.stopping.set()
        for n in [n for n in self.procs.procs if n.startswith("worker-")]:
            self.procs.stop(n, wait=15)

    # ---- operators' cron jobs while the workers run ------------------
    def cron(self, until):
        rng = random.Random("cron-%d" % self.a.seed)
        while not self.a.worker and time.monotonic() < until and not self.stopping.is_set():
            self.stopping.wait(rng.uniform(6, 14))
            if time.monotonic() >= until:
                break
            host = rng.choice(self.workers)
            job = rng.choice([["--renotify", "--older-than", "2s", "--notify-timeout", "1",
                               "--notify-retries", "1"], ["--dlq"]])
            with open(self.procs.log("cron"), "a") as f:
                f.write(json.dumps({"ts": now_ms(), "harness": "cron", "host": host,
                                    "argv": job}) + "\n")
            p = self.procs.spawn(host, "cron", ["charge-recover"] + job,
                                 env=self.host_env(host), log=self.procs.log("cron"))
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                self.procs.stop("cron", signal.SIGKILL)

    def redrive_after_heal(self, why="after the heal"):
        """The operator, once the faults are healed (the bank's
        credentials work again): the DLQ re-driven once.  A charge whose
        last copy met a 401 storm was dead-lettered CONFIG, its record left
        IN_PROGRESS for a retry under the same key; while the faults ran
        the cron's re-drives brought such copies back, but one
        dead-lettered after the cron's last --dlq had none (seed 11 on
        DynamoDB: debited, its 201 lost with a killed charge-debit, then
        401 on every retry), and a bank would not leave it there.  Called
        again once the backlog is drained with charges still open (why:
        "drained, charges open"): a copy left before the heal on its last
        delivery but one reaches the DLQ only when it comes back, up to
        the backoff cap after the heal (run embedded 1006: 21 s after
        the re-drive at the heal, debited, its record IN_PROGRESS)."""
        host = self.workers[0]
        if self.a.worker:
            return      # another consumer's DLQ is its operators' business
        with open(self.procs.log("cron"), "a") as f:
            f.write(json.dumps({"ts": now_ms(), "harness": "cron", "host": host,
                                "argv": ["--dlq"], "why": why}) + "\n")
        # its log into the cron's file, as the cron's runs: a RabbitMQ
        # holder keeps no stderr that is a pipe, and the re-drive's lines
        # name the message ids it took from the DLQ
        p = self.procs.spawn(host, "redrive", ["charge-recover", "--dlq"],
                             env=self.host_env(host), log=self.procs.log("cron"))
        try:
            p.wait(120)
        except subprocess.TimeoutExpired:
            self.procs.stop("redrive", signal.SIGKILL)

    # ---- observation -------------------------------------------------
    def sample_cmdlines(self):
        """Every process in our namespaces, argv and all (check 5)."""
        out = []
        for h in self.net.hosts:
            for pid in self.net.pids(h):
                try:
                    with open("/proc/%d/cmdline" % pid, "rb") as f:
                        out.append(f.read().replace(b"\0", b" ").decode("utf-8", "replace"))
                except OSError:
                    pass
        with open(os.path.join(self.run, "logs", "cmdlines.log"), "a") as f:
            for c in sorted(set(out)):
                f.write(c + "\n")

    def activity(self):
        """What the workers have done so far: their claims (charge-worker's
        log lines), or another consumer's requests at the bank (it logs
        what it likes).  Only the lines added since the last look are read,
        once a second, however long the run's logs have grown."""
        logs = os.path.join(self.run, "logs")
        if self.a.worker:
            files, pat = ["bank-sim.log"], b'"msg":"request"'
        else:
            files, pat = [f for f in os.listdir(logs) if f.startswith("worker-")], b'"msg":"claim"'
        for f in files:
            off, n = self.seen.get(f, (0, 0))
            try:
                with open(os.path.join(logs, f), "rb") as fh:
                    fh.seek(off)
                    data = fh.read()
            except OSError:
                continue
            cut = data.rfind(b"\n") + 1
            self.seen[f] = (off + cut, n + data[:cut].count(pat))
        return sum(n for f, (_, n) in self.seen.items() if f in files)

    def queue_counts(self):
        r = self.procs.sh(self.workers[0], ["sqs-stat"], env=self.host_env(self.workers[0]),
                          check=False, timeout=30)
        with open(self.procs.log("drain"), "a") as f:
            f.write(json.dumps({"ts": now_ms(), "harness": "sqs-stat", "out": r.stdout.strip(),
                                "rc": r.returncode}) + "\n")
        try:
            q = json.loads(r.stdout)
            return q["visible"] + q["inflight"] + q["delayed"]
        except (ValueError, KeyError):
            return None

    def unsettled(self, ids):
        """How many of the charges sent have no terminal record yet (another
        consumer's: of those not declined, how many the bank's ledger has
        no debit for)."""
        if self.a.worker:
            try:
                db = sqlite3.connect("file:%s?mode=ro" % self.bank.ledger, uri=True, timeout=5)
                debited = {r[0] for r in db.execute("SELECT charge_id FROM debits")}
                db.close()
            except sqlite3.Error:
                return None
            return len(ids - debited)
        r = self.procs.sh(self.workers[0], ["idemp-list"], env=self.host_env(self.workers[0]),
                          check=False, timeout=60)
        if r.returncode not in (0, 1):
            return None
        done = set()
        for line in r.stdout.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("state") in checker.TERMINAL:
                done.add(rec.get("chargeId"))
        return len(ids - done)

    def snapshot(self, name):
        """What every process in the worker hosts is doing (a drain that
        missed its bound: which step waits on what)."""
        with open(self.procs.log(name), "a") as f:
            for h in self.workers:
                pids = ",".join(str(p) for p in self.net.pids(h))
                if pids:
                    r = netmod.run("ps", "-o", "pid,pgid,stat,wchan:24,etimes,args", "-p", pids,
                                   check=False)
                    f.write("== %s\n%s\n" % (h, r.stdout))

    def collect(self):
        env = self.host_env(self.workers[0])
        h = self.workers[0]
        # copies received by a worker that was stopped come back after the
        # visibility timeout, and copies left with a backoff after it:
        # wait for them (at most a lease and the backoff cap), so that
        # "left in the queue" tells a hidden copy from a lost one
        end = time.monotonic() + LEASE_S + BACKOFF_CAP_S + 5
        while time.monotonic() < end:
            r = self.procs.sh(h, ["sqs-stat"], env=env, check=False, timeout=30)
            try:
                if json.loads(r.stdout)["inflight"] == 0:
                    break
            except (ValueError, KeyError):
                pass
            time.sleep(1)
        if self.broker is not None:
            # RabbitMQ counts no delivery in flight (sqs-stat says 0): what
            # the stopped workers received is held by their holders
            # (idemkit(7) "RabbitMQ"), each returned to the queue when its
            # visibility ends (30 s, moved by a backoff up to the cap), and
            # a holder ends once it holds nothing: wait for them to go
            end = time.monotonic() + 30 + BACKOFF_CAP_S + 10
            while time.monotonic() < end and any(self.net.pids(w) for w in self.workers):
                time.sleep(1)
        with open(os.path.join(self.run, "records.ndjson"), "w") as f:
            if not self.a.worker:       # another consumer keeps no idemkit record
                f.write(self.procs.sh(h, ["idemp-list"], env=env, check=False,
                                      timeout=120).stdout)
        for name, q in (("dlq", env["IDEMKIT_DLQ"]), ("queue", env["IDEMKIT_QUEUE"])):
            r = self.procs.sh(h, ["sqs-recv", "--queue", q, "--drain", "--max", "10", "--wait", "1"],
                              env=env, check=False, timeout=120)
            with open(os.path.join(self.run, name + ".ndjson"), "w") as f:
                f.write(r.stdout)

    def down(self):
        self.stopping.set()
        self.procs.stop_all()
        backends.stop(self)
        self.net.cleanup()


# ---- the workload --------------------------------------------------------

def workload(seed, duration, n):
    """Charges with the copies a retrying producer sends, when, and what the
    checker must expect of each."""
    rng = random.Random("workload-%d" % seed)
    charges, sends = [], []
    for i in range(n):
        cid = "CHG-%d-%05d" % (seed, i)
        declined = rng.random() < 0.08
        acct = rng.choice(DECLINED) if declined else "ACC-%04d" % rng.randint(1, 60)
        amount = rng.randint(100, 500000)
        body = json.dumps({"chargeId": cid, "accountId": acct, "amount": amount,
                           "currency": "INR", "chargeType": "SMS_ALERT_FEE",
                           "dueDate": "2026-11-30"}, separators=(",", ":"))
        t0 = rng.uniform(0, duration * 0.75)
        copies = rng.choice([1, 1, 2, 2, 3, 4, 5])
        c = {"chargeId": cid, "accountId": acct, "amount": amount, "declined": declined,
             "body": body, "copies": copies, "mismatch": None}
        for k in range(copies):
            # later copies: some within the lease (a concurrent duplicate),
            # some after it (a finished record meets its duplicate)
            sends.append((min(duration * 0.95, t0 + (0 if k == 0 else rng.uniform(0, 2.5 * LEASE_S))), body))
        if rng.random() < 0.03:
            other = json.loads(body)
            other["amount"] = amount + 1
            mb = json.dumps(other, separators=(",", ":"))
            c["mismatch"] = mb
            sends.append((min(duration * 0.95, t0 + rng.uniform(0.5, LEASE_S)), mb))
        charges.append(c)
    poison = []
    # malformed events a buggy billing system sends: each must end in the
    # DLQ, never at the bank
    bad = ['POISON-%d-%d {not json', '{"chargeId":"BAD-%d-%d-zero","accountId":"ACC-1","amount":0,'
           '"currency":"INR","chargeType":"SMS_ALERT_FEE"}',
           '{"chargeId":"BAD-%d-%d-frac","accountId":"ACC-1","amount":2500.5,'
           '"currency":"INR","chargeType":"SMS_ALERT_FEE"}',
           '{"chargeId":"BAD-%d-%d-neg","accountId":"ACC-1","amount":-100,'
           '"currency":"INR","chargeType":"SMS_ALERT_FEE"}',
           '{"chargeId":"BAD-%d-%d-dec","accountId":"ACC-1","amount":2500.00,'
           '"currency":"INR","chargeType":"SMS_ALERT_FEE"}']
    for i in range(max(len(bad), n // 25)):
        b = bad[i % len(bad)].replace("%d-%d", "%d-%d" % (seed, i))
        poison.append(b)
        sends.append((rng.uniform(0, duration * 0.75), b))
    sends.sort(key=lambda s: s[0])
    return {"charges": charges, "poison": poison}, sends


def produce(world, sends, t0, log):
    """The billing system: sends each copy when due; a failed send is sent
    again (a producer's retry, one more duplicate)."""
    i = 0
    h = world.workers[0]
    env = world.host_env(h)
    env.pop("LD_PRELOAD", None)
    while i < len(sends) and not world.stopping.is_set():
        now = time.monotonic() - t0
        batch = []
        while i < len(sends) and sends[i][0] <= now and len(batch) < 10:
            batch.append(sends[i][1])
            i += 1
        if not batch:
            world.stopping.wait(0.1)
            continue
        # a billing system sends again until the queue takes it (its own
        # outbox): for minutes, not 50 tries (a RabbitMQ broker restarted
        # on a loaded machine takes 20-40 s to listen again: measured)
        until = time.monotonic() + 300
        while time.monotonic() < until:
            r = subprocess.run(["sqs-send"], input="\n".join(batch) + "\n", env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
            # the chargeIds sent: when each charge entered the backlog (the
            # checker's recovery times)
            log.write(json.dumps({"ts": now_ms(), "sent": len(batch), "rc": r.returncode,
                                  "ids": [checker.charge_of(b) for b in batch]
                                  if r.returncode == 0 else []}) + "\n")
            if r.returncode == 0:
                break
            time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--duration", type=int, default=90)
    ap.add_argument("--backend", default="embedded",
                    choices=["embedded", "postgres", "redis", "dynamodb", "rabbitmq"])
    ap.add_argument("--bin", default=os.path.join(SRC, "build/bin"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, help="fault kinds, comma-separated")
    ap.add_argument("--charges", type=int, default=None)
    ap.add_argument("--rate", type=float, default=None,
                    help="charges offered a second over the sending window (3/4 of the run)")
    ap.add_argument("--worker", default=None,
                    help="judge another consumer: this command (sh -c) on each worker host")
    ap.add_argument("--worker-clock", action="store_true",
                    help="--worker: skew its clock too (libfaketime preloaded: a runtime that "
                    "survives it)")
    ap.add_argument("--outbox", action="store_true",
                    help="the outbox on, its relay killed now and then, checked (outbox.py)")
    ap.add_argument("--schedule", default=None,
                    help="replay a run's schedule.json instead of drawing one from the seed")
    ap.add_argument("--pg-async", action="store_true",
                    help="postgres: the replica streams asynchronously (what a failover costs "
                    "then; idemp-init warns)")
    a = ap.parse_args()
    if a.worker and a.backend in ("embedded", "rabbitmq"):
        ap.error("--worker needs a backend whose queue is SQS (postgres, redis, dynamodb): "
                 "the embedded default's queue is a SQLite file only idemkit reads, and the "
                 "worker's environment names SQS queues")
    if a.seed is None:
        a.seed = random.SystemRandom().randint(1, 99999)
    why = netmod.can_run()
    if why:
        print("chaos: SKIP: %s" % why, file=sys.stderr)
        return 77
    run = a.out or tempfile.mkdtemp(prefix="idemkit-chaos.")
    os.makedirs(run, exist_ok=True)
    os.chmod(run, 0o755)   # the postgres user needs to reach its directories
    print("chaos: backend %s, seed %d, %d s of faults, run directory %s"
          % (a.backend, a.seed, a.duration, run), flush=True)
    os.environ["PATH"] = os.path.abspath(a.bin) + ":" + os.environ.get("PATH", "")
    w = World(a, run)

    def on_signal(sig, frame):
        raise KeyboardInterrupt()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    rc = 2
    try:
        w.up()
        n = a.charges or (int(a.rate * a.duration * 0.75) if a.rate else
                          max(40, int(a.duration * 1.5)))
        wl, sends = workload(a.seed, a.duration, n)
        only = set(a.only.split(",")) if a.only else None
        if a.worker and not a.worker_clock:
            # no clock faults for another consumer: libfaketime's preload
            # breaks common runtimes outright (Python 3.11's time.sleep
            # fails with EINVAL under it, skewed or not, measured here)
            only = (only or set(KINDS)) - {"clock"}
        ev = schedule(a.seed, a.duration, a.backend, sorted(w.net.hosts), w.workers, LEASE_S, only,
                      outbox=a.outbox)
        if a.schedule:
            with open(a.schedule) as f:
                ev = json.load(f)
        with open(os.path.join(run, "workload.json"), "w") as f:
            json.dump(dict(wl, seed=a.seed, backend=a.backend, duration=a.duration, outbox=a.outbox,
                           lease_s=LEASE_S, declined=DECLINED, worker=a.worker,
                           slots=[list(s) for s in w.slots]), f)
        with open(os.path.join(run, "schedule.json"), "w") as f:
            json.dump(ev, f, indent=0)
        nem = Nemesis(w, ev, os.path.join(run, "nemesis.log"))
        t0, t0_ms = time.monotonic(), now_ms()
        threads = [threading.Thread(target=w.supervise, args=(s,), daemon=True) for s in w.slots]
        threads.append(threading.Thread(target=nem.run, daemon=True))
        threads.append(threading.Thread(target=w.cron, args=(t0 + a.duration,), daemon=True))
        plog = open(os.path.join(run, "logs", "producer.log"), "a", buffering=1)
        prod = threading.Thread(target=produce, args=(w, sends, t0, plog), daemon=True)
        threads.append(prod)
        for t in threads:
            t.start()
        if w.outbox:
            w.outbox.start()
        while time.monotonic() - t0 < a.duration:
            w.sample_cmdlines()
            time.sleep(2)
        prod.join(120)
        nem.heal_all()
        healed, healed_ms = time.monotonic(), now_ms()
        w.redrive_after_heal()
        print("chaos: faults healed after %.0f s (%d scheduled); waiting for the backlog to drain"
              % (healed - t0, len(ev)), flush=True)
        drained = None
        ids = {c["chargeId"] for c in wl["charges"] if not (a.worker and c["declined"])}
        last, changed, settled_at = -1, time.monotonic(), None
        loads = []
        redriven = False
        while time.monotonic() - healed < drain_bound(loads)[0] + 60:
            loads.append(os.getloadavg()[0])
            # Drained: every charge sent has its terminal record, the queue
            # is empty, and no worker has claimed anything for a visibility
            # timeout and a bit (every copy left has come back and gone).
            # The SQS emulator's counts are not to be trusted
            # (local-aws-sqs counts a message whose visibility was changed
            # twice: visible 1 and in flight 1, measured), so there the
            # quiet decides, and check 3 judges what a receive still finds
            # once the workers stop.
            u, q, c = w.unsettled(ids), w.queue_counts(), w.activity()
            now = time.monotonic()
            if c != last:
                last, changed = c, now
            if u == 0 and settled_at is None:
                settled_at = now
            if u == 0 and (q == 0 or a.backend != "embedded") \
                    and (a.backend == "embedded" or now - changed >= QUIET_S):
                drained = max(settled_at, changed if a.backend != "embedded" else 0) - healed
                drained = max(drained, 0.0)
                break
            if a.worker and now - changed >= 2 * LEASE_S + BACKOFF_CAP_S:
                break       # nothing reached the bank for long: what is left will not move
            if not redriven and redrive_due(a.backend, u, q, now - changed):
                w.redrive_after_heal("drained, charges open")
                redriven = True
            w.sample_cmdlines()
            time.sleep(1)
        if drained is None:
            w.snapshot("stuck")
        w.stop_workers()
        outbox_drained = w.outbox.finish() if w.outbox else None
        w.collect()
        w.sample_cmdlines()
        bound, per_cpu = drain_bound(loads)
        facts = {"drained_s": drained, "t0_ms": t0_ms, "healed_ms": healed_ms, "drain_bound_s": bound, "load_per_cpu": per_cpu,
                 "faults": len(ev), "elapsed_s": round(time.monotonic() - t0, 1),
                 "outbox_drained": outbox_drained}
        print("chaos: drain bound %d s (%d s x the load per core while draining, %.2f, "
              "taken as 1 to %d)" % (bound, DRAIN_BOUND_S, per_cpu, DRAIN_LOAD_MAX), flush=True)
        v = checker.check(run, w.secrets, facts)
        rc = 0 if v["ok"] else 1
    except KeyboardInterrupt:
        print("chaos: interrupted", file=sys.stderr)
        rc = 2
    except Exception as e:
        import traceback
        traceback.print_exc()
        print("chaos: harness failure: %s" % e, file=sys.stderr)
        rc = 2
    finally:
        w.down()
    return rc


if __name__ == "__main__":
    sys.exit(main())
