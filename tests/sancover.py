#!/usr/bin/env python3
"""tests/sancover.py: which suites make sanitize runs (make san-cover).

The sanitizer pass used to run the whole suite again on the ASan + UBSan
build: twice the CI time for little more than what the plain pass already
ran.  What the sanitizer adds is a check of the C code the tests execute,
so its pass runs the fewest tests that still execute every line of our C
(lib/, cmd/, sim/) that the whole suite executes: a greedy set cover of
those lines, each test weighed by its time (the test adding the most lines
per second first), computed from a committed coverage list
(tests/san-cover.txt) that `make san-cover` regenerates from a --coverage
build.  The unit is the test, not the file: a file's tests share a few
lines each that no other test runs, so a cover of files took 58 of 73
(85 % of the suite's CPU), every test of them on the sanitizer build.
A run (a file, with its variables) is sanitized when the cover takes any
of its units: what its setup_file starts (servers, whose lines are the
run's own unit) runs on the ASan build, and so does each test the cover
took or the list has not seen; its other tests go plain (tests/helper.bash
switches their IDEMKIT_BIN, by the list `select` writes).

  sancover.py collect GCOVDIR RUNS OUT
                                      (run.sh's IDEMKIT_TEST_GCOV=GCOVDIR
                                       after a run on the --coverage build;
                                       a run in the file RUNS that left no
                                       data is noted as covering nothing)
  sancover.py select LIST RUNS [PLAIN]
                                      prints the runs to sanitize: those
                                       the cover takes a unit of, plus any
                                       run in the file RUNS (make check's)
                                       the list has not seen; PLAIN gets the
                                       tests of those runs the cover left
                                       out ("RUN<TAB>NAME" lines, NAME the
                                       test's function name as bats encodes
                                       it), which run on the plain build
  sancover.py add GCOVDIR LIST         adds to LIST the runs measured in
                                       GCOVDIR (make san-cover-add: a few
                                       runs on the --coverage build, for C
                                       sources new since LIST was made):
                                       their lines in the new sources, as
                                       sets of their own; the new sources
                                       noted.  Their lines in older sources
                                       are not (LIST has no line numbers to
                                       match them with): such a run is in
                                       the cover when it alone reaches a new
                                       source's lines, and a run the list
                                       has not seen is still given in full
  sancover.py check LIST RUNS         exits 1 (saying why) when LIST is
                                       stale: a run or a test the cover
                                       takes gone, or a C source file added
                                       or gone, since it was made (a run or
                                       a test added is named or not: either
                                       is sanitized; a test renamed is one
                                       added: a name in LIST is edited with
                                       the next command's)
  sancover.py encode NAME              prints a test's name as bats encodes
                                       it (LIST's and PLAIN's NAME)

The list: "source FILE" for every C source (so a new file is noticed),
"run ID SECONDS RUN" for every run (the unit ID: what its file-level
processes ran; SECONDS its whole time, which orders a fresh clone's runs),
"test ID RUNID MS NAME" for each test of it (its own processes, MS its
time), and "lines COUNT ID,ID,..." for each set of units that execute the
same lines (COUNT of them): enough for the cover without keeping line
numbers, which every edit moves.  A run with no test lines (an older list,
a run measured without them) is one unit of its whole time, all or none.
On disk a run's gcov data is DIR/N (its file level) and DIR/N/t/NAME (each
test's: tests/helper.bash sets GCOV_PREFIX so), its TAP output with bats'
--timing in DIR/N/out.  An edit inside
a file leaves the list valid; a new file or a new run makes it stale (the
test in tests/ci.bats), and `make san-cover` (as long as make test) renews it.
"""
import glob
import json
import multiprocessing
import os
import re
import subprocess
import sys

SRC_DIRS = ("lib", "cmd", "sim")


def sources(root):
    out = []
    for d in SRC_DIRS:
        out += sorted(os.path.relpath(p, root)
                      for p in glob.glob(os.path.join(root, d, "**", "*.c"), recursive=True))
    return out


def ours(path):
    return path.split("/", 1)[0] in SRC_DIRS and path.endswith((".c", ".h"))


