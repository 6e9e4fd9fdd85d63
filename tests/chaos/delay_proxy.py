"""A TCP relay that delays every byte by a fixed time in each direction: one-way latency.

``python -m tests.chaos.delay_proxy --listen 0.0.0.0:6379 --to 10.18.0.2:6379 --delay-ms 50``

The chaos tests would use ``tc qdisc ... netem delay``, but the kernel they run on is built
without ``sch_netem`` (``CONFIG_NET_SCH_NETEM`` is not set), and Toxiproxy, the usual proxy for
this, is a Go server that neither Debian nor PyPI packages (PyPI has only its clients). So this
relay, run in a network namespace of its own between the clients and Redis, does the one thing
the tests need: each chunk read is written to the other side ``delay`` seconds after it was
read, in order, without holding back the chunks behind it (pipelined traffic keeps flowing, as
on a long link). A connection closed on one side is closed on the other after the same delay.
"""

from __future__ import annotations

import argparse
import asyncio
import time


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it arrived."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        while chunk := await reader.read(65536):
            queue.put_nowait((time.monotonic() + delay, chunk))
        queue.put_nowait((time.monotonic() + delay, b""))

    reading = asyncio.create_task(read())
    try:
        while True:
            due, chunk = await queue.get()
            await asyncio.sleep(max(0.0, due - time.monotonic()))  # the latency itself
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()
    except OSError:
        pass
    finally:
        reading.cancel()
        writer.close()


async def serve(listen: tuple[str, int], target: tuple[str, int], delay: float) -> None:
    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            pipe(client_r, server_w, delay), pipe(server_r, client_w, delay),
            return_exceptions=True,
        )  # fmt: skip

    server = await asyncio.start_server(relay, *listen)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to accept clients on")
    parser.add_argument("--to", required=True, help="HOST:PORT to relay them to")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way latency")
    args = parser.parse_args()
    asyncio.run(serve(address(args.listen), address(args.to), args.delay_ms / 1000))


if __name__ == "__main__":
    main()
