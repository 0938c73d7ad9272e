"""An echo pair on Python's asyncio (its selector loop: epoll).

    asyncio_echo.py server PORT N       echo; exit after N connections ended
    asyncio_echo.py client HOST PORT N  N connections at once, each sending
                                        its own random bytes (0 to 300,000)
                                        then EOF; every echo checked
"""
import asyncio
import hashlib
import os
import sys


async def serve(port, n):
    ended = 0
    done = asyncio.Event()

    async def echo(reader, writer):
        nonlocal ended
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()
        ended += 1
        if ended == n:
            done.set()

    server = await asyncio.start_server(echo, "0.0.0.0", port)
    print("ready", flush=True)
    await done.wait()
    server.close()
    print(f"ok asyncio server: {n} connections echoed", flush=True)


async def one(host, port, i):
    size = (i * 7919) % 300_001
    payload = os.urandom(size)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(payload)
    await writer.drain()
    writer.write_eof()
    got = await reader.read()
    writer.close()
    if got != payload:
        raise SystemExit(
            f"fail connection {i}: sent {size} bytes "
            f"({hashlib.sha256(payload).hexdigest()[:12]}), "
            f"got {len(got)} ({hashlib.sha256(got).hexdigest()[:12]})"
        )
    return size


async def clients(host, port, n):
    sizes = await asyncio.gather(*(one(host, port, i) for i in range(n)))
    print(f"ok asyncio clients: {n} connections, {sum(sizes)} bytes echoed", flush=True)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "server":
        asyncio.run(serve(int(sys.argv[2]), int(sys.argv[3])))
    elif len(sys.argv) == 5 and sys.argv[1] == "client":
        asyncio.run(clients(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
    else:
        raise SystemExit(__doc__)


main()
