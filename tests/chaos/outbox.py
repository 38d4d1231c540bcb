"""tests/chaos/outbox.py: the transactional outbox under the campaign
(issue 27: "every finished charge has exactly one event applied
downstream").

With --outbox the workers run with IDEMKIT_OUTBOX set, so each finish
(and each re-notification) writes its event in the same atomic write;
the relay (idemp-outbox --follow) publishes them to the outbox queue from
a worker host and is killed -9 now and then (the nemesis kind
kill-relay), relaunched like a supervised service; the example consumer
(examples/outbox-consumer.sh --follow) applies each event once under
idemp-run in its own store, and its COMMAND appends the event to
RUN/outbox/applied.ndjson: what the downstream system did.  After the
workers stop, the relay and the consumer run once more until nothing is
left.  checker.py judges applied.ndjson against the records whatever
store wrote them: it needs only the applied events and the records'
histories.
"""
import json
import os
import signal
import threading
import time


# A relay killed -9 keeps its lease until it runs out: a short one, so its
# successor takes over within seconds (the default is 30 s).
RELAY_LEASE = ["--lease", "5s"]


class Outbox:
    def __init__(self, world):
        self.w = world
        self.dir = os.path.join(world.run, "outbox")
        os.makedirs(self.dir, exist_ok=True)
        self.applied = os.path.join(self.dir, "applied.ndjson")
        self.host = world.workers[0]
        self.n = 0
        self.threads = []

    def env(self):
        """What the workers (and the relay) get: the outbox queue, an
        SQLite queue every host reaches on the shared filesystem: beside
        the store's on the embedded default; elsewhere in RUN/outbox (the
        relay then reads the store across the hosts' links: on DynamoDB
        Local the table's stream, on the others the store's own log)."""
        d = os.path.join(self.w.run, "shared") if self.w.backend == "embedded" else self.dir
        return {"IDEMKIT_OUTBOX": "sqlite:%s#charge-events" % os.path.join(d, "events.db")}

    def _env(self):
        env = self.w.host_env(self.host)
        env["CONSUMER_STORE"] = "sqlite:" + os.path.join(self.dir, "consumer.db")
        return env

    def _supervise(self, name, argv):
        k = 0
        while not self.w.stopping.is_set():
            k += 1
            p = self.w.procs.spawn(self.host, "%s#%d" % (name, k), argv, env=self._env(),
                                   log=self.w.procs.log(name))
            while p.poll() is None and not self.w.stopping.is_set():
                time.sleep(0.2)
            self.w.procs.procs.pop("%s#%d" % (name, k), None)
            self.w.stopping.wait(0.5)

    def consumer_argv(self, follow):
        return ["sh", os.path.join(self.w.a_src, "examples", "outbox-consumer.sh")] + \
            (["--follow"] if follow else []) + \
            ["--", "sh", "-c", 'cat >> "$0"', self.applied]

    def start(self):
        for name, argv in (("outbox-relay", ["idemp-outbox", "--follow"] + RELAY_LEASE),
                           ("outbox-consumer", self.consumer_argv(True))):
            t = threading.Thread(target=self._supervise, args=(name, argv), daemon=True)
            t.start()
            self.threads.append(t)

    def relay_pids(self):
        return [p.pid for n, p in list(self.w.procs.procs.items())
                if n.startswith("outbox-relay#") and p.poll() is None]

    def kill_relay(self):
        pids = self.relay_pids()
        for pid in pids:
            os.killpg(pid, signal.SIGKILL)
        return "pgid %s" % ",".join(map(str, pids)) if pids else "no relay"

    def finish(self):
        """After the workers stopped: the running relay and consumer
        stopped, then each run once more until nothing is left (bounded)."""
        for n in [n for n in self.w.procs.procs if n.startswith("outbox-")]:
            self.w.procs.stop(n, wait=15)
        env = self._env()
        for _ in range(30):
            self.w.procs.sh(self.host, ["idemp-outbox", "--once"] + RELAY_LEASE, env=env,
                            check=False, timeout=120)
            self.w.procs.sh(self.host, self.consumer_argv(False), env=env, check=False,
                            timeout=300)
            st = self.w.procs.sh(self.host, ["idemp-outbox", "--stats"], env=env, check=False,
                                 timeout=30)
            q = self.w.procs.sh(self.host, ["sqs-stat", "--queue", env["IDEMKIT_OUTBOX"]],
                                env=env, check=False, timeout=30)
            try:
                q = json.loads(q.stdout)
                if json.loads(st.stdout)["waiting"] == 0 and \
                        q["visible"] + q["inflight"] + q["delayed"] == 0:
                    return True
            except (ValueError, KeyError):
                pass
            time.sleep(2)      # a killed relay's lease running out
        return False
