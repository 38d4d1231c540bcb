#!/usr/bin/env python3
"""tests/sancover.py: which suites make sanitize runs (make san-cover).

The sanitizer pass used to run the whole suite again on the ASan + UBSan
build: twice the CI time for little more than what the plain pass already
ran.  What the sanitizer adds is a check of the C code the tests execute,
so its pass runs the fewest runs that still execute every line of our C
(lib/, cmd/, sim/) that the whole suite executes: a greedy set cover of
those lines, each run weighed by its time (the run adding the most lines
per second first), computed from a committed coverage list
(tests/san-cover.txt) that `make san-cover` regenerates from a --coverage
build.

  sancover.py collect GCOVDIR RUNS OUT
                                      (run.sh's IDEMKIT_TEST_GCOV=GCOVDIR
                                       after a run on the --coverage build;
                                       a run in the file RUNS that left no
                                       data is noted as covering nothing)
  sancover.py select LIST RUNS        prints the runs to sanitize: the
                                       cover, plus any run in the file RUNS
                                       (make check's) the list has not seen
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
                                       stale: a run gone, or a C source
                                       file added or gone, since it was
                                       made (a run added is named: select
                                       gives it in full)

The list: "source FILE" for every C source (so a new file is noticed),
"run ID SECONDS RUN" for every run, and "lines COUNT ID,ID,..." for each
set of runs that execute the same lines (COUNT of them): enough for the
cover without keeping line numbers, which every edit moves.  An edit inside
a file leaves the list valid; a new file or a new run makes it stale (the
test in tests/ci.bats), and `make san-cover` (as long as make test) renews it.
"""
import glob
import json
import os
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


def run_lines(rundir, objroot):
    """The lines of our C that one run executed (file:line)."""
    gcdas = []
    for dirpath, _, files in os.walk(rundir):
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


def collect(gcovdir, runs_file, out):
    root = os.getcwd()
    runs = []
    seen = set()
    for d in sorted(glob.glob(os.path.join(gcovdir, "*")), key=lambda p: int(os.path.basename(p))):
        with open(os.path.join(d, "run")) as f:
            run = f.read().strip()
        secs = 1
        if os.path.exists(os.path.join(d, "time")):
            with open(os.path.join(d, "time")) as f:
                secs = max(1, int(f.read().strip() or 1))
        runs.append((run, secs, run_lines(os.path.abspath(d), root)))
        seen.add(run)
    runs += [(r, 1, set()) for r in read_runs(runs_file) if r not in seen]
    runs.sort(key=lambda r: r[0])
    by_line = {}
    for i, (_, _, lines) in enumerate(runs):
        for ln in lines:
            by_line.setdefault(ln, []).append(i)
    sig = {}
    for ids in by_line.values():
        k = ",".join(map(str, ids))
        sig[k] = sig.get(k, 0) + 1
    with open(out, "w") as f:
        f.write("# tests/san-cover.txt: made by `make san-cover` (tests/sancover.py), do not edit.\n")
        f.write("# %d lines of our C executed by the suite, %d runs\n" % (len(by_line), len(runs)))
        for s in sources(root):
            f.write("source %s\n" % s)
        for i, (run, secs, lines) in enumerate(runs):
            f.write("run %d %d %s\n" % (i, secs, run))
        for k in sorted(sig, key=lambda k: (-sig[k], k)):
            f.write("lines %d %s\n" % (sig[k], k))
    print("sancover: %d lines, %d runs -> %s" % (len(by_line), len(runs), out))


