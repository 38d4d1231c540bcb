#!/usr/bin/env python3
"""tests/chaos/failover_cost.py: what the failovers of a kept run cost.

For each failover in RUN/nemesis.log: the charges whose finished record
the promoted server did not have at all (the bank had debited them before
the failover, and their record was created after it: the claim, made
before the debit, was lost), those claimed again after it with no finish
before it (a finish lost, or in flight at the failover), the debit
requests replayed at the bank for charges debited before it (absorbed by
the Idempotency-Key), and the time until the first record was finished
again after it (the store's clock and the harness's are the machine's).
Used for docs/RELIABILITY.md's sync vs async figures (chaos.py --pg-async).

usage: failover_cost.py RUN_DIR   (prints one JSON object per failover)
"""
import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checker import jlines   # noqa: E402


def main(run):
    fos = [e["ts"] for e in jlines(os.path.join(run, "nemesis.log"))
           if e.get("kind") == "failover" and e.get("action") == "start"]
    reqs = {}
    for e in jlines(os.path.join(run, "logs", "bank-sim.log")):
        if e.get("msg") == "request" and e.get("path") == "/debits" and e.get("method") == "POST":
            reqs.setdefault(e.get("key"), []).append((e["ts"], e.get("status")))
    recs = {r["chargeId"]: r for r in jlines(os.path.join(run, "records.ndjson"))}
    for fo in fos:
        ok_before = {k for k, v in reqs.items()
                     if any(t < fo and str(s).startswith("2") for t, s in v)}
        replayed = sorted(k for k in ok_before if any(t >= fo for t, _ in reqs[k]))
        lost, again = [], []
        for k in sorted(ok_before):
            r = recs.get(k)
            if not r:
                continue
            h = r.get("history") or []
            if r.get("createdAt", 0) >= fo:
                lost.append(k)     # its claim, made before the debit, was lost
            elif not any(x.get("op") == "finish" and x["at"] < fo for x in h) and any(
                    x.get("op") == "claim" and x["at"] >= fo for x in h):
                again.append(k)    # a finish lost, or never made (in flight at the failover)
        after = [x["at"] for r in recs.values() for x in (r.get("history") or [])
                 if x.get("op") == "finish" and x["at"] >= fo]
        print(json.dumps({"failover_ts": fo, "debited_before": len(ok_before),
                          "records_lost": len(lost), "lost": lost[:20],
                          "claimed_again": len(again),
                          "debits_replayed": len(replayed),
                          "first_finish_after_s": round((min(after) - fo) / 1000, 1)
                          if after else None}))


if __name__ == "__main__":
    main(sys.argv[1])
