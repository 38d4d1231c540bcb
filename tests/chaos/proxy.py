#!/usr/bin/env python3
"""tests/chaos/proxy.py: the userspace link faults of the chaos campaign.

The kernel here has no sch_netem, so latency, loss, reordering,
duplication, resets mid-body and truncated or huge answers are made by
this proxy, which sits on the link in front of a server, inside the
server's network namespace, and reads its faults from a JSON control file
the nemesis rewrites (checked every 100 ms).

Two modes:
  tcp   bytes are copied both ways; faults: latency (+ jitter, which
        reorders data across connections), loss (a chunk held back for a
        retransmission time, 200-1000 ms, as TCP would recover it), reset
        (the connection aborted with RST at a random moment).
  http  (the bank and the notification gateway, TLS on both sides) one
        request at a time per client connection, each on a fresh upstream
        connection; on top of the tcp faults: dup (the request sent twice
        upstream, as a retrying middlebox would; the second answer is
        dropped), reorder (a random hold of 0-2 s per request so later
        requests overtake), reset_mid_body (answer headers and half the
        body, then RST), truncate (half the body, then FIN), huge (a 2xx
        answer padded with 4 MiB of JSON whitespace), token_down (POST
        /oauth/token answered 503 without reaching the bank), unauthorized
        (a 401 storm: every other request answered 401), legacy_ref (a
        debit's 2xx whose ref carries the branch's name in ISO-8859-1, as
        the bank's legacy core system writes it; logged as latin1-ref).
        Always: one
        refusal's reason in four re-encoded in ISO-8859-1 (a legacy core
        system's; logged as the fault latin1), and every answer 50-250 ms
        on its way back.
Every request and the fault applied to it is logged as one JSON line.

usage: proxy.py --listen HOST:PORT --upstream HOST:PORT --control FILE
                --log FILE --seed N [--mode tcp|http] [--cert C --key K]
"""
import argparse
import asyncio
import json
import os
import random
import socket
import ssl
import struct
import sys
import time

CTL = {}


def now_ms():
    return int(time.time() * 1000)


async def watch_control(path):
    global CTL
    mtime = None
    while True:
        try:
            m = os.stat(path).st_mtime_ns
            if m != mtime:
                with open(path) as f:
                    CTL = json.load(f)
                mtime = m
        except (OSError, ValueError):
            pass
        await asyncio.sleep(0.1)


# The bank is a legacy core system: the reason of one refusal in four
# comes in ISO-8859-1, not UTF-8 (always, not a fault the nemesis draws).
LEGACY = 0.25
# And not instant: every answer 50-250 ms on its way back (bank-sim's own
# answers take a millisecond), so a stop or a crash can find one in flight.
ANSWER_MS = (50, 250)


def legacy(body):
    try:
        o = json.loads(body)
        o["reason"] = "Auftrag nicht ausgef\u00fchrt (%s)" % o.get("reason", "")
        return json.dumps(o, ensure_ascii=False).encode("latin-1")
    except (ValueError, UnicodeError, AttributeError):
        return body


# The branch a legacy core system names in its references, and how it
# writes it: ISO-8859-1, one byte (0xFC) that is never valid UTF-8.
BRANCH = "/M\u00fcnchen"


def legacy_ref(body):
    try:
        o = json.loads(body)
        if not isinstance(o.get("ref"), str):
            return None
        o["ref"] += BRANCH
        return json.dumps(o, ensure_ascii=False).encode("latin-1")
    except (ValueError, UnicodeError, AttributeError):
        return None


def p(name):
    return float(CTL.get(name, 0) or 0)


def abort(writer):
    """Close with RST (SO_LINGER 0), as a middlebox reset would."""
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


async def delay(rng):
    lat = p("latency_ms") + rng.random() * p("jitter_ms")
    if rng.random() < p("loss"):
        lat += 200 + rng.random() * 800
    if lat > 0:
        await asyncio.sleep(lat / 1000)


