#!/usr/bin/env python3
"""tests/pgsilent.py: a loopback TCP relay in front of a PostgreSQL server
(or a Redis server, in the second mode below)
that stops passing the server's answers on, the connection left open,
once a client has sent MARK (a chargeId among a statement's parameters).
What the client sent still reaches the server, which executes it and
answers; the answer is lost, as a middlebox that keeps a connection and
drops what comes back (a half-failed NAT, a failover that left the
connection behind) would lose it.  TCP sees nothing: this relay's kernel
keeps acknowledging, so keepalives cannot tell; only a bound on the wait
for the answer can.  (No emulator fails this way: a relay that behaves as
such a network would, as the tests' other loopback servers do.)

With MODE "reset-once" (Redis or PostgreSQL), the first connection that
sends MARK has the server's answer dropped and is then reset (RST), as a
middlebox reset after the request went through would leave it: the
server applied what was sent and the client cannot know; later
connections pass everything.

The client must not use TLS (sslmode=disable): MARK is looked for in
the bytes as sent.

usage: pgsilent.py UPSTREAM-PORT PORT-FILE MARK [silent|reset-once]
"""
import asyncio
import os
import socket
import struct
import sys


async def main():
    up_port, port_file, mark = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()
    reset = len(sys.argv) > 4 and sys.argv[4] == "reset-once"
    spent = []      # reset-once: the connection it was spent on

    async def conn(cr, cw):
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", up_port)
        except OSError:
            cw.close()
            return
        silent = asyncio.Event()

        async def up():
            tail = b""
            while True:
                data = await cr.read(65536)
                if not data:
                    break
                if mark in tail + data and not (reset and spent):
                    spent.append(1)
                    silent.set()
                tail = data[-len(mark):]
                uw.write(data)
                await uw.drain()
            uw.close()

        async def down():
            while True:
                data = await ur.read(65536)
                if not data:
                    break
                if not silent.is_set():
                    cw.write(data)
                    await cw.drain()
                elif reset:
                    # the server answered (so it applied it): reset the client
                    sock = cw.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    cw.transport.abort()
                    uw.close()
                    return
            if not silent.is_set():
                cw.close()

        await asyncio.gather(up(), down(), return_exceptions=True)

    srv = await asyncio.start_server(conn, "127.0.0.1", 0)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(srv.sockets[0].getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)
    await srv.serve_forever()


asyncio.run(main())
