"""tests/chaos/servers.py: the servers of a campaign, each on its own host.

Every server listens on its namespace's address (never 0.0.0.0 of the
machine: a namespace has only its own).  Processes are started with
`ip netns exec NS`, in a session of their own, and tracked by pid; the
harness ends them by pid (and, at the end, every process left in its own
namespaces).  PostgreSQL runs as the `postgres` user (initdb refuses
root), as tests/pg_helper.bash does.
"""
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request

from net import IP

PG_BIN = sorted((d for d in (os.path.join("/usr/lib/postgresql", v, "bin")
                             for v in (os.listdir("/usr/lib/postgresql")
                                       if os.path.isdir("/usr/lib/postgresql") else []))
                 if os.path.exists(os.path.join(d, "initdb"))), key=lambda d: d)
PG_BIN = PG_BIN[-1] if PG_BIN else ""


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    raise RuntimeError("timed out waiting for " + what)


def secret_file(path, value):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")


class Procs:
    """Every long-lived process the harness starts, by pid."""

    def __init__(self, net, run):
        self.net, self.run = net, run
        self.procs = {}
        os.makedirs(os.path.join(run, "logs"), exist_ok=True)

    def log(self, name):
        return os.path.join(self.run, "logs", name + ".log")

    def spawn(self, host, name, argv, env=None, user=None, log=None, cwd=None):
        cmd = [IP, "netns", "exec", self.net.ns(host)]
        if user:
            cmd += ["runuser", "-u", user, "--"]
        out = open(log or self.log(name), "ab")
        p = subprocess.Popen(cmd + list(argv), env=env, stdin=subprocess.DEVNULL,
                             stdout=out, stderr=out, start_new_session=True,
                             cwd=cwd or "/")
        out.close()
        self.procs[name] = p
        return p

    def sh(self, host, argv, user=None, env=None, check=True, timeout=120, input=None):
        cmd = [IP, "netns", "exec", self.net.ns(host)]
        if user:
            cmd += ["runuser", "-u", user, "--"]
        r = subprocess.run(cmd + list(argv), env=env, stdout=subprocess.PIPE, input=input,
                           stderr=subprocess.PIPE, text=True, timeout=timeout, cwd="/")
        if check and r.returncode:
            raise RuntimeError("%s: %s" % (" ".join(argv[:3]), r.stderr.strip()[-400:]))
        return r

    def kill(self, name, sig):
        p = self.procs.get(name)
        if p and p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except OSError:
                pass

    def stop(self, name, sig=signal.SIGTERM, wait=10):
        p = self.procs.get(name)
        if not p:
            return
        if p.poll() is None:
            self.kill(name, sig)
            try:
                p.wait(wait)
            except subprocess.TimeoutExpired:
                self.kill(name, signal.SIGKILL)
                p.wait(5)

    def stop_all(self):
        for name in list(self.procs):
            self.stop(name, wait=3)


# ---- a link to a store or queue server, with faults ------------------

