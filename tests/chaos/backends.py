"""tests/chaos/backends.py: the store and the queue of each backend.

start(world) -> (store, env, secrets): the store object the nemesis acts on
(None where it has no server faults), what the workers' environment needs
to reach the store and queue, and the secrets planted there (check 5).
On rabbitmq it also sets world.broker (Rabbit: the queue-restart,
queue-kill9 faults act on it).
"""
import glob
import json
import os
import secrets
import socket
import subprocess
import time
import urllib.request

import servers

SQS_PORT = 9324
DDB_PORT = 8000


def start(w):
    run = w.run
    if w.backend == "embedded":
        d = os.path.join(run, "shared")
        os.makedirs(d, exist_ok=True)
        q = os.path.join(d, "queue.db")
        return None, {"IDEMKIT_STORE": "sqlite:" + os.path.join(d, "store.db"),
                      "IDEMKIT_QUEUE": "sqlite:%s#charges" % q,
                      "IDEMKIT_DLQ": "sqlite:%s#charges-dlq" % q}, []
    env, sec = rabbit(w) if w.backend == "rabbitmq" else sqs(w)
    if w.backend in ("postgres", "rabbitmq"):
        # rabbitmq's store: PostgreSQL as on the postgres backend (the
        # store proven across worker hosts; the embedded one is a file on
        # one host), without the store's own server faults there
        pg = servers.Postgres(w.procs, "store", "store2", sync=not w.a.pg_async)
        pg.start()
        for h in pg.hosts:
            link(w, "store", h, w.net.addr(h), pg.PORT)
        env["IDEMKIT_STORE"] = pg.url()
        sec.append(("store password", pg.password))
        return pg, env, sec
    if w.backend == "redis":
        rd = Redis(w.procs, "store", "store2")
        rd.start()
        for h in rd.hosts:
            # on every address: the service address moves on failover
            link(w, "store", h, "0.0.0.0", rd.PORT, w.net.addr(h))
        env["IDEMKIT_STORE"] = rd.url()
        sec.append(("store password", rd.password))
        return rd, env, sec
    if w.backend == "dynamodb":
        ddb_local(w)
        link(w, "store", "store", w.net.addr("store"), DDB_PORT)
        env["AWS_ENDPOINT_URL_DYNAMODB"] = "http://%s:%d" % (w.net.addr("store"), DDB_PORT)
        env["IDEMKIT_STORE"] = "dynamodb:chaos"
        return None, env, sec
    raise ValueError(w.backend)


def link(w, kind, host, listen, port, upstream=None):
    """A Link on host in front of the server's port (kind: "store" or
    "queue", as the nemesis names them)."""
    up = "%s:%d" % (upstream or w.net.addr(host), port)
    lk = servers.Link(w.procs, host, "%s-link-%s" % (kind, host), listen, port, up, w.a.seed)
    w.links.setdefault(kind, []).append(lk)


def stop(w):
    if w.store is not None:
        w.store.stop()
    if getattr(w, "broker", None) is not None:
        w.broker.stop()


def sqs(w):
    """local-aws-sqs on the queue host, and a queue and DLQ on it."""
    addr = w.net.addr("queue")
    js = ("const {createSqsServer}=require('local-aws-sqs');"
          "createSqsServer({port:%d,hostname:'%s',emulateQueueCreationLifecycle:false})"
          ".then(()=>console.log('listening'))" % (SQS_PORT, addr))
    w.procs.spawn("queue", "sqs", ["node", "-e", js], env=dict(w.procs.env, NODE_PATH=os.path.join(
        w.a_src, "node_modules")), cwd=w.a_src)
    servers.wait_for(lambda: "listening" in open(w.procs.log("sqs")).read(), 30, "local-aws-sqs")
    base = "http://%s:%d" % (addr, SQS_PORT)
    link(w, "queue", "queue", addr, SQS_PORT)
    urls = {}
    for name in ("charges-dlq", "charges"):
        req = urllib.request.Request(base + "/", data=json.dumps({"QueueName": name}).encode(),
                                     headers={"X-Amz-Target": "AmazonSQS.CreateQueue",
                                              "Content-Type": "application/x-amz-json-1.0"})
        with urllib.request.urlopen(req, timeout=10) as r:
            urls[name] = json.load(r)["QueueUrl"]
    secret = secrets.token_hex(20)
    home = os.path.join(w.run, "home")
    env = {"AWS_ACCESS_KEY_ID": "AKIACHAOSCAMPAIGN", "AWS_SECRET_ACCESS_KEY": secret,
           "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": os.path.join(home, "no-aws-config"),
           "AWS_SHARED_CREDENTIALS_FILE": os.path.join(home, "no-aws-credentials"),
           "AWS_ENDPOINT_URL_SQS": base, "IDEMKIT_AWS_MAX_BACKOFF": "200ms",
           "IDEMKIT_QUEUE": urls["charges"], "IDEMKIT_DLQ": urls["charges-dlq"]}
    return env, [("AWS secret key", secret)]