def run_lines(rundir, objroot, skip=None):
    """The lines of our C that one run (or one test) executed (file:line),
    without what is under the directory skip."""
    gcdas = []
    for dirpath, dirs, files in os.walk(rundir):
        if skip and dirpath == rundir.rstrip("/"):
            dirs[:] = [d for d in dirs if d != skip]
        for f in files:
            if f.endswith(".gcda") and "/obj/" in dirpath + "/":
                gcdas.append(os.path.join(dirpath, f))
    # gcov wants each .gcno beside its .gcda: link the build's in.
    prefix_len = len(rundir.rstrip("/"))
    for g in gcdas:
        built = g[prefix_len:][:-5] + ".gcno"
        link = g[:-5] + ".gcno"
        if os.path.exists(built) and not os.path.exists(link):
            os.symlink(built, link)
    covered = set()
    # a bounded batch per gcov call (argument lists have limits)
    for i in range(0, len(gcdas), 50):
        p = subprocess.run(["gcov", "-t", "-j"] + gcdas[i:i + 50], cwd=objroot,
                           capture_output=True, text=True, check=False)
        for doc in p.stdout.splitlines():
            doc = doc.strip()
            if not doc.startswith("{"):
                continue
            for f in json.loads(doc).get("files", []):
                name = os.path.normpath(f["file"])
                if not ours(name):
                    continue
                for ln in f["lines"]:
                    if ln["count"] > 0:
                        covered.add("%s:%d" % (name, ln["line_number"]))
    return covered


TIMING = re.compile(r"^(?:not )?ok (\d+) .* in (\d+)ms$")


def measured(rundir, objroot):
    """One run's data: (its run, its seconds, its file-level lines, its
    tests as [(name, ms, lines)]; none when it was measured whole)."""
    with open(os.path.join(rundir, "run")) as f:
        run = f.read().strip()
    secs = 1
    if os.path.exists(os.path.join(rundir, "time")):
        with open(os.path.join(rundir, "time")) as f:
            secs = max(1, int(f.read().strip() or 1))
    ms = {}
    if os.path.exists(os.path.join(rundir, "out")):
        with open(os.path.join(rundir, "out"), errors="replace") as f:
            for line in f:
                m = TIMING.match(line.rstrip("\n"))
                if m:
                    ms[int(m.group(1))] = int(m.group(2))
    tests = []
    tdir = os.path.join(rundir, "t")
    for name in sorted(os.listdir(tdir)) if os.path.isdir(tdir) else []:
        num = 0
        if os.path.exists(os.path.join(tdir, name, "number")):
            with open(os.path.join(tdir, name, "number")) as f:
                num = int(f.read().strip() or 0)
        tests.append((name, max(1, ms.get(num, 1000)), run_lines(os.path.join(tdir, name), objroot)))
    return run, secs, run_lines(rundir, objroot, skip="t"), tests


def rundirs(gcovdir):
    return sorted(glob.glob(os.path.join(gcovdir, "*")), key=lambda p: int(os.path.basename(p)))


def signatures(by_line):
    sig = {}
    for ids in by_line.values():
        k = ",".join(map(str, ids))
        sig[k] = sig.get(k, 0) + 1
    return ["lines %d %s" % (sig[k], k) for k in sorted(sig, key=lambda k: (-sig[k], k))]


def collect(gcovdir, runs_file, out):
    root = os.getcwd()
    # (gcov for each test of ~70 runs: a process per core)
    with multiprocessing.Pool() as pool:
        runs = pool.starmap(measured, [(os.path.abspath(d), root) for d in rundirs(gcovdir)])
    seen = {r[0] for r in runs}
    runs += [(r, 1, set(), []) for r in read_runs(runs_file) if r not in seen]
    runs.sort(key=lambda r: r[0])
    units, by_line, ntests = [], {}, 0
    for run, secs, lines, tests in runs:
        rid = len(units)
        units.append("run %d %d %s" % (rid, secs, run))
        for ln in lines:
            by_line.setdefault(ln, []).append(rid)
        for name, ms, tlines in tests:
            tid = len(units)
            units.append("test %d %d %d %s" % (tid, rid, ms, name))
            ntests += 1
            for ln in tlines:
                by_line.setdefault(ln, []).append(tid)
    for ids in by_line.values():
        ids.sort()
    with open(out, "w") as f:
        f.write("# tests/san-cover.txt: made by `make san-cover` (tests/sancover.py), do not edit.\n")
        f.write("# %d lines of our C executed by the suite, %d runs, %d tests\n" % (len(by_line), len(runs), ntests))
        for s in sources(root):
            f.write("source %s\n" % s)
        for u in units:
            f.write(u + "\n")
        for ln in signatures(by_line):
            f.write(ln + "\n")
    print("sancover: %d lines, %d runs, %d tests -> %s" % (len(by_line), len(runs), ntests, out))