class Proxy:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.log = open(a.log, "a", buffering=1)
        self.n = 0
        uh, up = a.upstream.rsplit(":", 1)
        self.up = (uh, int(up))
        self.up_ssl = None
        self.srv_ssl = None
        if a.cert:
            self.srv_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.srv_ssl.load_cert_chain(a.cert, a.key)
            self.up_ssl = ssl.create_default_context(cafile=a.cert)
            self.up_ssl.check_hostname = False

    def note(self, **kw):
        kw["ts"] = now_ms()
        self.log.write(json.dumps(kw) + "\n")

    # ---- tcp mode ----------------------------------------------------
    async def pipe(self, r, w, rng, cid, way):
        try:
            while True:
                data = await r.read(65536)
                if not data:
                    break
                await delay(rng)
                if rng.random() < p("reset") / 20:
                    self.note(conn=cid, fault="reset", way=way)
                    abort(w)
                    return
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        try:
            w.close()
        except Exception:
            pass

    async def tcp(self, cr, cw):
        self.n += 1
        cid = self.n
        rng = random.Random(self.rng.random())
        try:
            ur, uw = await asyncio.wait_for(asyncio.open_connection(*self.up), 5)
        except (OSError, asyncio.TimeoutError):
            abort(cw)
            return
        await asyncio.gather(self.pipe(cr, uw, rng, cid, "up"),
                             self.pipe(ur, cw, rng, cid, "down"))

    # ---- http mode ---------------------------------------------------
    @staticmethod
    async def read_msg(r):
        head = await r.readuntil(b"\r\n\r\n")
        n = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                n = int(v.strip())
        body = await r.readexactly(n) if n else b""
        return head, body

    async def upstream(self, head, body):
        ur, uw = await asyncio.wait_for(
            asyncio.open_connection(*self.up, ssl=self.up_ssl), 5)
        try:
            uw.write(head + body)
            await uw.drain()
            return await asyncio.wait_for(self.read_msg(ur), 60)
        finally:
            uw.close()

    async def http(self, cr, cw):
        self.n += 1
        cid = self.n
        rng = random.Random(self.rng.random())
        try:
            while True:
                try:
                    head, body = await self.read_msg(cr)
                except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
                    break
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                key = ""
                for h in head.split(b"\r\n")[1:]:
                    k, _, v = h.partition(b":")
                    if k.strip().lower() == b"idempotency-key":
                        key = v.strip().decode("latin-1")
                faults = []
                await delay(rng)
                if rng.random() < p("reorder"):
                    faults.append("reorder")
                    await asyncio.sleep(rng.random() * 2)
                if CTL.get("token_down") and "/oauth/token" in line:
                    faults.append("token_down")
                    self.note(conn=cid, req=line, key=key, faults=faults)
                    msg = b'{"error":"temporarily_unavailable"}'
                    cw.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(msg), msg))
                    await cw.drain()
                    continue
                if CTL.get("unauthorized") and "/oauth/token" not in line:
                    faults.append("unauthorized")
                    self.note(conn=cid, req=line, key=key, faults=faults)
                    msg = b'{"error":"invalid_token"}'
                    cw.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(msg), msg))
                    await cw.drain()
                    continue
                if rng.random() < p("dup") and line.startswith("POST"):
                    faults.append("dup")
                    try:
                        await self.upstream(head, body)
                    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
                        pass
                try:
                    rhead, rbody = await self.upstream(head, body)
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
                    self.note(conn=cid, req=line, key=key, faults=faults + ["upstream:" + type(e).__name__])
                    abort(cw)
                    return
                status = rhead.split(b" ", 2)[1].decode("latin-1") if b" " in rhead else "?"
                # the way back from a real core system takes time: an
                # answer is on the wire while the step waits for it
                await asyncio.sleep(rng.uniform(*ANSWER_MS) / 1000)
                if status[:1] in "45" and "/oauth/" not in line and rng.random() < LEGACY:
                    faults.append("latin1")
                    rbody = legacy(rbody)
                    rhead = b"\r\n".join(h for h in rhead[:-4].split(b"\r\n") if not
                                          h.lower().startswith(b"content-length")) + \
                        b"\r\nContent-Length: %d\r\n\r\n" % len(rbody)
                if status[:1] == "2" and "/debits" in line and p("legacy_ref") and \
                        rng.random() < p("legacy_ref"):
                    nbody = legacy_ref(rbody)
                    if nbody is not None:
                        faults.append("latin1-ref")
                        rbody = nbody
                        rhead = b"\r\n".join(h for h in rhead[:-4].split(b"\r\n") if not
                                              h.lower().startswith(b"content-length")) + \
                            b"\r\nContent-Length: %d\r\n\r\n" % len(rbody)
                await delay(rng)
                x = rng.random()
                if x < p("reset_mid_body"):
                    faults.append("reset_mid_body")
                    self.note(conn=cid, req=line, key=key, status=status, faults=faults)
                    cw.write(rhead + rbody[: len(rbody) // 2])
                    await cw.drain()
                    abort(cw)
                    return
                x -= p("reset_mid_body")
                if x < p("truncate"):
                    faults.append("truncate")
                    self.note(conn=cid, req=line, key=key, status=status, faults=faults)
                    cw.write(rhead + rbody[: len(rbody) // 2])
                    await cw.drain()
                    cw.close()
                    return
                x -= p("truncate")
                if x < p("huge") and status.startswith("2"):
                    faults.append("huge")
                    rbody = rbody + b" " * (4 << 20)
                    lines = [h for h in rhead[:-4].split(b"\r\n")
                             if not h.lower().startswith(b"content-length")]
                    rhead = b"\r\n".join(lines) + b"\r\nContent-Length: %d\r\n\r\n" % len(rbody)
                self.note(conn=cid, req=line, key=key, status=status, faults=faults)
                cw.write(rhead + rbody)
                await cw.drain()
        except (ConnectionError, OSError):
            pass
        try:
            cw.close()
        except Exception:
            pass

    async def main(self):
        h, port = self.a.listen.rsplit(":", 1)
        handler = self.http if self.a.mode == "http" else self.tcp
        srv = await asyncio.start_server(handler, h, int(port), ssl=self.srv_ssl,
                                         reuse_address=True)
        asyncio.ensure_future(watch_control(self.a.control))
        print("listening", self.a.listen, flush=True)
        async with srv:
            await srv.serve_forever()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--control", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", default="tcp", choices=["tcp", "http"])
    ap.add_argument("--cert")
    ap.add_argument("--key")
    a = ap.parse_args()
    try:
        asyncio.run(Proxy(a).main())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
