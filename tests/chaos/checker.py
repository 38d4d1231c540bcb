#!/usr/bin/env python3
"""tests/chaos/checker.py: judges a campaign's history against the invariants.

Reads only what the run left in its directory, after the faults healed and
the queue drained: the bank's own ledger (bank/ledger.db) and request log
(every request, replays included), the records (records.ndjson, from
idemp-list), what was left in the queue and the DLQ (queue.ndjson,
dlq.ndjson), the workload the producer sent (workload.json), the
nemesis's log and every log line of every host.  It prints a short table
and writes verdict.json; for a violation, the chargeId, the faults around
it and that charge's timeline across hosts.

A run of another consumer (chaos.py --worker) keeps no idemkit record:
it is judged by the invariants that need none (FOREIGN below), from the
bank's ledger, its notifications and what is left in the queue and the DLQ.

Beside safety, liveness as a number (recovery()): for each fault's heal,
the time until every charge outstanding then was settled, per fault kind.

usage: checker.py RUN_DIR   (re-judges a kept run; secrets are not known
                             then, so check 5 is skipped)
"""
import bisect
import glob
import json
import os
import re
import sqlite3
import sys

from proxy import BRANCH   # the legacy core system's branch in its refs

TERMINAL = ("DONE", "FAILED", "DEBITED_NOTIFICATION_FAILED")
DEBITED = ("DONE", "DEBITED_NOTIFICATION_FAILED")
INVARIANTS = [
    (1, "no charge debited twice; every debit under Idempotency-Key = chargeId"),
    (2, "records agree with the bank (debited <=> DONE/DNF; FAILED only if declined or unseen)"),
    (3, "nothing lost: settled with no copy left, or in the DLQ with its reason"),
    (4, "notifications: one key per charge, none => DNF; a record finished once, never re-claimed"),
    (5, "no planted secret in any output, log or command line"),
    (6, "liveness: the backlog drains within the bound after the heal"),
    (7, "a debit a worker had the bank's yes for is recorded, never sent to the bank again"),
    (8, "each debit's outcome is what the contract says of the bank's answer"),
    (9, "no bank call outside a live lease, none after its step gave up on it; no call refused "
        "on a live one"),
    (10, "outbox: one event applied downstream per finish and re-notification, none other"),
    (11, "storage stays sound: no step reports a corrupt file; the embedded files pass "
         "integrity_check"),
]
# Another consumer's run (--worker): what it is judged by, needing no
# idemkit record.
FOREIGN = {
    1: "no charge debited twice at the bank",
    3: "nothing lost: every charge debited, or in the DLQ; no copy left in the queue",
    4: "one notification per debited charge, none for a charge not debited",
    5: INVARIANTS[4][1],
    6: INVARIANTS[5][1],
}
# What SQLite says of a corrupt file (SQLITE_CORRUPT, SQLITE_NOTADB): an
# acked delete or a finish written into a WAL another process deleted
# comes back as one of these.
CORRUPT = ("database disk image is malformed", "file is not a database")
# Faults that open the crash window (an answer held by a process that
# dies or stops past its lease, or a store it cannot reach): after one of
# these, a charge the bank answered may be claimed and sent again under
# its key.  A stop signal to a worker's group is not one (an ordinary
# stop: the steps finish what they hold), nor is anything on the bank's
# side once the answer is in the worker's hands.
CRASH_KINDS = ("kill-step", "kill-worker", "stop-step")
STORE_KINDS = ("store-restart", "store-kill9", "failover")
STORE_HOSTS = ("store", "store2")
# the steps that write to the store (a stopped one may hold a lock)
STORE_STEPS = ("idemp-claim", "idemp-done")
TEMPFAIL_STATUSES = (408, 409, 425, 429)


def jlines(path):
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def legacy_ref(ref):
    """The bank's ref as the product records it after the fault bank-legacy
    (proxy.py): the branch's name added in ISO-8859-1, made valid UTF-8
    at the store's port (each invalid byte U+FFFD, lib/core/utf8.c)."""
    return (ref + BRANCH).encode("latin-1").decode("utf-8", "replace")


def charge_of(body):
    try:
        return json.loads(body).get("chargeId")
    except (ValueError, AttributeError, TypeError):
        return None


def dlq_reason(m):
    """Why a DLQ copy is there: idemkit's reason (sqs-ack's move), or the
    broker's (RabbitMQ's x-death, past the queue's delivery limit: the
    adapter's deathReason); None: neither."""
    a = m.get("attributes") or {}
    return a.get("idemkit.reason") or a.get("deathReason")


def fault_windows(run, lease_ms):
    """(start_ms, end_ms, kind, event) of every fault that landed."""
    starts, out = {}, []
    for e in jlines(os.path.join(run, "nemesis.log")):
        if "t" not in e:
            continue
        key = (e["t"], e["kind"])
        if e.get("action") == "start":
            starts[key] = e
        elif e.get("action") in ("healed", "heal-failed") and key in starts:
            s = starts.pop(key)
            end = e["ts"] if e["ts"] > s["ts"] else s["ts"]
            out.append((s["ts"], max(end, s["ts"] + (0 if s.get("d") else 2 * lease_ms)), s["kind"], s))
    for s in starts.values():
        out.append((s["ts"], s["ts"] + 2 * lease_ms, s["kind"], s))
    return sorted(out, key=lambda x: x[0])


