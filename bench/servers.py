"""servers.py: the servers a scenario starts beside bank-sim: the emulators
(dynalite, local-aws-sqs), a throwaway PostgreSQL, redis-server; and the
scenarios that run the worker against the first two."""

import glob
import json
import os
import secrets
import socket
import shutil
import subprocess
import tempfile
import time
from harness import (BIN, INFLIGHT, LAT_INFLIGHT, LAT_J, LAT_MS, QUICK, SRC, cpu_ceiling,
    env_for, free_port, log, proc_cpu_s, worker_run)


# ---- the emulators; the scenarios on them and on PostgreSQL ---------------

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


def sqs_queue_run(n, jobs):
    """The stream scenario on local-aws-sqs (queue and DLQ) with the
    embedded SQLite store: the SQS path the amqp scenario is held against
    (only the queue differs)."""
    if not shutil.which("node") or not os.path.isdir(os.path.join(SRC, "node_modules")):
        raise RuntimeError("needs node and node_modules (npm ci)")
    d = tempfile.mkdtemp(prefix="idemkit-bench-sqsq.", dir=os.environ.get("TMPDIR"))
    p = None
    try:
        p, port = node_server(["tests/sqs-server.js"],
                              lambda t: int(t.split()[0]) if t.strip().split()
                              and t.strip().split()[0].isdigit() and t.endswith("\n") else None,
                              d, "sqs")
        sqs = "http://127.0.0.1:%d" % port
        q = "benchq%d" % os.getpid()
        aws_call(sqs, "CreateQueue", {"QueueName": q + "-dlq"})
        aws_call(sqs, "CreateQueue", {"QueueName": q, "Attributes": {"VisibilityTimeout": "120"}})
        extra = dict(AWS_ENV, AWS_ENDPOINT_URL_SQS=sqs,
                     IDEMKIT_QUEUE="%s/123456789012/%s" % (sqs, q),
                     IDEMKIT_DLQ="%s/123456789012/%s-dlq" % (sqs, q))
        meter = EmulatorMeter([("local-aws-sqs", p)])
        return worker_run("sqs-queue", n, True, jobs, 0, tap=True, inflight=INFLIGHT,
                          env_extra=extra, backend="local-aws-sqs queue, SQLite store",
                          meter=meter)
    finally:
        if p:
            p.terminate()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)


class Rabbit:
    """A throwaway RabbitMQ node as tests/rabbit_helper.bash starts one: its
    own node name, epmd, ports, data and configuration under a temporary
    directory; listener on loopback; the guest user (loopback only)."""
    def __init__(self):
        if not os.path.exists("/usr/lib/rabbitmq/bin/rabbitmq-server"):
            raise RuntimeError("needs rabbitmq-server (Debian: rabbitmq-server)")
        self.d = tempfile.mkdtemp(prefix="idemkit-bench-rabbit.", dir=os.environ.get("TMPDIR"))
        self.port, dist, epmd = free_port(), free_port(), free_port()
        with open(os.path.join(self.d, "plugins"), "w") as f:
            f.write("[].\n")
        with open(os.path.join(self.d, "rabbitmq.conf"), "w") as f:
            f.write("listeners.tcp.1 = 127.0.0.1:%d\nloopback_users.guest = true\n"
                    "log.console = false\n" % self.port)
        env = dict(os.environ, HOME=self.d, RABBITMQ_NODENAME="ikbench%d@localhost" % os.getpid(),
                   RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_NODE_PORT=str(self.port),
                   RABBITMQ_DIST_PORT=str(dist), ERL_EPMD_PORT=str(epmd),
                   ERL_EPMD_ADDRESS="127.0.0.1", RABBITMQ_MNESIA_BASE=self.d + "/mnesia",
                   RABBITMQ_LOG_BASE=self.d + "/log", RABBITMQ_LOGS=self.d + "/log/node.log",
                   RABBITMQ_ENABLED_PLUGINS_FILE=self.d + "/plugins",
                   RABBITMQ_CONFIG_FILE=self.d + "/rabbitmq", RABBITMQ_ENABLED_PLUGINS="",
                   RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none")
        self.epmd = subprocess.Popen(glob.glob("/usr/lib/erlang/erts-*/bin/epmd")[:1] +
                                     ["-port", str(epmd), "-address", "127.0.0.1"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.p = subprocess.Popen(["/usr/lib/rabbitmq/bin/rabbitmq-server"], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        for _ in range(1200):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                return
            except OSError:
                if self.p.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("rabbitmq-server did not start")

    def beam(self):
        """The node's beam process (the start script's child), for its CPU."""
        try:
            with open("/proc/%d/task/%d/children" % (self.p.pid, self.p.pid)) as f:
                return int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            return None

    def stop(self):
        b = self.beam()
        self.p.terminate()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            pass
        if b:
            try:
                os.kill(b, 9)
            except OSError:
                pass
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.epmd.terminate()
        self.epmd.wait()
        shutil.rmtree(self.d, ignore_errors=True)


class _Pid:
    def __init__(self, pid):
        self.pid = pid


def amqp_run(n, jobs):
    """The stream scenario on a RabbitMQ queue (quorum, publisher confirms,
    the holder; idemkit(7) "RabbitMQ") with the embedded SQLite store: held
    against sqs-queue, where only the queue differs."""
    rb = Rabbit()
    try:
        q = "bench%d" % os.getpid()
        extra = {"IDEMKIT_AMQP_PASSWORD": "guest",
                 "IDEMKIT_QUEUE": "amqp://guest@127.0.0.1:%d#%s?visibility=120" % (rb.port, q),
                 "IDEMKIT_DLQ": "amqp://guest@127.0.0.1:%d#%s-dlq" % (rb.port, q)}
        b = rb.beam()
        meter = EmulatorMeter([("rabbitmq", _Pid(b))]) if b else None
        return worker_run("amqp", n, True, jobs, 0, tap=True, inflight=INFLIGHT,
                          env_extra=extra, backend="RabbitMQ queue, SQLite store", meter=meter)
    finally:
        rb.stop()


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


# ---- redis-server ---------------------------------------------------------

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


# ---- a throwaway PostgreSQL -----------------------------------------------

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
