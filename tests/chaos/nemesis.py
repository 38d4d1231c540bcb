"""tests/chaos/nemesis.py: the faults of a campaign, drawn from its seed.

schedule(seed, duration, backend, hosts) is a pure function: the same seed
gives the same list of faults (time, kind, target, how long, parameters),
so a seed reproduces a run's schedule (the moments a process fault lands
on depend on what the processes are doing then: the schedule is the same,
the interleaving need not be).  Every fault is healed by its own end or,
at the latest, by heal_all() when the run's fault phase ends.
"""
import json
import os
import random
import signal
import threading
import time

STEPS = ("idemp-claim", "charge-debit", "charge-notify", "idemp-done", "sqs-ack", "sqs-recv")

# kind: (weight, backends it applies to or None for all)
KINDS = {
    "partition":     (4, None),
    "link":          (4, None),
    # the same on a worker's links to the store and to the queue (tcp)
    "store-link":    (2, ("postgres", "redis", "dynamodb", "rabbitmq")),
    "queue-link":    (2, ("postgres", "redis", "dynamodb", "rabbitmq")),
    "bank-errors":   (3, None),
    "bank-slow":     (1, None),
    "bank-401":      (1, None),
    "token-down":    (1, None),
    "notify-fail":   (2, None),
    # the gateway misconfigured for a while (a deploy with a wrong API key
    # or a changed schema): 401/403/400, CONFIG to charge-notify
    "notify-config": (2, None),
    # the bank's idempotency layer answering 409 "a request with this key
    # is in progress" for a while (its key-lock store slow or failing over)
    "bank-conflict": (2, None),
    # answers from the bank's legacy core system: a 2xx's ref carries the
    # branch's name in ISO-8859-1 (proxy.py, legacy_ref)
    "bank-legacy":   (2, None),
    "bank-restart":  (1, None),
    "stop-step":     (2, None),
    "kill-step":     (2, None),
    "term-worker":   (3, None),     # every deploy and systemd stop signals the group
    "kill-worker":   (2, None),
    "clock":         (4, ("postgres", "redis", "dynamodb", "rabbitmq")),   # NTP is not a given
    "store-restart": (1, ("postgres", "redis")),
    "store-kill9":   (1, ("postgres", "redis")),
    "failover":      (1, ("postgres", "redis")),
    "kill-relay":    (2, None),     # the outbox relay killed -9 (--outbox only)
    # the broker (RabbitMQ): stopped cleanly or killed -9, started again
    # on the same data; every worker host cut from it at once
    "queue-restart": (1, ("rabbitmq",)),
    "queue-kill9":   (1, ("rabbitmq",)),
    "queue-partition": (2, ("rabbitmq",)),
}