def add(gcovdir, path):
    """Appends the runs measured in gcovdir to the list at path: their
    lines in the C sources the list has not seen, and those sources.  A
    run the list has already keeps its unit: those lines are added to it
    (and to its tests), the rest of it stays as measured before."""
    root = os.getcwd()
    srcs, units, _ = load(path)
    known_src = set(srcs)
    known_run = {u["run"] for u in units.values() if u["kind"] == "run"}
    new_src = [x for x in sources(root) if x not in known_src]
    nxt = max(units) + 1 if units else 0
    added, by_line, nruns = [], {}, 0
    for d in rundirs(gcovdir):
        run, secs, lines, tests = measured(os.path.abspath(d), root)
        if run in known_run:
            # a run the list has: its lines in the new sources are its
            # own (and its tests'), the rest of it as the list has it
            rid = next(i for i, u in units.items() if u["kind"] == "run" and u["run"] == run)
        else:
            rid = nxt
            added.append("run %d %d %s" % (rid, secs, run))
            nxt += 1
            nruns += 1
        known_test = {u["name"]: i for i, u in units.items() if u["kind"] == "test" and u["rid"] == rid}
        for unit, ls in [(rid, lines)] + [(None, t) for t in tests]:
            if unit is None:
                name, ms, ls = ls
                unit = known_test.get(name)
            if unit is None:
                unit = nxt
                added.append("test %d %d %d %s" % (unit, rid, ms, name))
                nxt += 1
            for ln in ls:
                if ln.split(":", 1)[0] in new_src:
                    by_line.setdefault(ln, []).append(unit)
    with open(path) as f:
        lines = f.read().splitlines()
    head = [ln for ln in lines if ln.startswith("#")]
    body = [ln for ln in lines if not ln.startswith("#")]
    srcl = [ln for ln in body if ln.startswith("source ")] + ["source %s" % x for x in new_src]
    unitl = [ln for ln in body if ln.startswith(("run ", "test "))] + added
    setl = [ln for ln in body if ln.startswith("lines ")] + signatures(by_line)
    head.append("# added (sancover.py add): %d runs, %d lines in %d new sources" %
                (nruns, len(by_line), len(new_src)))
    with open(path, "w") as f:
        f.write("\n".join(head + sorted(srcl, key=lambda x: x.split(" ", 1)[1]) + unitl + setl) + "\n")
    print("sancover: %d runs added, %d lines in %d new sources -> %s" %
          (nruns, len(by_line), len(new_src), path))
    return 0


def load(path):
    """The list: its sources, its units {id: {kind, run, secs, name}}
    (a test's "run" is its run's string, "rid" its run's unit), and its
    sets of lines [(count, [unit ids])].  A unit's "secs" is what the
    cover weighs: a test's time; a run's file level 1 s when its tests are
    units of their own, else the whole run's time."""
    srcs, units, sets = [], {}, []
    with open(path) as f:
        for line in f:
            w = line.rstrip("\n").split(" ")
            if w[0] == "source":
                srcs.append(w[1])
            elif w[0] == "run":
                units[int(w[1])] = {"kind": "run", "secs": int(w[2]), "whole": int(w[2]),
                                    "run": " ".join(w[3:]), "rid": int(w[1])}
            elif w[0] == "test":
                rid = int(w[2])
                if rid not in units:   # its run's line gone: a test of no run
                    continue
                units[int(w[1])] = {"kind": "test", "rid": rid, "secs": max(int(w[3]), 20) / 1000.0,
                                    "run": units[rid]["run"], "name": " ".join(w[4:])}
            elif w[0] == "lines":
                sets.append((int(w[1]), [int(x) for x in w[2].split(",")]))
    # (units the list names in its sets but no longer has: not in the cover)
    sets = [(n, [i for i in ids if i in units]) for n, ids in sets]
    sets = [(n, ids) for n, ids in sets if ids]
    for u in units.values():
        if u["kind"] == "test":
            units[u["rid"]]["secs"] = 1
    return srcs, units, sets


