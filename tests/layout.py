#!/usr/bin/env python3
"""tests/layout.py: lib/'s folders depend one way (DESIGN.md "Layout").

  layout.py includes ROOT          every #include "..." of ROOT's lib/, cmd/
                                   and sim/ against ORDER below
  layout.py calls ROOT ARCHIVE     the same rules on who calls whom (nm over
                                   the library's archive), and no two files
                                   of lib/ calling each other, by any circle
  layout.py graph ROOT             the folder graph: each folder, then the
                                   folders its files include

One line per violation, naming the file and the rule; exit 1 if any.

The rules, written once, here:
  - A file of lib/ uses its own folder and the folders on lower lines of
    ORDER; never one on a higher line, nor another on its own line.
  - An adapter's folder (a port's subfolder: store/X/, queue/X/) is used by
    its own files and by the factories (open/), nothing else; an adapter
    uses no port but its own.
  - cmd/ and sim/ talk to ports, factories and what is above them: never
    to an adapter, the AWS client, the clients under the ports or the
    loaders (dl/, conn/).
  - A quoted #include is a path from lib/ (-Ilib is the only include flag);
    sim/ may also include its own headers.  So product code never includes
    the bank simulator's.
  - No two sources of lib/ share a name: the archive keeps a member by its
    name alone.
"""
import collections
import os
import re
import subprocess
import sys

# Lowest first.  A new folder goes on a line here; store/* and queue/* are
# every adapter of that port.
ORDER = [
    "core",
    "dl",
    "conn",
    "aws bank",
    "store queue",
    "store/* queue/*",
    "open",
    "flow",
    "cli",
]
FACTORY = "open"
NOT_FROM_CMD = ("dl", "conn", "aws")

LEVEL = {f: i for i, line in enumerate(ORDER) for f in line.split()}
PORTS = {f[:-2] for f in LEVEL if f.endswith("/*")}
ORDER_TEXT = " < ".join(", ".join(line.split()) for line in ORDER)
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def level(folder):
    """The line of ORDER a folder of lib/ is on, or None."""
    if folder in LEVEL:
        return LEVEL[folder]
    port = folder.split("/")[0]
    return LEVEL.get(port + "/*") if "/" in folder else None


def is_adapter(folder):
    return "/" in folder


def rule(user, used):
    """Why the file at user (a path under ROOT) may not use lib/used (a
    header or source path), or None when it may."""
    g = os.path.dirname(used)
    if user.startswith(("cmd/", "sim/")):
        if is_adapter(g) or g in NOT_FROM_CMD:
            return "a command talks to ports, not to %s/" % g
        return None
    f = os.path.dirname(user)[len("lib/"):]
    if f == g or level(f) is None:   # (a folder on no line is said once)
        return None
    if level(g) is None:
        return "lib/%s/ is on no line of the order in tests/layout.py" % g
    if is_adapter(g) and f != FACTORY:
        return "only %s/ names an adapter (%s/ is one)" % (FACTORY, g)
    if is_adapter(f) and g in PORTS and g != f.split("/")[0]:
        return "the adapter %s/ uses no port but %s/" % (f, f.split("/")[0])
    if level(g) > level(f):
        return "%s may not use %s (order, lowest first: %s)" % (f, g, ORDER_TEXT)
    if level(g) == level(f):
        return "%s may not use %s, on its own line (order, lowest first: %s)" % (f, g, ORDER_TEXT)
    return None


def sources(root):
    out = []
    for top in ("lib", "cmd", "sim"):
        for d, _, files in os.walk(os.path.join(root, top)):
            out += [os.path.relpath(os.path.join(d, n), root) for n in files
                    if n.endswith((".c", ".h"))]
    return sorted(out)