def schedule(seed, duration, backend, hosts, workers, lease_s, only=None, outbox=False):
    """hosts: every host name; workers: the worker hosts."""
    rng = random.Random("nemesis-%d" % seed)
    kinds = [k for k, (w, b) in KINDS.items() if (b is None or backend in b)
             and (only is None or k in only) and (outbox or k != "kill-relay")]
    weights = [KINDS[k][0] for k in kinds]
    ev, t, failover = [], 2.0, False
    end = duration - 5
    while kinds:
        t += rng.expovariate(1 / 3.5)
        if t >= end:
            break
        k = rng.choices(kinds, weights)[0]
        e = {"t": round(t, 2), "kind": k}
        d = rng.uniform(3, 15)
        if k == "partition":
            # a worker cut from a server, or the store from its replica
            servers = [h for h in hosts if h not in workers]
            if "store2" in hosts and rng.random() < 0.2:
                a, b = "store", "store2"
            else:
                a, b = rng.choice(workers), rng.choice(servers)
            if rng.random() < 0.5:
                a, b = b, a
            e.update(a=a, b=b, both=rng.random() < 0.5)
        elif k == "link":
            e["ctl"] = {f: round(rng.uniform(*r), 3) for f, r in {
                "latency_ms": (0, 300), "jitter_ms": (0, 400), "loss": (0, 0.2),
                "reorder": (0, 0.3), "dup": (0, 0.3), "reset_mid_body": (0, 0.3),
                "truncate": (0, 0.3), "huge": (0, 0.3)}.items() if rng.random() < 0.6}
        elif k in ("store-link", "queue-link"):
            e["ctl"] = {f: round(rng.uniform(*r), 3) for f, r in {
                "latency_ms": (0, 300), "jitter_ms": (0, 400), "loss": (0, 0.2),
                "reset": (0, 0.3)}.items() if rng.random() < 0.6} or {"latency_ms": 100.0}
        elif k == "bank-errors":
            # a flaky bank answers a mix: the status changes every second
            e["statuses"] = rng.sample([500, 502, 503, 504, 429, 409, 408], rng.randint(1, 4))
            e["rate"] = round(rng.uniform(0.2, 0.9), 2)
        elif k == "bank-slow":
            e["latency_ms"] = rng.choice([1500, 2500, 4000])
        elif k == "notify-fail":
            e["rate"] = round(rng.uniform(0.3, 1.0), 2)
            e["status"] = rng.choice([500, 503, 429])
        elif k == "notify-config":
            e["rate"] = round(rng.uniform(0.5, 1.0), 2)
            e["status"] = rng.choice([401, 403, 400])
        elif k == "bank-conflict":
            e["rate"] = round(rng.uniform(0.3, 0.9), 2)
        elif k == "bank-legacy":
            e["rate"] = round(rng.uniform(0.3, 1.0), 2)
        elif k in ("stop-step",):
            e["host"] = rng.choice(workers)
            e["step"] = rng.choice(STEPS)
            d = lease_s + rng.uniform(1, 6)
        elif k in ("kill-step", "term-worker", "kill-worker"):
            e["host"] = rng.choice(workers)
            e["step"] = rng.choice(STEPS)
            d = 0
        elif k == "clock":
            e["host"] = rng.choice(workers)
            lim = 2 if backend == "dynamodb" else 60
            e["skew_s"] = round(rng.uniform(-lim, lim), 1)
            e["jump"] = rng.random() < 0.5
        elif k == "bank-restart":
            e["kill9"] = rng.random() < 0.5
            d = rng.uniform(1, 5)
        elif k in ("store-restart", "store-kill9", "queue-restart", "queue-kill9"):
            d = rng.uniform(1, 6)
        elif k == "queue-partition":
            e["both"] = rng.random() < 0.5
        elif k == "failover":
            if failover:
                continue
            failover = True
            d = 0
        e["d"] = round(min(d, max(0.0, end - t)), 2)
        ev.append(e)
    return ev


def statuses(e):
    """A bank-errors fault's statuses: a schedule kept before the mix
    (tests/chaos/schedules/dynamodb-seed5-stuck.json) names one "status"."""
    return e.get("statuses") or [e["status"]]


def proc_stat(pid):
    """A process's command name and process group from /proc/PID/stat
    (the name may hold spaces and parentheses: cut at the last ')'), or
    (None, None) once it is gone."""
    try:
        with open("/proc/%s/stat" % pid) as f:
            st = f.read()
        return st[st.index("(") + 1:st.rindex(")")], int(st[st.rindex(")") + 2:].split()[2])
    except (OSError, ValueError, IndexError):
        return None, None