def cover(units, sets):
    """Greedy weighted set cover: the most lines not yet covered per
    second first, until every line is covered.  Bounded: each pass covers
    at least one set or stops."""
    left = list(range(len(sets)))
    chosen = []
    while left:
        gain = {}
        for j in left:
            for r in sets[j][1]:
                gain[r] = gain.get(r, 0) + sets[j][0]
        best = max(gain, key=lambda r: (gain[r] / units[r]["secs"], gain[r], -r))
        chosen.append(best)
        left = [j for j in left if best not in sets[j][1]]
    return chosen


def encode(name):
    """A test's name as bats 1.8 names its function (bats-preprocess's
    bats_encode_test_name), which is what BATS_TEST_NAME holds."""
    if re.fullmatch(r"[A-Za-z0-9 _-]*", name):
        return "test_" + name.replace("_", "-5f").replace("-", "-2d").replace(" ", "_")
    out = "test_"
    for c in name:
        if c == " ":
            out += "_"
        elif c.isascii() and c.isalnum():
            out += c
        else:
            out += "".join("-%02x" % b for b in c.encode())
    return out


TEST_LINE = re.compile(r"^\s*@test\s+(.*\S)\s+\{")


def tests_of(path):
    """The encoded names of the tests in a bats file (None: no such file)."""
    try:
        with open(path, errors="replace") as f:
            names = set()
            for line in f:
                m = TEST_LINE.match(line)
                if m:
                    n = m.group(1)
                    if len(n) > 1 and n[0] in "'\"" and n[-1] == n[0]:
                        n = n[1:-1]
                    names.add(encode(n))
            return names
    except OSError:
        return None


def read_runs(path):
    with open(path) as f:
        return [ln.rstrip("\n") for ln in f if ln.strip()]


def main(argv):
    if len(argv) == 4 and argv[1] == "add":
        return add(argv[2], argv[3])
    if len(argv) == 3 and argv[1] == "encode":
        print(encode(argv[2]))
        return 0
    if len(argv) == 5 and argv[1] == "collect":
        collect(argv[2], argv[3], argv[4])
        return 0
    if (len(argv) == 4 and argv[1] in ("select", "check")) or (len(argv) == 5 and argv[1] == "select"):
        srcs, units, sets = load(argv[2])
        want = read_runs(argv[3])
        known = {u["run"] for u in units.values() if u["kind"] == "run"}
        if argv[1] == "select":
            chosen = set(cover(units, sets))
            rids = sorted({units[u]["rid"] for u in chosen})
            for r in rids:
                print(units[r]["run"])
            for r in want:
                if r not in known:
                    print(r)
            if len(argv) == 5:
                with open(argv[4], "w") as f:
                    for u in sorted(units):
                        t = units[u]
                        if t["kind"] == "test" and t["rid"] in rids and u not in chosen:
                            f.write("%s\t%s\n" % (t["run"], t["name"]))
            return 0
        # A run or a test the list has not seen is not a loss: it is
        # sanitized.  What can lose lines is stale: a run or a test the
        # cover leans on that is gone, a C source whose lines only
        # unselected units may hit.  A test the cover leaves out (run
        # plain) that is gone loses nothing: renamed, it is unseen.
        chosen = set(cover(units, sets))
        for r in want:
            if r not in known:
                print("unseen, sanitized in full: %s" % r)
        stale = []
        stale += ["a run make check no longer has: %s" % r for r in sorted(known) if r not in want]
        files = {}
        for u in sorted(units):
            t = units[u]
            if t["kind"] != "test" or t["run"] not in want or u not in chosen:
                continue
            path = t["run"].split(" ")[-1]
            if path not in files:
                files[path] = tests_of(path)
            if files[path] is not None and t["name"] not in files[path]:
                stale.append("a test the cover takes is gone from %s: %s (renamed: its test "
                             "line's name is sancover.py encode NEWNAME)" % (t["run"], t["name"]))
        now = sources(os.getcwd())
        stale += ["a C source it has not seen: %s" % s for s in now if s not in srcs]
        stale += ["a C source that is gone: %s" % s for s in srcs if s not in now]
        for s in stale:
            print("stale: %s" % s)
        if stale:
            print("%s is stale: make san-cover renews it" % argv[2])
            return 1
        return 0
    sys.stderr.write("usage: sancover.py collect GCOVDIR RUNS OUT | add GCOVDIR LIST | select LIST RUNS [PLAIN] | check LIST RUNS | encode NAME\n")
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