def check_includes(root):
    bad = []
    srcs = sources(root)
    for p in srcs:
        if p.startswith("lib/") and level(os.path.dirname(p)[4:]) is None:
            bad.append("%s: lib/%s/ is on no line of the order in tests/layout.py"
                       % (p, os.path.dirname(p)[4:]))
    by_name = collections.defaultdict(list)
    for p in srcs:
        if p.startswith("lib/") and p.endswith(".c"):
            by_name[os.path.basename(p)].append(p)
    for name, ps in sorted(by_name.items()):
        if len(ps) > 1:
            bad.append("%s share the name %s: the archive keeps one of them"
                       % (" and ".join(ps), name))
    for p in srcs:
        with open(os.path.join(root, p), errors="replace") as f:
            text = f.read()
        for h in INCLUDE.findall(text):
            if not os.path.exists(os.path.join(root, "lib", h)):
                if p.startswith("sim/") and os.path.exists(os.path.join(root, "sim", h)):
                    continue
                bad.append('%s includes "%s": no such file under lib/ (a path from lib/, '
                           'as "core/util.h")' % (p, h))
                continue
            why = rule(p, h)
            if why:
                bad.append("%s includes lib/%s: %s" % (p, h, why))
    return bad


def check_calls(root, archive):
    """nm over the archive: each member's defined and undefined symbols."""
    path = {os.path.basename(p)[:-2] + ".o": p for p in sources(root)
            if p.startswith("lib/") and p.endswith(".c")}
    out = subprocess.run(["nm", "-A", archive], capture_output=True, text=True, check=True).stdout
    defs, undef = {}, collections.defaultdict(set)
    for line in out.splitlines():
        loc, _, rest = line.rpartition(":")
        w = rest.split()
        member = path.get(loc.rpartition(":")[2])
        if not member:
            continue
        if len(w) == 3 and w[1] in "TDBRCGSV":
            defs[w[2]] = member
        elif len(w) == 2 and w[0] in "Uwv":
            undef[member].add(w[1])
    calls = collections.defaultdict(lambda: collections.defaultdict(set))
    for a, syms in undef.items():
        for s in syms:
            b = defs.get(s)
            if b and b != a:
                calls[a][b].add(s)
    bad = []
    for a in sorted(calls):
        for b in sorted(calls[a]):
            why = rule(a, b[len("lib/"):])
            if why:
                bad.append("%s calls %s (%s): %s" % (a, b, ", ".join(sorted(calls[a][b])), why))
    for scc in circles(calls):
        steps = []
        for i, a in enumerate(scc):
            b = scc[(i + 1) % len(scc)]
            steps.append("%s -> %s (%s)" % (a, b, ", ".join(sorted(calls[a][b]))))
        bad.append("%s call each other: %s" % (", ".join(scc), "; ".join(steps)))
    return bad


def circles(calls):
    """Each set of files that call each other, by a circle through all of
    them, in the order of one such circle (Tarjan, then a walk)."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(calls[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(calls):
        if v not in index:
            visit(v)
    out = []
    for comp in comps:
        start = min(comp)
        path, seen = [start], {start}
        while True:
            nxt = [w for w in sorted(calls[path[-1]]) if w in comp]
            w = next((w for w in nxt if w not in seen), None) or start
            if w == start:
                break
            path.append(w)
            seen.add(w)
        out.append(path)
    return sorted(out)


def graph(root):
    uses = collections.defaultdict(set)
    for p in sources(root):
        with open(os.path.join(root, p), errors="replace") as f:
            text = f.read()
        me = os.path.dirname(p)[4:] if p.startswith("lib/") else p.split("/")[0]
        for h in INCLUDE.findall(text):
            if os.path.exists(os.path.join(root, "lib", h)) and os.path.dirname(h) != me:
                uses[me].add(os.path.dirname(h))
    return ["%s: %s" % (f, " ".join(sorted(uses[f]))) for f in
            sorted(uses, key=lambda f: (level(f) if level(f) is not None else 99, f))]


def main(argv):
    if len(argv) == 3 and argv[1] == "includes":
        bad = check_includes(argv[2])
    elif len(argv) == 4 and argv[1] == "calls":
        bad = check_calls(argv[2], argv[3])
    elif len(argv) == 3 and argv[1] == "graph":
        print("\n".join(graph(argv[2])))
        return 0
    else:
        sys.stderr.write("usage: layout.py includes ROOT | calls ROOT ARCHIVE | graph ROOT\n")
        return 64
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