class Link:
    """proxy.py in tcp mode on a server's host, on the server's port + 1,
    and an nftables redirect there that sends the server's port to it only
    while a fault is on: latency, jitter (reordering across connections),
    loss (a chunk held for a retransmission time) and resets on the store
    and queue links, as on the bank's.  Between faults the workers reach
    the server itself, so a server that is down refuses the connection as
    it would (a proxy always in front would accept and then close it,
    which libpq's multi-host failover does not skip: measured).
    Connections made during a fault stay on the proxy (conntrack), with no
    fault once it is healed.  listen is the address the proxy binds
    ("0.0.0.0" where a service address may move to this host)."""

    def __init__(self, procs, host, name, listen, port, upstream, seed):
        self.p, self.host, self.name, self.port = procs, host, name, port
        self.control = os.path.join(procs.run, "logs", name + "-control.json")
        self.chain = "p%d" % port
        self.on = None
        procs.net.nft(host, "add table ip chaoslink")
        procs.net.nft(host, "add chain ip chaoslink %s { type nat hook prerouting priority -100 ; }"
                      % self.chain)
        self.ctl({})
        procs.spawn(host, name, ["python3", os.path.join(os.path.dirname(
            os.path.abspath(__file__)), "proxy.py"), "--mode", "tcp",
            "--listen", "%s:%d" % (listen, port + 1), "--upstream", upstream,
            "--control", self.control, "--log", os.path.join(procs.run, "logs", name + ".req.log"),
            "--seed", str(seed)])
        wait_for(lambda: "listening" in open(procs.log(name)).read(), 20, name)

    def ctl(self, ctl):
        tmp = self.control + ".tmp"
        with open(tmp, "w") as f:
            json.dump(ctl, f)
        os.replace(tmp, self.control)
        on = bool(ctl)
        if on != self.on:
            self.p.net.nft(self.host, "flush chain ip chaoslink %s" % self.chain)
            if on:
                self.p.net.nft(self.host, "add rule ip chaoslink %s tcp dport %d redirect to :%d"
                               % (self.chain, self.port, self.port + 1))
            self.on = on


# ---- the bank and the notification gateway ---------------------------

class Bank:
    """bank-sim (TLS, OAuth2 client credentials) behind proxy.py (http)."""
    PORT_SIM, PORT = 8443, 443

    def __init__(self, procs, host, src, seed, declined):
        self.p, self.host, self.src = procs, host, src
        self.dir = os.path.join(procs.run, "bank")
        os.makedirs(self.dir, exist_ok=True)
        self.addr = procs.net.addr(host)
        self.cert = os.path.join(self.dir, "cert.pem")
        self.key = os.path.join(self.dir, "key.pem")
        self.ledger = os.path.join(self.dir, "ledger.db")
        self.control = os.path.join(self.dir, "proxy-control.json")
        self.secret = "oauth-" + secrets.token_hex(16)
        self.secret_file = os.path.join(self.dir, "client-secret")
        self.seed, self.declined = seed, declined
        self.url = "https://%s:%d" % (self.addr, self.PORT)
        self.sim_url = "https://%s:%d" % (self.addr, self.PORT_SIM)
        self.token = None

    def start(self):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=chaos-bank", "-addext", "subjectAltName=IP:" + self.addr,
                        "-keyout", self.key, "-out", self.cert], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        secret_file(self.secret_file, self.secret)
        self.proxy_ctl({})
        self.start_sim()
        self.p.spawn(self.host, "bank-proxy",
                     ["python3", os.path.join(self.src, "tests/chaos/proxy.py"), "--mode", "http",
                      "--listen", "%s:%d" % (self.addr, self.PORT),
                      "--upstream", "%s:%d" % (self.addr, self.PORT_SIM),
                      "--cert", self.cert, "--key", self.key, "--control", self.control,
                      "--log", os.path.join(self.p.run, "logs", "bank-proxy.req.log"),
                      "--seed", str(self.seed)])
        wait_for(lambda: "listening" in open(self.p.log("bank-proxy")).read(), 20, "bank proxy")

    def start_sim(self):
        self.p.spawn(self.host, "bank-sim",
                     ["bank-sim", "--listen", self.addr, "--port", str(self.PORT_SIM),
                      "--db", self.ledger, "--tls-cert", self.cert, "--tls-key", self.key,
                      "--oauth-client-id", "chaos-worker",
                      "--oauth-client-secret-file", self.secret_file,
                      "--decline", ",".join(self.declined), "--seed", str(self.seed)],
                     env=self.p.env, log=self.p.log("bank-sim"))
        wait_for(self.healthy, 20, "bank-sim")

    def healthy(self):
        try:
            self._req("GET", "/health", auth=False)
            return True
        except Exception:
            return False

    def _ctx(self):
        c = ssl.create_default_context(cafile=self.cert)
        c.check_hostname = False
        return c

    def _req(self, method, path, body=None, auth=True):
        h = {"Content-Type": "application/json"}
        if auth:
            if not self.token:
                import base64
                req = urllib.request.Request(
                    self.sim_url + "/oauth/token", data=b"grant_type=client_credentials",
                    headers={"Authorization": "Basic " + base64.b64encode(
                        ("chaos-worker:" + self.secret).encode()).decode(),
                        "Content-Type": "application/x-www-form-urlencoded"})
                with urllib.request.urlopen(req, context=self._ctx(), timeout=5) as r:
                    self.token = json.load(r)["access_token"]
            h["Authorization"] = "Bearer " + self.token
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.sim_url + path, data=data, headers=h, method=method)
        with urllib.request.urlopen(req, context=self._ctx(), timeout=5) as r:
            return r.read()

    def bank_ctl(self, **kw):
        """POST /control on bank-sim (the harness's own token; fetched again
        when a revokeTokens fault has forgotten it)."""
        for _ in range(3):
            try:
                return self._req("POST", "/control", kw)
            except urllib.error.HTTPError as e:
                if e.code == 401:
                    self.token = None
                    continue
                raise
        raise RuntimeError("bank control refused")

    def proxy_ctl(self, ctl):
        tmp = self.control + ".tmp"
        with open(tmp, "w") as f:
            json.dump(ctl, f)
        os.replace(tmp, self.control)

    def worker_env(self, env):
        env.update({
            "IDEMKIT_BANK_URL": self.url + "/debits",
            "IDEMKIT_NOTIFY_URL": self.url + "/notifications",
            "IDEMKIT_BANK_CACERT": self.cert, "IDEMKIT_NOTIFY_CACERT": self.cert,
            "IDEMKIT_BANK_OAUTH_CLIENT_ID": "chaos-worker",
            "IDEMKIT_BANK_OAUTH_CLIENT_SECRET_FILE": self.secret_file,
            "IDEMKIT_BANK_OAUTH_TOKEN_URL": self.url + "/oauth/token",
            "IDEMKIT_NOTIFY_OAUTH_CLIENT_ID": "chaos-worker",
            "IDEMKIT_NOTIFY_OAUTH_CLIENT_SECRET_FILE": self.secret_file,
            "IDEMKIT_NOTIFY_OAUTH_TOKEN_URL": self.url + "/oauth/token",
        })