def spans(run):
    """(start_ms, end_ms, event) of every fault that landed, at the times it
    was in force (an instant fault: start = end; one never healed on its
    own: until the heal-all)."""
    starts, out, heal_all = {}, [], None
    for e in jlines(os.path.join(run, "nemesis.log")):
        if e.get("kind") == "heal-all":
            heal_all = e["ts"]
            continue
        if "t" not in e:
            continue
        key = (e["t"], e["kind"])
        if e.get("action") == "start":
            starts[key] = e
        elif e.get("action") in ("healed", "heal-failed") and key in starts:
            s = starts.pop(key)
            out.append((s["ts"], max(e["ts"], s["ts"]), s))
    for s in starts.values():
        out.append((s["ts"], heal_all or s["ts"] + 60000, s))
    return sorted(out, key=lambda x: x[0])


def pct(vs, q):
    """The q-quantile of vs by nearest rank (vs sorted)."""
    return vs[min(len(vs) - 1, max(0, -(-int(q * 1000) * len(vs) // 1000) - 1))]


def summary(vs):
    vs = sorted(vs)
    return {"n": len(vs), "p50": round(pct(vs, 0.5), 1), "p99": round(pct(vs, 0.99), 1),
            "max": round(vs[-1], 1)} if vs else {"n": 0}


def recovery(heals, sent, settled):
    """Liveness as a number.  heals: (kind, heal ms) of every fault;
    sent: chargeId -> when its first copy was sent; settled: chargeId ->
    when it was settled (ms).  For each heal, the time until every charge
    outstanding then (sent before it, settled after it) was settled, 0
    when none was; per kind: {n, p50, p99, max} in seconds.  A charge never
    settled is check 3's and counts nowhere here.  The faults overlap: a
    heal's figure is what was outstanding at it cost, whatever else was in
    force then or came after."""
    both = sorted((sent[c], settled[c]) for c in sent if c in settled)
    starts = [a for a, _ in both]
    top, m = [], 0            # top[i]: the latest settle of the first i+1 sent
    for _, b in both:
        m = max(m, b)
        top.append(m)
    per = {}
    for kind, h in heals:
        i = bisect.bisect_right(starts, h)
        last = top[i - 1] if i else 0
        per.setdefault(kind, []).append(max(0, last - h) / 1000.0)
    return {k: summary(v) for k, v in sorted(per.items())}


def sent_times(run):
    """chargeId -> when the producer's first send of a copy of it was
    accepted (producer.log)."""
    out = {}
    for e in jlines(os.path.join(run, "logs", "producer.log")):
        for cid in e.get("ids") or ():
            if cid and cid not in out:
                out[cid] = e["ts"]
    return out


def heals_of(run):
    """(kind, heal ms) of every fault that landed; the end of the fault
    phase as "heal-all"."""
    out = [(e["kind"], b) for a, b, e in spans(run)]
    for e in jlines(os.path.join(run, "nemesis.log")):
        if e.get("kind") == "heal-all":
            out.append(("heal-all", e["ts"]))
    return out


# Lines of one worker's log are written in the order they happen (each
# step writes its line at once, several steps to one file): neighbours may
# be this much out of order, no more, without it counting against a reading.
DISORDER_MS = 2000
EDGE_MS = 1500      # a reading this close to a clock change is not judged


def real_clock(sp):
    """real(host, ts, candidates=True): every true time a line a worker host
    logged at ts may have been logged at; resolve(host, tss): the true time
    of each line of one worker's log, in file order.

    A clock fault skews the worker's wall clock (libfaketime, an offset file
    read at most a second late), so a line logged under it reads its true
    time plus the skew.  With skews of up to a minute over windows of a few
    seconds, one logged time often has two readings: logged under the skew,
    or logged without it before or after the window.  The file's order
    decides: the readings that keep the lines in order are taken (a step
    back costs its size beyond DISORDER_MS; the cheapest readings of the
    whole file, forward and backward); a line whose best readings tie, or
    whose reading is within EDGE_MS of a clock change, is None (not
    judged)."""
    clocks = {}
    for a, b, e in sp:
        if e["kind"] == "clock":
            # set_clock writes whole seconds
            clocks.setdefault(e["host"], []).append((a, b, int(e["skew_s"]) * 1000))

    def readings(host, ts):
        """[(true time, sure)] for a line logged at ts."""
        fs = clocks.get(host, ())
        out = []
        for a, b, k in fs:
            if k and a - EDGE_MS <= ts - k <= b + EDGE_MS:
                out.append((ts - k, a + EDGE_MS <= ts - k <= b - EDGE_MS))
        if not any(a + EDGE_MS <= ts <= b - EDGE_MS for a, b, k in fs if k):
            out.append((ts, not any(a - EDGE_MS <= ts <= b + EDGE_MS for a, b, k in fs if k)))
        return out

    def real(host, ts, candidates=False):
        rs = readings(host, ts)
        if candidates:
            return [t for t, _ in rs]
        sure = [t for t, ok in rs if ok]
        return sure[0] if len(rs) == 1 and sure else None

    def resolve(host, tss, fixed=()):
        """fixed: the indexes of lines whose time is true (the harness's own,
        written into the worker's log without the skew)."""
        cands = [[(ts, True)] if i in fixed else readings(host, ts) if ts is not None else []
                 for i, ts in enumerate(tss)]
        idx = [i for i, c in enumerate(cands) if c]
        out = [None] * len(tss)
        if not idx:
            return out

        def step(x, y):
            return max(0, x - y - DISORDER_MS)

        def sweep(order):
            cost, prev = {}, None
            for i in order:
                cost[i] = [0 if prev is None else
                           min(cost[prev][j] + step(*((p[0], c[0]) if order is idx else
                                                     (c[0], p[0])))
                               for j, p in enumerate(cands[prev]))
                           for c in cands[i]]
                prev = i
            return cost
        fwd, bwd = sweep(idx), sweep(idx[::-1])
        for i in idx:
            tot = [f + g for f, g in zip(fwd[i], bwd[i])]
            best = min(tot)
            pick = [c for c, t in zip(cands[i], tot) if t == best]
            if all(abs(c[0] - pick[0][0]) <= EDGE_MS for c in pick) and pick[0][1]:
                out[i] = pick[0][0]
        return out

    real.resolve = resolve
    return real


def slack_at(sp, t, partitions=True):
    """How late a request sent in time may reach the bank at t: what the
    faults in force just before add to its way (proxy delays, a slow bank
    that logs after its nap, TCP retransmitting across a partition).
    partitions=False: a request its step no longer waits for, whose
    connection was closed abortively (SO_LINGER 0, lib/conn/http.c): a
    partition retransmits nothing of it, only what was past the worker
    already (in the link, at the proxy, in the bank's nap) may still
    arrive."""
    s = 2000
    for a, b, e in sp:
        if a > t or b < t - 30000:
            continue
        k = e["kind"]
        if k == "link" and b >= t - 10000:
            c = e.get("ctl", {})
            s += 2 * (c.get("latency_ms", 0) + c.get("jitter_ms", 0)) + \
                (2000 if c.get("loss") else 0) + (2000 if c.get("reorder") else 0) + \
                (4000 if c.get("dup") else 0)
        elif k == "bank-slow" and b >= t - 10000:
            s += 2 * e.get("latency_ms", 0)
        elif k == "partition" and "bank" in (e.get("a"), e.get("b")) and partitions:
            s += 2 * (b - a) + 3000
    return s


def worker_lines(run, real, msgs):
    """The workers' log lines of the given msg kinds, each with its host
    and its true time ("real"), in the order each worker wrote them."""
    out = []
    for path in sorted(glob.glob(os.path.join(run, "logs", "worker-*.log"))):
        slot = os.path.basename(path)[len("worker-"):-len(".log")]    # w1.0
        host = slot.split(".")[0]
        es = jlines(path)
        times = real.resolve(host, [e["ts"] if isinstance(e.get("ts"), int) else None
                                    for e in es],
                             {i for i, e in enumerate(es) if "harness" in e})
        for i, e in enumerate(es):
            if e.get("msg") not in msgs or "ts" not in e or not e.get("chargeId"):
                continue
            t = times[i]
            if t is not None:
                out.append(dict(e, real=t, host=host, slot=slot, file=path, line=i))
            elif e.get("outcome") == "LEASE_SHORT":
                out.append(dict(e, real=None, maybe=real(host, e["ts"], True), host=host,
                                slot=slot, file=path, line=i))
    return out


def claims_of(rec):
    """A record's claims, (at, leaseUntil, end of its hold, what ended it):
    the hold ends at the lease's end or at the first finish or release
    after it."""
    out = []
    hist = (rec or {}).get("history", [])
    for i, h in enumerate(hist):
        if h.get("op") != "claim":
            continue
        end, how = h.get("leaseUntil") or h["at"], None
        for x in hist[i + 1:]:
            if x.get("op") == "claim":
                break
            if x.get("op") in ("finish", "release"):
                end, how = min(end, x["at"]), x["op"]
                break
        out.append((h["at"], h.get("leaseUntil") or h["at"], end, how))
    return out


def claim_for(claims, t, tol=0):
    """The last claim taken at or before t (+tol)."""
    c = [x for x in claims if x[0] <= t + tol]
    return c[-1] if c else None


def timeline(run, cid, limit=80):
    """The lines naming the charge, and those naming one of its message ids
    (a RabbitMQ holder's deliveries, returns and acks name only the
    message id: logged at debug, as the campaign runs the workers there)."""
    every, lines = [], []
    for path in sorted(glob.glob(os.path.join(run, "logs", "*.log"))):
        src = os.path.basename(path)[:-4]
        every.extend((e.get("ts", 0), src, e) for e in jlines(path))
    mids = {e["messageId"] for _, _, e in every
            if e.get("chargeId") == cid and isinstance(e.get("messageId"), str)}
    for t, src, e in every:
        if e.get("messageId") in mids or cid in json.dumps(e):
            lines.append((t, src, e))
    lines.sort(key=lambda x: x[0])
    if len(lines) > limit:     # the first ones and the last ones: where it went
        lines = lines[:limit // 4] + lines[-(limit - limit // 4):]
    return [{"ts": t, "source": s, "line": e} for t, s, e in lines]


def check(run, planted, facts):
    wl = json.load(open(os.path.join(run, "workload.json")))
    lease_ms = wl["lease_s"] * 1000
    declined = set(wl["declined"])
    records = {r["chargeId"]: r for r in jlines(os.path.join(run, "records.ndjson"))}
    dlq = jlines(os.path.join(run, "dlq.ndjson"))
    left = jlines(os.path.join(run, "queue.ndjson"))
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(run, "bank", "ledger.db"), uri=True)
    # a notification's body may carry bank-legacy's ISO-8859-1 reference
    db.text_factory = lambda b: b.decode("utf-8", "replace")
    debits = {}
    for key, cid, ref, amount, replays, at in db.execute(
            "SELECT key, charge_id, ref, amount, replays, created_at FROM debits ORDER BY seq"):
        debits.setdefault(cid, []).append({"key": key, "ref": ref, "amount": amount,
                                           "replays": replays, "at": at})
    notes, notes_body = {}, {}
    for key, count, body in db.execute("SELECT key, count, body FROM notifications"):
        notes[key] = count
        notes_body[key] = body
    notes_of = {}          # chargeId: the gateway keys it was notified under
    for k in notes:
        notes_of.setdefault(k.split(":")[0], []).append(k)
    reqs = {}
    for e in jlines(os.path.join(run, "logs", "bank-sim.log")):
        if e.get("msg") == "request" and e.get("path") == "/debits" and e.get("method") == "POST":
            reqs.setdefault(e.get("key"), []).append((e["ts"], e.get("status")))
    dlq_by_body = {}
    for m in dlq:
        dlq_by_body.setdefault(m.get("body"), []).append(m)
    dlq_ids = {charge_of(b) for b in dlq_by_body}
    left_of = {}
    for m in left:
        left_of[charge_of(m.get("body"))] = left_of.get(charge_of(m.get("body")), 0) + 1
    foreign = bool(wl.get("worker"))

    viol = {i: [] for i, _ in INVARIANTS}
    note_replays = 0

    def bad(i, cid, why):
        viol[i].append({"chargeId": cid, "why": why})

    if foreign:
        foreign_checks(wl, debits, notes, notes_body, dlq_by_body, left_of, bad)
    for c in ([] if foreign else wl["charges"]):
        cid = c["chargeId"]
        d = debits.get(cid, [])
        r = records.get(cid)
        st = r["state"] if r else None
        # 1
        if len(d) > 1:
            bad(1, cid, "%d distinct debits at the bank" % len(d))
        for x in d:
            if x["key"] != cid:
                bad(1, cid, "debited under Idempotency-Key %r" % x["key"])
        # 2
        if d and st not in DEBITED:
            bad(2, cid, "debited at the bank (%s) but the record says %s" % (d[0]["ref"], st))
        if not d and st in DEBITED:
            bad(2, cid, "record %s but the bank has no debit" % st)
        if d and r and r.get("debitRef") and r["debitRef"] not in (d[0]["ref"], legacy_ref(d[0]["ref"])):
            bad(2, cid, "record ref %s, bank ref %s" % (r["debitRef"], d[0]["ref"]))
        if st == "FAILED":
            statuses = [s for _, s in reqs.get(cid, [])]
            if statuses and 402 not in statuses:
                bad(2, cid, "FAILED, but the bank never declined it (answers: %s)"
                    % sorted(set(statuses)))
        if c["declined"] and d:
            bad(2, cid, "a declined account was debited")
        if r and r.get("event") and d and json.loads(r["event"])["amount"] != d[0]["amount"]:
            bad(2, cid, "debited %s, record's event says %s" % (d[0]["amount"],
                                                                 json.loads(r["event"])["amount"]))
        # 3
        if st not in TERMINAL:
            bad(3, cid, "no terminal record (state %s)" % st)
        n_left = left_of.get(cid, 0)
        if n_left:
            bad(3, cid, "%d copies still in the queue" % n_left)
        if st == "FAILED" and cid not in dlq_ids:
            bad(3, cid, "FAILED but no copy in the DLQ")
        ev = r.get("event") if r else None
        for b in {c["body"], c["mismatch"]} - {None}:
            if ev is not None and b != ev and json.loads(b) != json.loads(ev) \
                    and b not in dlq_by_body:
                bad(3, cid, "a copy with another payload is neither settled nor in the DLQ")
        # 4: the gateway counts every delivery it accepted; deliveries
        # under one key past the first are a retry the key absorbs (a real
        # gateway answers them from its idempotency store), like a replay
        keys = notes_of.get(cid, [])
        n = sum(notes[k] for k in keys)
        if len(keys) > 1:
            bad(4, cid, "notified under %d keys: %s" % (len(keys), keys))
        if st == "DONE" and n == 0:
            bad(4, cid, "DONE but the gateway accepted no notification")
        if st == "FAILED" and n:
            bad(4, cid, "FAILED but %d notifications were sent" % n)
        if n > 1:
            note_replays += n - 1
        finished = False
        for h in (r or {}).get("history", []):
            if h.get("op") == "finish" and finished:
                bad(4, cid, "finished twice (the second by owner %s): a finish not fenced by "
                    "the claim token" % h.get("owner"))
                break
            if h.get("op") == "finish":
                finished = True
            elif h.get("op") == "claim" and finished:
                bad(4, cid, "claimed again (attempt %s) after it was finished" % h.get("attempt"))
                break
    for b in ([] if foreign else wl["poison"]):
        pid = charge_of(b) or b[:30]
        if b not in dlq_by_body:
            bad(3, pid, "a malformed message is not in the DLQ")
        if pid in reqs:
            bad(2, pid, "a malformed event reached the bank (answers: %s)"
                % sorted(set(s for _, s in reqs[pid])))
    for b, ms in ({} if foreign else dlq_by_body).items():
        for m in ms:
            if not dlq_reason(m):
                bad(3, charge_of(b) or str(b)[:30], "a DLQ copy without its reason")
                break
    # 5
    if planted is not None:
        files = [p for p in glob.glob(os.path.join(run, "**", "*"), recursive=True)
                 if os.path.isfile(p) and (p.endswith((".log", ".ndjson")) or
                                           os.path.basename(p) in ("log", "server.log"))]
        for name, value in planted:
            for p in files:
                with open(p, "rb") as f:
                    if value.encode() in f.read():
                        bad(5, "-", "the %s is in %s" % (name, os.path.relpath(p, run)))
    # 6
    if facts.get("drained_s") is None:
        bad(6, "-", "the backlog did not drain within %s s of the heal" % facts.get("drain_bound_s"))
    elif facts["drained_s"] > facts["drain_bound_s"]:
        bad(6, "-", "drained in %.0f s, over the bound of %d s"
            % (facts["drained_s"], facts["drain_bound_s"]))

    if foreign:
        judged = set(FOREIGN)
    else:
        storage_checks(run, bad)
        money_checks(run, wl, records, reqs, bad)
        judged = {i for i, _ in INVARIANTS}
        if not outbox_checks(run, records, bad):
            judged.discard(10)

    # replays absorbed by the key, per fault kind around them
    windows = fault_windows(run, lease_ms)
    per_kind, replays = {}, 0
    for key, rs in reqs.items():
        for ts, status in rs:
            if status != 200:
                continue
            replays += 1
            kinds = {k for s, e, k, _ in windows if s <= ts <= e + lease_ms} or {"none"}
            for k in kinds:
                per_kind[k] = per_kind.get(k, 0) + 1
    faults = {}
    for _, _, k, _ in windows:
        faults[k] = faults.get(k, 0) + 1

    # the evidence for each violating charge
    evidence = []
    for i, vs in viol.items():
        for v in vs[:5]:
            cid = v["chargeId"]
            if not cid.startswith(("CHG-", "BAD-")):
                continue
            tl = timeline(run, cid)
            ts = [x["ts"] for x in tl if x["ts"]] or [0]
            around = [dict(w[3], end=w[1]) for w in windows
                      if w[0] <= max(ts) + lease_ms and w[1] >= min(ts) - lease_ms]
            evidence.append({"invariant": i, "chargeId": cid, "why": v["why"],
                             "faults": around, "timeline": tl})
    n_charges = len(wl["charges"])
    # when each charge was settled: its record's first finish (the
    # store's clock), or another consumer's debit at the bank
    at = {}
    for c in wl["charges"]:
        cid = c["chargeId"]
        if foreign:
            if debits.get(cid):
                at[cid] = debits[cid][0]["at"]
            continue
        r = records.get(cid) or {}
        if r.get("state") in TERMINAL:
            fin = [h["at"] for h in r.get("history", []) if h.get("op") == "finish"]
            at[cid] = min(fin) if fin else r.get("updatedAt")
    if foreign:
        settled = sum(1 for c in wl["charges"] if c["chargeId"] in at or c["chargeId"] in dlq_ids)
    else:
        settled = len(at)
    sent = sent_times(run)
    lat = [(at[c] - sent[c]) / 1000.0 for c in at if c in sent and at[c]]
    span = [sent[c] for c in at if c in sent] + [at[c] for c in at if at[c]]
    took = (max(span) - min(span)) / 1000.0 if len(span) > 1 else 0
    v = {
        "ok": not any(viol.values()),
        "seed": wl["seed"], "backend": wl["backend"], "duration_s": wl["duration"],
        "charges": n_charges, "copies_sent": sum(c["copies"] + (1 if c["mismatch"] else 0)
                                                 for c in wl["charges"]) + len(wl["poison"]),
        "settled": settled, "debits": sum(len(x) for x in debits.values()),
        "replays_absorbed": replays, "replays_per_fault": per_kind, "faults_landed": faults,
        "dlq": len(dlq), "left_in_queue": len(left),
        "notifications": sum(notes.values()), "notification_retries_absorbed": note_replays,
        "facts": facts, "worker": wl.get("worker"),
        "recovery_s": recovery(heals_of(run), sent, {c: t for c, t in at.items() if t}),
        "settle_latency_s": summary(lat),
        "settled_per_s": round(len(lat) / took, 2) if took else None,
        "invariants": [{"n": i, "name": FOREIGN[i] if foreign else name, "ok": not viol[i],
                        "violations": viol[i][:50], "count": len(viol[i])}
                       for i, name in INVARIANTS if i in judged],
        "evidence": evidence[:10],
    }
    with open(os.path.join(run, "verdict.json"), "w") as f:
        json.dump(v, f, indent=1)
    print_table(v, run)
    return v


def storage_checks(run, bad):
    """11: any step's log line naming a corrupt file, and what SQLite's
    integrity_check says of the embedded backend's files (read only, the
    workers stopped)."""
    for p in sorted(glob.glob(os.path.join(run, "logs", "*"))):
        with open(p, errors="replace") as f:
            hits = [line.strip() for line in f if any(c in line for c in CORRUPT)]
        if hits:
            bad(11, "-", "%d line(s) in %s name a corrupt file, the first: %s"
                % (len(hits), os.path.basename(p), hits[0][:300]))
    for p in sorted(glob.glob(os.path.join(run, "shared", "*.db"))):
        try:
            db = sqlite3.connect("file:%s?mode=ro" % p, uri=True, timeout=30)
            said = "; ".join(r[0] for r in db.execute("PRAGMA integrity_check"))
            db.close()
        except sqlite3.Error as e:
            said = str(e)
        if said != "ok":
            bad(11, "-", "%s: integrity_check says %s" % (os.path.basename(p), said[:300]))


def money_checks(run, wl, records, reqs, bad):
    """Checks 7-9, from the workers' own log lines set against the bank's
    request log, the link's (the proxy in front of the bank) and the
    records' histories.  The workers' times are made true first (a clock
    fault skews them); the bank's, the proxy's and the records' are true
    (the store's clock, or the single host's on the embedded default)."""
    lease_ms = wl["lease_s"] * 1000
    sp = spans(run)
    real = real_clock(sp)
    tol = 2500 if wl["backend"] == "dynamodb" else 0   # leases on the workers' clocks
    debits = worker_lines(run, real, ("debit",))
    notes = {}
    for e in jlines(os.path.join(run, "logs", "bank-proxy.req.log")):
        # every answer the link wrote or failed to write (no status: the
        # upstream failed, the proxy cut the client), in the order written
        if "/debits" in e.get("req", ""):
            st = str(e.get("status", ""))
            notes.setdefault(e.get("key"), []).append((e["ts"], int(st) if st.isdigit() else None,
                                                       e.get("faults")))
    lines_of = {}
    for e in debits:
        if e["real"] is not None:
            lines_of.setdefault(e["chargeId"], []).append(e)
    wanted = {c["chargeId"] for c in wl["charges"]}

    def held(cid, t):
        """The claim a step working on cid at t ran under, when that is
        beyond doubt: the only one of the charge in the last three leases
        (an acquired claim is not logged, so a step's envelope is known
        only by its time; a step holding an older claim is a stale one)."""
        cl = claims_of(records.get(cid))
        recent = [c for c in cl if t - 3 * lease_ms <= c[0] <= t + tol]
        return recent[0] if len(recent) == 1 else None

    def theirs(x, slot):
        """A process fault can hold up the charges of the worker it hit
        (its slot, logged by the nemesis since it names them; an older
        log names none: any); and any worker's when it stopped a step
        that writes to the store, which may hold a lock the others wait
        for (SQLite's on the embedded default).  A killed process holds
        none."""
        return slot is None or x.get("slot") is None and "comm" not in x or \
            x.get("slot") == slot or \
            x["kind"] == "stop-step" and x.get("comm") in STORE_STEPS

    def crash_window(t, until, slot=None):
        # a store that restarted, died or failed over shortly before may
        # still fail a step's first write after it (its connection gone,
        # a failed open retried within 5 s): the finish is left for a
        # retry, as it should be; 15 s after the store is back, no longer
        return [x for a, b, x in sp if a <= until and
                (x["kind"] in STORE_KINDS and b >= t - 15000 or b >= t - 3000 and
                 (x["kind"] in CRASH_KINDS and theirs(x, slot) or
                  (x["kind"] == "partition" and {x.get("a"), x.get("b")} & set(STORE_HOSTS)) or
                  x["kind"] == "store-link" or
                  (x["kind"] == "clock" and wl["backend"] == "dynamodb")))]

    def resent(cid, t, how, slot=None):
        """7: the bank's yes for cid reached a worker at t (how; slot: that
        worker's, when known): the charge must not go to the bank again
        unless a crash window opened."""
        c = claim_for(claims_of(records.get(cid)), t, tol)
        if c is None or c[1] - t < 3000:
            return          # a takeover may race a finish this late in the lease
        later = [ts for ts, _ in reqs.get(cid, []) if ts > t + 50]
        if not later:
            return
        rc = claim_for(claims_of(records.get(cid)), later[0], tol)
        until = min(rc[0] if rc and rc[0] > t else later[0], t + lease_ms + 2000)
        if not crash_window(t, until, slot):
            bad(7, cid, "%s at %d, and the charge went to the bank again at %d with no crash "
                "window around it" % (how, t, later[0]))

    def in_force(t, kinds, before=5000):
        return [x for a, b, x in sp if a <= t and b >= t - before and x["kind"] in kinds and
                (x["kind"] != "partition" or "bank" in (x.get("a"), x.get("b")))]

    # 7 (the answer delivered to a step that was gone): a 2xx the link
    # wrote promptly (no delay, slow bank or cut link in force) with no
    # step's line for the charge around it
    for cid, ns in notes.items():
        if cid not in wanted:
            continue
        for ts, status, faults in ns:
            if status is None or not 200 <= status < 300:
                continue
            near = [e for e in lines_of.get(cid, []) if ts - 8000 <= e["real"] <= ts + 5000]
            if not near and not in_force(ts, ("link", "bank-slow", "partition", "bank-restart",
                                                     "clock")):
                resent(cid, ts, "the link delivered the bank's %d to a worker that "
                       "wrote nothing of it" % status)
    def lease_refusal(e, cid, t, c):
        """9: a refusal for want of lease, with the lease in fact live."""
        m = re.search(r"needs (\d+)ms plus a (\d+)ms margin", str(e.get("error", "")))
        if m and c:
            left = c[1] - t
            if left > int(m.group(1)) + int(m.group(2)) + 3000 + tol:
                bad(9, cid, "the debit step refused for want of lease (%s) with %d ms of "
                    "it left (leaseUntil %d on the store's clock)" % (e.get("error"), left, c[1]))

    for e in debits:
        cid, o, t = e["chargeId"], e.get("outcome"), e["real"]
        if cid not in wanted:
            continue
        if t is None:
            # logged as a clock changed: the time at which the claim it
            # ran under was released right after it (a refusal releases)
            for t in e["maybe"]:
                c = held(cid, t)
                if c and c[3] == "release" and 0 <= c[2] - t <= 3000:
                    lease_refusal(e, cid, t, c)
                    break
            continue
        st = e.get("status")
        got = []
        # 8: the step's word against the bank's status (its own line's)
        if isinstance(st, int):
            if 200 <= st < 300 and o != "OK":
                bad(8, cid, "the bank answered %d and the debit step said %s (%s)"
                    % (st, o, e.get("error")))
            elif o == "DECLINED" and st not in (402, 422):
                bad(8, cid, "the bank answered %d (transient) and the debit step said DECLINED"
                    % st)
        # 8: ... and against the status the link delivered just before it
        # (logged as it is written, so within the same millisecond; a step
        # that gave up waiting says it timed out, and is not judged).  The
        # step's own answer is the last the link wrote for the charge
        # before its line: an earlier one in the window went to another
        # connection (run embedded 1007: a request given up on 14 s before,
        # delivered when a partition healed, its 201 written to a socket
        # no step read, 0.8 s before the step's own request was cut)
        elif o not in ("OK", "DECLINED", "LEASE_SHORT") and \
                "timed out" not in str(e.get("error", "")):
            own = sorted(n for n in notes.get(cid, []) if t - 2500 <= n[0] <= t + 5)[-1:]
            got = [n for n in own if n[1] is not None and 200 <= n[1] < 300]
            if got:
                bad(8, cid, "the link delivered the bank's %d (faults %s) and the debit step "
                    "said %s (%s)" % (got[-1][1], got[-1][2], o, e.get("error")))
        if o == "LEASE_SHORT":
            lease_refusal(e, cid, t, held(cid, t))
        # 7: the worker had the bank's yes
        if o == "OK":
            resent(cid, t, "the debit step had the bank's yes (%s) on %s" % (e.get("ref"), e["slot"]),
                   e["slot"])
        elif got:
            resent(cid, t, "the link delivered the bank's %d and the debit step said %s on %s"
                   % (got[-1][1], o, e["slot"]), e["slot"])
    # 9: no request reaches the bank after the debit step that sent it gave
    # up on it: one the bank answered after the step of its claim wrote its
    # line (timed out, cut), no step of that claim still waiting, later
    # than what was past the worker already could take (a partition
    # excuses nothing: the step's connection closed abortively; runs
    # embedded 1004, 1006, 1007, on a tree without SO_LINGER 0).  A step
    # killed writes no line: not judged.
    for cid, rs in reqs.items():
        if cid not in wanted or cid not in records:
            continue
        cl = claims_of(records[cid])
        for ts, status in rs:
            c = claim_for(cl, ts, tol)
            mine = [e for e in lines_of.get(cid, []) if c and claim_for(cl, e["real"], tol) == c]
            done = [e for e in mine if e["real"] <= ts]
            if not done or len(done) < len(mine):
                continue        # no step's word yet, or one still waiting
            gave = max(done, key=lambda e: e["real"])
            late = ts - gave["real"]
            if late > slack_at(sp, ts, partitions=False) + tol:
                bad(9, cid, "the bank answered a request (%s) at %d, %d ms after the debit step of "
                    "the claim of %d gave up on it (%s: %s) on %s, no step of that claim waiting"
                    % (status, ts, late, c[0], gave.get("outcome"), gave.get("error"),
                       gave["slot"]))
    # 9: every request at the bank inside a hold of its charge (claimed,
    # neither finished nor released, lease not over), give or take how late
    # the faults then let a request sent in time arrive
    for cid, rs in reqs.items():
        if cid not in wanted:
            continue
        rec = records.get(cid)
        if rec is None:
            continue          # no record at all: check 3's
        cl = claims_of(rec)
        for ts, status in rs:
            c = claim_for(cl, ts, tol)
            if c is None:
                if len((rec or {}).get("history", [])) < 20:
                    bad(9, cid, "a request at the bank at %d before any claim" % ts)
                continue
            late = ts - c[2]
            if late > slack_at(sp, ts) + tol:
                bad(9, cid, "a request reached the bank %d ms after the hold of the claim "
                    "of %d ended (%s)" % (late, c[0], "finished or released" if c[2] < c[1]
                                          else "lease over"))


def outbox_checks(run, records, bad):
    """Check 10, when the run had the outbox on (RUN/outbox, outbox.py):
    the events the downstream consumer applied (applied.ndjson, one per
    application) against the records' histories, whatever store wrote
    them.  Each finish and each re-notification is one event, applied
    once (the consumer keys on eventId: an event published twice with the
    same eventId is absorbed, with another one it is applied twice); no
    event for a charge whose record is not finished."""
    if not os.path.isdir(os.path.join(run, "outbox")):
        return False
    by_id, by_charge = {}, {}
    for ev in jlines(os.path.join(run, "outbox", "applied.ndjson")):
        by_id.setdefault(ev.get("eventId"), []).append(ev)
    for eid, evs in by_id.items():
        cid = evs[0].get("chargeId") or "-"
        if len(evs) > 1:
            bad(10, cid, "event %s applied %d times downstream" % (eid, len(evs)))
        by_charge.setdefault(cid, []).append(evs[0])
    for cid, rec in records.items():
        hist = rec.get("history", [])
        got = by_charge.pop(cid, [])
        if rec.get("state") not in TERMINAL:
            if got:
                bad(10, cid, "%d events applied for a charge whose record is %s"
                    % (len(got), rec.get("state")))
            continue
        for typ, op in (("charge.finished", "finish"), ("charge.renotified", "renotified")):
            want = sorted(h.get("state") or "DONE" for h in hist if h.get("op") == op)
            have = sorted(e.get("state") or "DONE" for e in got if e.get("type") == typ)
            if want != have and not (len(hist) >= 20 and len(have) > len(want)):
                bad(10, cid, "%s: the record's history says %s, downstream applied %s"
                    % (typ, want, have))
    for cid, evs in by_charge.items():
        bad(10, cid, "%d events applied for a charge with no record" % len(evs))
    return True


def foreign_checks(wl, debits, notes, notes_body, dlq_by_body, left_of, bad):
    """Checks 1, 3 and 4 of another consumer's run (--worker), from what
    the bank's ledger, the gateway and the queues say: it keeps no record
    idemkit can read, and keys its requests as it likes (a notification is
    the charge's by the chargeId in its body)."""
    dlq_ids = {charge_of(b) for b in dlq_by_body}
    noted = {}
    for k in notes:
        noted.setdefault(charge_of(notes_body.get(k)) or k.split(":")[0], []).append(k)
    for c in wl["charges"]:
        cid = c["chargeId"]
        d = debits.get(cid, [])
        if len(d) > 1:
            bad(1, cid, "%d distinct debits at the bank (%s), under keys %s"
                % (len(d), ", ".join(x["ref"] for x in d), [x["key"] for x in d]))
        if not d and cid not in dlq_ids:
            bad(3, cid, "declined at the bank, and not in the DLQ" if c["declined"] else
                "never debited, and not in the DLQ")
        if left_of.get(cid):
            bad(3, cid, "%d copies still in the queue" % left_of[cid])
        ks = noted.get(cid, [])
        if d and len(ks) != 1:
            bad(4, cid, "debited, and notified under %d keys" % len(ks) if ks else
                "debited, and never notified")
        if not d and ks:
            bad(4, cid, "never debited, and notified under %d key(s)" % len(ks))
    for b in wl["poison"]:
        if b not in dlq_by_body:
            bad(3, charge_of(b) or b[:30], "a malformed message is not in the DLQ")


def print_table(v, run):
    print("chaos verdict: %s  (backend %s, seed %d, %d s of faults)"
          % ("VALID" if v["ok"] else "INVALID", v["backend"], v["seed"], v["duration_s"]))
    if v.get("worker"):
        print("  judging another consumer: %s" % v["worker"])
    print("  %d charges, %d copies sent, %d settled, %d debits, %d replays absorbed by the key, "
          "%d in the DLQ, %d notifications (%d retries absorbed by the gateway's key)"
          % (v["charges"], v["copies_sent"], v["settled"], v["debits"], v["replays_absorbed"],
             v["dlq"], v["notifications"], v["notification_retries_absorbed"]))
    d = v["facts"].get("drained_s")
    print("  drained %s after the heal (bound %d s)" %
          ("in %.1f s" % d if d is not None else "NOT", v["facts"]["drain_bound_s"]))
    print("  faults landed: %s" % ", ".join("%s %d" % kv for kv in sorted(v["faults_landed"].items())))
    lat = v.get("settle_latency_s") or {}
    if lat.get("n"):
        print("  %s charges settled a second; sent to settled p50 %.1f s, p99 %.1f s, max %.1f s"
              % (v["settled_per_s"], lat["p50"], lat["p99"], lat["max"]))
    rec = {k: x for k, x in (v.get("recovery_s") or {}).items() if x.get("n")}
    if rec:
        print("  from a fault's heal to what was outstanding then settled (s):")
        print("    %-14s %5s %7s %7s %7s" % ("fault", "heals", "p50", "p99", "max"))
        for k, x in rec.items():
            print("    %-14s %5d %7.1f %7.1f %7.1f" % (k, x["n"], x["p50"], x["p99"], x["max"]))
    print("  replays per fault kind around them: %s" %
          (", ".join("%s %d" % kv for kv in sorted(v["replays_per_fault"].items())) or "none"))
    for inv in v["invariants"]:
        print("  %-4s %d %s%s" % ("ok" if inv["ok"] else "FAIL", inv["n"], inv["name"],
                                  "" if inv["ok"] else "  (%d)" % inv["count"]))
        for x in inv["violations"][:3]:
            print("         %s: %s" % (x["chargeId"], x["why"]))
    for e in v["evidence"][:3]:
        print("  -- %s (invariant %d): %s" % (e["chargeId"], e["invariant"], e["why"]))
        for f in e["faults"][:8]:
            print("     fault %s at +%ss %s" % (f["kind"], f.get("t"),
                                               {k: f[k] for k in f if k not in
                                                ("kind", "t", "ts", "action", "end")}))
        tl = e["timeline"]
        if len(tl) > 30:
            tl = tl[:8] + [None] + tl[-22:]
        for x in tl:
            if x is None:
                print("     ... %d lines more in verdict.json" % (len(e["timeline"]) - 30))
                continue
            ln = x["line"]
            print("     %d %-16s %s" % (x["ts"], x["source"],
                                        " ".join("%s=%s" % (k, ln[k]) for k in
                                                 ("prog", "msg", "outcome", "status", "state",
                                                  "faults", "messageId", "tag", "conn",
                                                  "deliveryCount", "reason", "error") if k in ln)))
    print("  verdict: %s" % os.path.join(run, "verdict.json"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        sys.exit(64)
    run = sys.argv[1]
    old = {}
    try:
        old = json.load(open(os.path.join(run, "verdict.json"))).get("facts", {})
    except (OSError, ValueError):
        pass
    sys.exit(0 if check(run, None, old or {"drained_s": None, "drain_bound_s": 0})["ok"] else 1)
