"""tests/tools/jget_check.py JGET SEED N: N random documents and paths, each
asked of the C jget (tests/tools/jget.c) and answered by the Python program
it stands for; prints each difference and 'N differ of M', exits 1 on any.
The documents mix what the suites read (objects, arrays, strings with
escapes and non-ASCII, big integers, true/false/null at any depth) with
what jget hands to python3 (fractions, bad JSON)."""
import json
import random
import subprocess
import sys

jget, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
R = random.Random(seed)
KEYS = ["a", "b", "k"]


def rstr():
    return "".join(R.choice(["a", '"', "\\", "\n", "é", "😀", "\x01", "/", " ", "1"])
                   for _ in range(R.randint(0, 4)))


def rval(d=0):
    c = R.randint(0, 9 if d < 3 else 4)
    if c == 0:
        return R.choice([True, False, None])
    if c == 1:
        return R.randint(-2**70, 2**70)
    if c == 2:
        return R.choice([0, -1, 7, None, 1.5])
    if c in (3, 4):
        return rstr()
    if c in (5, 6, 7):
        return {k: rval(d + 1) for k in R.sample(KEYS, R.randint(0, 3))}
    return [rval(d + 1) for _ in range(R.randint(0, 3))]


def python(doc, path):
    try:
        v = json.loads(doc)
        for k in path.split("."):
            v = v[int(k)] if isinstance(v, list) else v.get(k) if isinstance(v, dict) else None
        return (("" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else str(v))) + "\n").encode()
    except Exception:
        return None


bad = 0
for _ in range(n):
    doc = json.dumps({k: rval(1) for k in KEYS}, ensure_ascii=R.random() < 0.5,
                     separators=R.choice([(",", ":"), (", ", ": ")]))
    if R.random() < 0.05:
        doc = doc[:-1]   # cut short: not JSON
    path = ".".join(R.choice(KEYS + ["0", "1", "-1"]) for _ in range(R.randint(1, 3)))
    want = python(doc, path)
    got = subprocess.run([jget, path], input=doc.encode() + b"\n", capture_output=True)
    if (want is None and (got.returncode == 0 or got.stdout)) or (want is not None and got.stdout != want):
        bad += 1
        print("differs:", repr(doc), repr(path), "python:", want, "jget:", got.stdout, got.returncode)
print(f"{bad} differ of {n}")
sys.exit(1 if bad else 0)