def rabbit(w):
    """RabbitMQ on the queue host, behind a Link; the queue and its DLQ
    are declared by the first command that uses them (durable quorum
    queues, x-delivery-limit, dead-lettered at least once)."""
    rb = Rabbit(w.procs, "queue")
    rb.start()
    w.broker = rb
    link(w, "queue", "queue", w.net.addr("queue"), rb.PORT)
    base = "amqp://chaos@%s:%d" % (w.net.addr("queue"), rb.PORT)
    return {"IDEMKIT_QUEUE": base + "#charges", "IDEMKIT_DLQ": base + "#charges-dlq",
            "IDEMKIT_AMQP_PASSWORD_FILE": rb.password_file}, [("AMQP password", rb.password)]


class Rabbit:
    """Debian's rabbitmq-server on one host, as tests/rabbit_helper.bash
    starts it: a node of its own (chaos@localhost) with its own epmd on
    the host's loopback, its data, logs and cookie under RUN/rabbit (kept
    across restarts: the quorum queues are durable), no plugins, and a
    user of the campaign's whose password (planted: check 5) the workers
    read from a file.  Its faults: restart (SIGTERM, the node stops
    cleanly, started again when healed), kill -9 (the node's whole
    process group), both down 1-6 s."""
    PORT = 5672
    BIN = "/usr/lib/rabbitmq/bin"

    def __init__(self, procs, host):
        self.p, self.host = procs, host
        self.dir = os.path.join(procs.run, "rabbit")
        self.password = "amqp-" + secrets.token_hex(12)
        self.password_file = os.path.join(self.dir, "amqp-password")
        self.addr = procs.net.addr(host)
        self.down = False

    def env(self):
        d = self.dir
        return dict(self.p.env, HOME=d, RABBITMQ_NODENAME="chaos@localhost",
                    RABBITMQ_NODE_IP_ADDRESS=self.addr, RABBITMQ_NODE_PORT=str(self.PORT),
                    RABBITMQ_DIST_PORT="25672", ERL_EPMD_PORT="4369",
                    ERL_EPMD_ADDRESS="127.0.0.1", RABBITMQ_MNESIA_BASE=d + "/mnesia",
                    RABBITMQ_LOG_BASE=d + "/log", RABBITMQ_ENABLED_PLUGINS_FILE=d + "/plugins",
                    RABBITMQ_CONFIG_FILE=d + "/rabbitmq", RABBITMQ_LOGS=d + "/log/node.log",
                    RABBITMQ_ENABLED_PLUGINS="",
                    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none")

    def start(self):
        if not os.access(os.path.join(self.BIN, "rabbitmq-server"), os.X_OK):
            raise RuntimeError("rabbitmq-server not installed (Debian: rabbitmq-server)")
        os.makedirs(os.path.join(self.dir, "log"), exist_ok=True)
        with open(os.path.join(self.dir, "plugins"), "w") as f:
            f.write("[].\n")
        # the password in the broker's configuration (0600) and in the
        # workers' file, never in an argv or the environment
        servers.secret_file(os.path.join(self.dir, "rabbitmq.conf"), "\n".join([
            "listeners.tcp.1 = %s:%d" % (self.addr, self.PORT), "loopback_users = none",
            "default_user = chaos", "default_pass = " + self.password,
            "log.console = false"]))
        servers.secret_file(self.password_file, self.password)
        epmd = sorted(glob.glob("/usr/lib/erlang/erts-*/bin/epmd"))[-1]
        self.p.spawn(self.host, "rabbit-epmd", [epmd, "-port", "4369", "-address", "127.0.0.1"])
        self.launch()
        self.ready(180)

    def launch(self):
        self.p.spawn(self.host, "rabbit", [os.path.join(self.BIN, "rabbitmq-server")],
                     env=self.env())

    def listening(self):
        try:
            socket.create_connection((self.addr, self.PORT), timeout=1).close()
            return True
        except OSError:
            return False

    def ready(self, timeout):
        # Erlang's start costs some 5 CPU seconds, more on a loaded machine
        end = time.monotonic() + timeout
        while not self.listening():
            p = self.p.procs.get("rabbit")
            if time.monotonic() > end or p is None or p.poll() is not None:
                with open(self.p.log("rabbit"), errors="replace") as f:
                    tail = f.read()[-600:]
                raise RuntimeError("rabbitmq-server did not start: " + tail)
            time.sleep(0.2)

    def up(self):
        """A broker fault lands only on a broker that is up: one still
        starting (20-40 s of Erlang on a loaded machine) is not stopped
        again, or the broker would spend the run starting."""
        if self.down or not self.listening():
            raise RuntimeError("the broker is not up (down or still starting): not landed")

    def restart(self):
        self.up()
        self.p.stop("rabbit", wait=60)
        self.down = True

    def kill9(self):
        self.up()
        self.p.stop("rabbit", sig=9)
        self.down = True

    def resume(self, wait=False):
        """Started again (not waited for by a heal: the nemesis goes on);
        heal_all waits for it to listen."""
        if self.down:
            self.launch()
            self.down = False
        if wait:
            self.ready(180)

    def stop(self):
        self.p.stop("rabbit", wait=30)
        self.p.stop("rabbit-epmd")


def ddb_local(w):
    """AWS's DynamoDB Local (the jar in amplify-dynamodb-simulator) on the
    store host; it listens on every interface, and its namespace has only
    its own address and loopback."""
    d = os.path.join(w.a_src, "node_modules/amplify-dynamodb-simulator/emulator")
    w.procs.spawn("store", "ddb", ["java", "-Xmx256m", "-XX:+UseSerialGC",
                                   "-XX:TieredStopAtLevel=1",
                                   "-Djava.library.path=DynamoDBLocal_lib", "-jar",
                                   "DynamoDBLocal.jar", "-inMemory", "-sharedDb",
                                   "-disableTelemetry", "-port", str(DDB_PORT)],
                  env=w.procs.env, cwd=d)
    url = "http://%s:%d/" % (w.net.addr("store"), DDB_PORT)

    def up():
        try:
            urllib.request.urlopen(url, timeout=2)
        except urllib.error.HTTPError as e:
            return e.code == 400
        except Exception:
            return False
        return True
    servers.wait_for(up, 90, "DynamoDB Local")


class Redis:
    """A primary and a replica, durable (AOF, appendfsync always), behind
    a service address (.6) that moves to the replica when it is promoted,
    as keepalived would move a virtual IP: the workers' URL never changes."""
    PORT = 6379
    VIP = 6

    def __init__(self, procs, primary, replica):
        self.p = procs
        self.hosts = [primary, replica]
        self.primary = primary
        self.password = "redis-" + secrets.token_hex(12)
        self.failed_over = False
        self.down = set()
        net = procs.net
        self.vip = "10.213.%d.%d" % (net.s, self.VIP)

    def dir(self, h):
        return os.path.join(self.p.run, "redis-" + h)

    def launch(self, h):
        conf = os.path.join(self.dir(h), "redis.conf")
        self.p.spawn(h, "redis-" + h, ["redis-server", conf], env=self.p.env)
        servers.wait_for(lambda: self.cli(h, "PING") == "PONG", 20, "redis on " + h)

    def cli(self, h, *args):
        r = self.p.sh(h, ["redis-cli", "-h", self.p.net.addr(h), "-p", str(self.PORT)] + list(args),
                      env=dict(self.p.env, REDISCLI_AUTH=self.password), check=False, timeout=10)
        return r.stdout.strip()

    def start(self):
        net = self.p.net
        a, b = self.hosts
        for h in self.hosts:
            os.makedirs(self.dir(h), exist_ok=True)
            lines = ["bind %s %s" % (net.addr(h), self.vip), "port %d" % self.PORT,
                     "dir %s" % self.dir(h), "appendonly yes", "appendfsync always", "save ''",
                     "requirepass %s" % self.password, "masterauth %s" % self.password,
                     "protected-mode no", "logfile %s" % os.path.join(self.dir(h), "log")]
            if h == b:
                lines.append("replicaof %s %d" % (net.addr(a), self.PORT))
            fd = os.open(os.path.join(self.dir(h), "redis.conf"),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write("\n".join(lines) + "\n")
            # the replica binds the service address before it holds it
            self.p.sh(h, ["sysctl", "-qw", "net.ipv4.ip_nonlocal_bind=1"])
        subprocess.run(["ip", "-n", net.ns(a), "addr", "add", self.vip + "/24", "dev", "eth0"],
                       check=True)
        net.extra[a] = [self.vip]
        for h in self.hosts:
            self.launch(h)

    def url(self):
        return "redis://:%s@%s:%d/0" % (self.password, self.vip, self.PORT)

    def restart(self):
        self.p.stop("redis-" + self.primary)
        self.down.add(self.primary)

    def kill9(self):
        self.p.stop("redis-" + self.primary, sig=9)
        self.down.add(self.primary)

    def resume(self):
        for h in list(self.down):
            self.launch(h)
            self.down.discard(h)

    def failover(self):
        if self.failed_over:
            return False
        net = self.p.net
        old = self.primary
        new = [h for h in self.hosts if h != old][0]
        self.p.stop("redis-" + old, sig=9)
        self.cli(new, "REPLICAOF", "NO", "ONE")
        # its config file too, as Sentinel does: a restart of the new
        # primary must not bring it back a read-only replica of the old
        # one (the 20-minute run did: every claim READONLY after that)
        self.cli(new, "CONFIG", "REWRITE")
        subprocess.run(["ip", "-n", net.ns(old), "addr", "del", self.vip + "/24", "dev", "eth0"])
        subprocess.run(["ip", "-n", net.ns(new), "addr", "add", self.vip + "/24", "dev", "eth0"])
        net.extra = {new: [self.vip]}
        for h in net.hosts:
            subprocess.run(["ip", "-n", net.ns(h), "neigh", "flush", "all"])
            net._apply(h)   # partitions in force follow the service address
        self.primary = new
        self.failed_over = True
        return True

    def stop(self):
        for h in self.hosts:
            self.p.stop("redis-" + h)