def add(gcovdir, path):
    """Appends the runs measured in gcovdir to the list at path: their
    lines in the C sources the list has not seen, and those sources."""
    root = os.getcwd()
    srcs, runs, _ = load(path)
    known_src = set(srcs)
    known_run = {r for _, r in runs.values()}
    new_src = [x for x in sources(root) if x not in known_src]
    nxt = max(runs) + 1 if runs else 0
    added, by_line = [], {}
    for d in sorted(glob.glob(os.path.join(gcovdir, "*")), key=lambda p: int(os.path.basename(p))):
        with open(os.path.join(d, "run")) as f:
            run = f.read().strip()
        if run in known_run:
            sys.stderr.write("sancover: %s is in the list already (make san-cover renews it)\n" % run)
            return 1
        secs = 1
        if os.path.exists(os.path.join(d, "time")):
            with open(os.path.join(d, "time")) as f:
                secs = max(1, int(f.read().strip() or 1))
        for ln in run_lines(os.path.abspath(d), root):
            if ln.split(":", 1)[0] in new_src:
                by_line.setdefault(ln, []).append(nxt)
        added.append((nxt, secs, run))
        nxt += 1
    sig = {}
    for ids in by_line.values():
        k = ",".join(map(str, ids))
        sig[k] = sig.get(k, 0) + 1
    with open(path) as f:
        lines = f.read().splitlines()
    head = [ln for ln in lines if ln.startswith("#")]
    body = [ln for ln in lines if not ln.startswith("#")]
    srcl = [ln for ln in body if ln.startswith("source ")] + ["source %s" % x for x in new_src]
    runl = [ln for ln in body if ln.startswith("run ")] + ["run %d %d %s" % a for a in added]
    setl = [ln for ln in body if ln.startswith("lines ")] + \
        ["lines %d %s" % (sig[k], k) for k in sorted(sig, key=lambda k: (-sig[k], k))]
    head.append("# added (sancover.py add): %d runs, %d lines in %d new sources" %
                (len(added), len(by_line), len(new_src)))
    with open(path, "w") as f:
        f.write("\n".join(head + sorted(srcl, key=lambda x: x.split(" ", 1)[1]) + runl + setl) + "\n")
    print("sancover: %d runs added, %d lines in %d new sources -> %s" %
          (len(added), len(by_line), len(new_src), path))
    return 0


def load(path):
    srcs, runs, sets = [], {}, []
    with open(path) as f:
        for line in f:
            w = line.rstrip("\n").split(" ", 3)
            if w[0] == "source":
                srcs.append(w[1])
            elif w[0] == "run":
                runs[int(w[1])] = (int(w[2]), w[3])
            elif w[0] == "lines":
                sets.append((int(w[1]), [int(x) for x in w[2].split(",")]))
    return srcs, runs, sets


def cover(runs, sets):
    """Greedy weighted set cover: the most lines not yet covered per
    second of run first, until every line is covered.  Bounded: each pass
    covers at least one set or stops."""
    left = list(range(len(sets)))
    chosen = []
    while left:
        gain = {}
        for j in left:
            for r in sets[j][1]:
                gain[r] = gain.get(r, 0) + sets[j][0]
        best = max(gain, key=lambda r: (gain[r] / runs[r][0], gain[r], -r))
        chosen.append(best)
        left = [j for j in left if best not in sets[j][1]]
    return chosen


def read_runs(path):
    with open(path) as f:
        return [ln.rstrip("\n") for ln in f if ln.strip()]


def main(argv):
    if len(argv) == 4 and argv[1] == "add":
        return add(argv[2], argv[3])
    if len(argv) == 5 and argv[1] == "collect":
        collect(argv[2], argv[3], argv[4])
        return 0
    if len(argv) == 4 and argv[1] in ("select", "check"):
        srcs, runs, sets = load(argv[2])
        want = read_runs(argv[3])
        known = {r for _, r in runs.values()}
        if argv[1] == "select":
            for r in cover(runs, sets):
                print(runs[r][1])
            for r in want:
                if r not in known:
                    print(r)
            return 0
        # A run the list has not seen is not a loss: select gives it in
        # full.  What can lose lines is stale: a run the cover may lean on
        # that is gone, a C source whose lines only unselected runs may hit.
        for r in want:
            if r not in known:
                print("unseen, sanitized in full: %s" % r)
        stale = []
        stale += ["a run make check no longer has: %s" % r for r in sorted(known) if r not in want]
        now = sources(os.getcwd())
        stale += ["a C source it has not seen: %s" % s for s in now if s not in srcs]
        stale += ["a C source that is gone: %s" % s for s in srcs if s not in now]
        for s in stale:
            print("stale: %s" % s)
        if stale:
            print("%s is stale: make san-cover renews it" % argv[2])
            return 1
        return 0
    sys.stderr.write("usage: sancover.py collect GCOVDIR RUNS OUT | add GCOVDIR LIST | select LIST RUNS | check LIST RUNS\n")
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