# ---- PostgreSQL: a primary and a synchronous streaming replica ---------

class Postgres:
    PORT = 5432

    def __init__(self, procs, primary, replica, sync=True):
        self.p = procs
        self.hosts = [primary, replica]
        self.sync = sync                # False: the replica streams asynchronously
        self.primary = primary          # the host that takes writes now
        self.dirs = {h: os.path.join(procs.run, "pg-" + h) for h in self.hosts}
        self.password = "pg-" + secrets.token_hex(12)
        self.failed_over = False
        self.down = set()

    def pg(self, host, *argv, check=True, input=None):
        return self.p.sh(host, [os.path.join(PG_BIN, argv[0])] + list(argv[1:]),
                         user="postgres", check=check, input=input)

    def sql(self, host, q, db="idemkit"):
        # on stdin, not -c: the role's password is in it, and argv is public
        return self.pg(host, "psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
                       "-h", self.dirs[host], "-p", str(self.PORT), "-U", "postgres",
                       "-d", db, input=q + ";\n").stdout

    def ctl(self, host, *args, check=True):
        return self.pg(host, "pg_ctl", "-D", os.path.join(self.dirs[host], "data"),
                       "-l", os.path.join(self.dirs[host], "server.log"), *args, check=check)

    def start(self):
        a, b = self.hosts
        net = self.p.net
        for h in self.hosts:
            os.makedirs(self.dirs[h], mode=0o700)
            shutil.chown(self.dirs[h], "postgres", "postgres")
        pw = os.path.join(self.dirs[a], "pw")
        secret_file(pw, self.password)
        shutil.chown(pw, "postgres", "postgres")
        self.pg(a, "initdb", "-D", os.path.join(self.dirs[a], "data"), "-U", "postgres",
                "--auth-local=trust", "--auth-host=scram-sha-256", "--pwfile=" + pw, "-E", "UTF8",
                "--no-instructions")
        os.unlink(pw)
        sub = "10.213.%d.0/24" % net.s
        with open(os.path.join(self.dirs[a], "data", "postgresql.conf"), "a") as f:
            f.write("listen_addresses = '%s'\nport = %d\nunix_socket_directories = '%s'\n"
                    "max_connections = 200\nshared_buffers = 32MB\nwal_level = replica\n"
                    "max_wal_senders = 4\nwal_keep_size = 256MB\n"
                    % (net.addr(a), self.PORT, self.dirs[a]))
        with open(os.path.join(self.dirs[a], "data", "pg_hba.conf"), "a") as f:
            f.write("host replication postgres %s trust\nhost all all %s scram-sha-256\n" % (sub, sub))
        self.ctl(a, "-w", "-t", "60", "start")
        self.sql(a, "CREATE ROLE idemkit LOGIN PASSWORD '%s'" % self.password, db="postgres")
        self.sql(a, "CREATE DATABASE idemkit OWNER idemkit", db="postgres")
        # The replica: a base backup streamed from the primary, standing by.
        self.pg(b, "pg_basebackup", "-h", net.addr(a), "-p", str(self.PORT), "-U", "postgres",
                "-D", os.path.join(self.dirs[b], "data"), "-R", "-X", "stream", "-c", "fast")
        with open(os.path.join(self.dirs[b], "data", "postgresql.conf"), "a") as f:
            f.write("listen_addresses = '%s'\nunix_socket_directories = '%s'\n"
                    "synchronous_standby_names = ''\n" % (net.addr(b), self.dirs[b]))
        self.ctl(b, "-w", "-t", "60", "start")
        if not self.sync:
            # --pg-async: what a failover costs without it (docs/RELIABILITY.md)
            wait_for(lambda: "async" in self.sql(a, "SELECT sync_state FROM pg_stat_replication",
                                                  db="postgres"), 30, "the asynchronous replica")
            return
        # Synchronous: a commit returns once the replica has flushed it.
        self.sql(a, "ALTER SYSTEM SET synchronous_standby_names = '*'", db="postgres")
        self.sql(a, "SELECT pg_reload_conf()", db="postgres")
        wait_for(lambda: "sync" in self.sql(a, "SELECT sync_state FROM pg_stat_replication",
                                             db="postgres"), 30, "the synchronous replica")

    def url(self):
        a, b = (self.p.net.addr(h) for h in self.hosts)
        return ("postgres://idemkit:%s@%s:%d,%s:%d/idemkit?target_session_attrs=read-write"
                "&connect_timeout=3" % (self.password, a, self.PORT, b, self.PORT))

    def pid(self, host):
        try:
            with open(os.path.join(self.dirs[host], "data", "postmaster.pid")) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None

    # faults
    def restart(self):
        self.ctl(self.primary, "-m", "fast", "-w", "-t", "60", "restart", check=False)

    def kill9(self):
        pid = self.pid(self.primary)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.down.add(self.primary)

    def resume(self):
        for h in list(self.down):
            self.ctl(h, "-w", "-t", "60", "start", check=False)
            self.down.discard(h)

    def failover(self):
        """kill -9 the primary and promote the replica; the old primary
        stays down (started again it would be a second primary)."""
        if self.failed_over:
            return False
        old = self.primary
        self.kill9()
        self.down.discard(old)
        new = [h for h in self.hosts if h != old][0]
        self.ctl(new, "-w", "-t", "60", "promote", check=False)
        self.primary = new
        self.failed_over = True
        return True

    def stop(self):
        for h in self.hosts:
            if os.path.exists(os.path.join(self.dirs[h], "data", "postmaster.pid")):
                self.ctl(h, "-m", "immediate", "-w", "stop", check=False)
