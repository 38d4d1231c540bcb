"""tests/chaos/net.py: the campaign's hosts, as network namespaces.

One bridge made by the harness, one namespace per host joined to it by a
veth pair, one address each in a private /24 (10.213.S.0/24) that exists
only on that bridge: no default route, no forwarding, nothing outside is
ever addressed.  The bridge itself has .1 so the harness (the root
namespace) can reach the hosts.  Partitions are nftables rules inside the
namespaces (dropping, so a peer sees silence, not a refusal); they vanish
with the namespace.  Everything made here is removed by cleanup(), which
the harness calls from its finally and its signal handlers.
"""
import os
import subprocess

IP = "/usr/sbin/ip" if os.path.exists("/usr/sbin/ip") else "ip"
NFT = "/usr/sbin/nft" if os.path.exists("/usr/sbin/nft") else "nft"


def run(*args, check=True, **kw):
    return subprocess.run(list(args), check=check, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, **kw)


def can_run():
    """'' when namespaces can be made here, else why not (exit 77)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, bridge, nftables)"
    for tool in (IP, NFT):
        if subprocess.run(["sh", "-c", "command -v " + tool], stdout=subprocess.DEVNULL).returncode:
            return "needs %s" % tool
    probe = "ikchaosprobe%d" % os.getpid()
    r = subprocess.run([IP, "netns", "add", probe], stderr=subprocess.PIPE, text=True)
    if r.returncode:
        return "cannot make a network namespace: " + r.stderr.strip()
    r = subprocess.run([IP, "netns", "exec", probe, NFT, "add", "table", "inet", "probe"],
                       stderr=subprocess.PIPE, text=True)
    subprocess.run([IP, "netns", "del", probe])
    if r.returncode:
        return "nftables does not work in a namespace: " + r.stderr.strip()
    return ""


def free_subnet():
    """A 10.213.S.0/24 that no interface or route of this machine uses."""
    used = run(IP, "-4", "addr").stdout + run(IP, "-4", "route").stdout
    start = os.getpid() % 250
    for i in range(250):
        s = 1 + (start + i) % 250
        if ("10.213.%d." % s) not in used:
            return s
    raise RuntimeError("no free 10.213.S.0/24")


class Net:
    def __init__(self, hosts):
        """hosts: {name: last octet}."""
        self.s = free_subnet()
        self.tag = "ikc%d" % self.s
        self.br = self.tag + "br"
        self.hosts = dict(hosts)
        self.made = []           # namespaces made, for cleanup
        self.parts = set()       # (a, b): a's packets to b are dropped
        self.extra = {}          # host: service addresses it holds now (a VIP)

    def addr(self, host):
        return "10.213.%d.%d" % (self.s, self.hosts[host])

    def ns(self, host):
        return "%s-%s" % (self.tag, host)

    def up(self):
        run(IP, "link", "add", self.br, "type", "bridge")
        self.made.append(("bridge", self.br))
        run(IP, "addr", "add", "10.213.%d.1/24" % self.s, "dev", self.br)
        run(IP, "link", "set", self.br, "up")
        for h in self.hosts:
            ns = self.ns(h)
            run(IP, "netns", "add", ns)
            self.made.append(("netns", ns))
            v = "%s%s" % (self.tag, h)
            v = v[:13]
            run(IP, "link", "add", v + "h", "type", "veth", "peer", "name", v + "n")
            run(IP, "link", "set", v + "h", "master", self.br)
            run(IP, "link", "set", v + "h", "up")
            run(IP, "link", "set", v + "n", "netns", ns)
            run(IP, "-n", ns, "link", "set", v + "n", "name", "eth0")
            run(IP, "-n", ns, "addr", "add", self.addr(h) + "/24", "dev", "eth0")
            run(IP, "-n", ns, "link", "set", "eth0", "up")
            run(IP, "-n", ns, "link", "set", "lo", "up")
            self.nft(h, "add table inet chaos")
            self.nft(h, "add chain inet chaos out { type filter hook output priority 0 ; }")
            self.nft(h, "add chain inet chaos in { type filter hook input priority 0 ; }")

    def nft(self, host, rule):
        run(IP, "netns", "exec", self.ns(host), NFT, *rule.split())

    def _apply(self, host):
        """Rebuild host's rules from the partitions in force."""
        self.nft(host, "flush chain inet chaos out")
        self.nft(host, "flush chain inet chaos in")
        for a, b in sorted(self.parts):
            for x in ([self.addr(b)] + self.extra.get(b, [])) if a == host else []:
                self.nft(host, "add rule inet chaos out ip daddr %s drop" % x)
            for x in ([self.addr(a)] + self.extra.get(a, [])) if b == host else []:
                self.nft(host, "add rule inet chaos in ip saddr %s drop" % x)

    def partition(self, a, b, both):
        self.parts.add((a, b))
        if both:
            self.parts.add((b, a))
        self._apply(a)
        self._apply(b)

    def heal(self, a=None, b=None):
        touched = set()
        for p in list(self.parts):
            if a is None or set(p) == {a, b}:
                self.parts.discard(p)
                touched.update(p)
        for h in touched:
            self._apply(h)

    def pids(self, host):
        r = run(IP, "netns", "pids", self.ns(host), check=False)
        return [int(x) for x in r.stdout.split()]

    def cleanup(self):
        # Our namespaces' processes are ours: the servers and workers the
        # harness started there (pids by namespace, never by name).
        for kind, name in reversed(self.made):
            if kind == "netns":
                r = run(IP, "netns", "pids", name, check=False)
                for pid in r.stdout.split():
                    try:
                        os.kill(int(pid), 9)
                    except OSError:
                        pass
        for kind, name in reversed(self.made):
            if kind == "netns":
                run(IP, "netns", "del", name, check=False)
            else:
                run(IP, "link", "del", name, check=False)
        self.made = []