class Nemesis:
    """Applies a schedule against the world (chaos.World) in a thread."""

    def __init__(self, world, events, log_path):
        self.w = world
        self.events = events
        self.log = open(log_path, "a", buffering=1)
        self.active = []        # (heal_at_monotonic, event)
        self.stopped = []       # pids SIGSTOPped
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.t0 = None

    def note(self, e, action, **kw):
        r = dict(e)
        r.update(action=action, ts=int(time.time() * 1000), **kw)
        self.log.write(json.dumps(r) + "\n")

    def run(self):
        self.t0 = time.monotonic()
        pending = list(self.events)
        while not self.halt.is_set():
            now = time.monotonic() - self.t0
            while pending and pending[0]["t"] <= now:
                e = pending.pop(0)
                try:
                    detail = self.apply(e)
                    self.note(e, "start", detail=detail)
                    if e["d"] > 0:
                        self.active.append((self.t0 + e["t"] + e["d"], e))
                    else:
                        self.note(e, "healed")
                except Exception as x:   # a fault that could not land is logged, not fatal
                    self.note(e, "failed", error=str(x)[:300])
            for item in list(self.active):
                if item[0] <= time.monotonic():
                    self.active.remove(item)
                    self.heal(item[1])
                elif item[1]["kind"] == "bank-errors":
                    e = item[1]
                    n = int(time.monotonic() - self.t0 - e["t"])
                    if n != e["tick"]:
                        e["tick"] = n
                        try:
                            w = statuses(e)
                            self.w.bank.bank_ctl(errorStatus=w[n % len(w)])
                        except Exception:
                            pass
            self.halt.wait(0.1)

    # ---- faults ------------------------------------------------------
    def step_pids(self, host, step):
        """Pids of STEP processes under the workers of HOST (by process
        group: each worker is a session of its own)."""
        pg = set(self.w.worker_pgids(host))
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            comm, pgid = proc_stat(d)
            if comm is None:
                continue
            if pgid in pg and (step is None or comm == step[:15]):
                out.append(int(d))
        return out

    def consumer_pids(self, host):
        """The processes of HOST's workers, the shell that leads each group
        left out where it has children (stopping or killing /bin/sh -c
        would leave the consumer it started running)."""
        pids = self.step_pids(host, None)
        lead = set(self.w.worker_pgids(host))
        return [p for p in pids if p not in lead] or pids

    def slot_of(self, pid):
        """The worker slot ("w1.0": its log is logs/worker-w1.0.log) and the
        command name of a process of it, logged with a process fault so
        the checker can tell which worker's charges it could hold up."""
        comm, pgid = proc_stat(pid)
        if comm is None:
            return None, None
        for n, p in list(self.w.procs.procs.items()):
            if n.startswith("worker-") and p.pid == pgid:
                return n[len("worker-"):].split("#")[0], comm
        return None, comm

    def apply(self, e):
        k, w = e["kind"], self.w
        if k == "partition":
            w.net.partition(e["a"], e["b"], e["both"])
        elif k == "link":
            w.bank.proxy_ctl(e["ctl"])
        elif k in ("store-link", "queue-link"):
            links = w.links.get(k.split("-")[0], [])
            if not links:
                return "no link"
            for lk in links:
                lk.ctl(e["ctl"])
        elif k == "bank-errors":
            w.bank.bank_ctl(errorRate=e["rate"], errorStatus=statuses(e)[0])
            e["tick"] = 0
        elif k == "bank-slow":
            w.bank.bank_ctl(latencyMs=e["latency_ms"])
        elif k == "bank-401":
            # bank-sim's own oauthReject would lock the harness out of
            # /control too: the storm is the proxy's, the revocation the bank's
            w.bank.bank_ctl(revokeTokens=True)
            w.bank.proxy_ctl({"unauthorized": True})
        elif k == "token-down":
            w.bank.bank_ctl(revokeTokens=True)
            w.bank.proxy_ctl({"token_down": True})
        elif k in ("notify-fail", "notify-config"):
            w.bank.bank_ctl(notifyFailRate=e["rate"], notifyFailStatus=e["status"])
        elif k == "bank-conflict":
            w.bank.bank_ctl(errorRate=e["rate"], errorStatus=409)
        elif k == "bank-legacy":
            w.bank.proxy_ctl({"legacy_ref": e["rate"]})
        elif k == "bank-restart":
            w.procs.stop("bank-sim", signal.SIGKILL if e["kill9"] else signal.SIGTERM)
        elif k == "stop-step":
            pids = self.step_pids(e["host"], e["step"]) or self.consumer_pids(e["host"])
            if not pids:
                return "no process"
            pid = random.Random(e["t"]).choice(pids)
            e["slot"], e["comm"] = self.slot_of(pid)
            os.kill(pid, signal.SIGSTOP)
            self.stopped.append(pid)
            e["pid"] = pid
            return "pid %d" % pid
        elif k == "kill-step":
            # another consumer (--worker) has no idemkit steps: any of its
            # processes, the consumer itself included
            pids = self.step_pids(e["host"], e["step"]) or \
                (self.consumer_pids(e["host"]) if w.a.worker else [])
            if not pids:
                return "no process"
            pid = random.Random(e["t"]).choice(pids)
            e["slot"], e["comm"] = self.slot_of(pid)
            os.kill(pid, signal.SIGKILL)
            return "pid %d" % pid
        elif k in ("term-worker", "kill-worker"):
            pg = w.worker_pgids(e["host"])
            if not pg:
                return "no worker"
            g = random.Random(e["t"]).choice(pg)
            e["slot"] = self.slot_of(g)[0]
            os.killpg(g, signal.SIGTERM if k == "term-worker" else signal.SIGKILL)
            return "pgid %d" % g
        elif k == "clock":
            w.set_clock(e["host"], e["skew_s"])
        elif k == "kill-relay":
            return w.outbox.kill_relay()
        elif k == "store-restart":
            w.store.restart()
        elif k == "store-kill9":
            w.store.kill9()
        elif k == "failover":
            return "promoted" if w.store.failover() else "already failed over"
        elif k == "queue-restart":
            w.broker.restart()
        elif k == "queue-kill9":
            w.broker.kill9()
        elif k == "queue-partition":
            for h in w.workers:
                w.net.partition(h, "queue", e["both"])
        return ""

    def heal(self, e):
        k, w = e["kind"], self.w
        try:
            if k == "partition":
                w.net.heal(e["a"], e["b"])
            elif k in ("link", "token-down", "bank-401", "bank-legacy"):
                w.bank.proxy_ctl({})
            elif k in ("store-link", "queue-link"):
                for lk in w.links.get(k.split("-")[0], []):
                    lk.ctl({})
            elif k in ("bank-errors", "bank-conflict"):
                w.bank.bank_ctl(errorRate=0)
            elif k == "bank-slow":
                w.bank.bank_ctl(latencyMs=0)
            elif k in ("notify-fail", "notify-config"):
                w.bank.bank_ctl(notifyFailRate=0)
            elif k == "bank-restart":
                w.bank.start_sim()
            elif k == "stop-step":
                pid = e.get("pid")
                if pid:
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except OSError:
                        pass
            elif k == "clock":
                w.set_clock(e["host"], 0)
            elif k in ("store-restart", "store-kill9"):
                w.store.resume()
            elif k in ("queue-restart", "queue-kill9"):
                w.broker.resume()
            elif k == "queue-partition":
                for h in w.workers:
                    w.net.heal(h, "queue")
            self.note(e, "healed")
        except Exception as x:
            self.note(e, "heal-failed", error=str(x)[:300])

    def heal_all(self):
        """The end of the fault phase: everything back, whatever was due."""
        self.halt.set()
        for _, e in list(self.active):
            self.heal(e)
        self.active = []
        for pid in self.stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        w = self.w
        w.net.heal()
        w.bank.proxy_ctl({})
        for links in w.links.values():
            for lk in links:
                lk.ctl({})
        if w.procs.procs.get("bank-sim") is None or w.procs.procs["bank-sim"].poll() is not None:
            w.bank.start_sim()
        w.bank.bank_ctl(errorRate=0, latencyMs=0, notifyFailRate=0)
        for h in w.workers:
            w.set_clock(h, 0)
        if w.store is not None:
            w.store.resume()
        if w.broker is not None:
            w.broker.resume(wait=True)
        self.log.write(json.dumps({"kind": "heal-all", "action": "healed",
                                   "ts": int(time.time() * 1000)}) + "\n")
