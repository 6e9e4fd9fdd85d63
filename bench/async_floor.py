"""The raw redis-py floor of ``bench.async_throughput``: the least an async hook consumer can do.

One process is one consumer of its own group, started by the benchmark (never by hand)::

    python -m bench.async_floor URL STREAM GROUP READY_KEY

It creates ``GROUP`` on ``STREAM`` at ``$`` (as a HookBus async worker does), pushes its group
name to ``READY_KEY`` once it reads, then loops: ``XREADGROUP COUNT 100 BLOCK 200`` → decode the
JSON of each entry's ``data`` field with msgspec (into plain dicts) → one pipelined ``XACK`` of
the batch. Same client library (``redis.asyncio``) and batch size as HookBus; no validation, no
typed decoding, no task per event, no timeout, no heartbeat, no claiming.

It exits when its parent does (it is only ever a child of the benchmark).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import msgspec
from redis.asyncio import Redis
from redis.exceptions import ResponseError

BATCH = 100  # HookBus's default --batch
BLOCK_MS = 200  # what AsyncHookWorker uses; it only bounds how fast a stop is noticed
DATA = b"data"


async def consume(url: str, stream: str, group: str, ready_key: str) -> None:
    parent = os.getppid()
    redis = Redis.from_url(url)
    try:
        await redis.xgroup_create(stream, group, id="$", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    consumer = f"floor-{os.getpid()}"
    decode = msgspec.json.decode
    await redis.rpush(ready_key, group)
    handled = 0
    while os.getppid() == parent:
        response: Any = await redis.xreadgroup(
            group, consumer, {stream: ">"}, count=BATCH, block=BLOCK_MS
        )
        for _, entries in response or ():
            ids = []
            for entry_id, fields in entries:
                decode(fields[DATA])
                ids.append(entry_id)
            async with redis.pipeline(transaction=False) as pipe:
                pipe.xack(stream, group, *ids)
                await pipe.execute()
            handled += len(ids)
    print(f"floor consumer {group}: {handled} events", flush=True)
    await redis.aclose()


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    asyncio.run(consume(*argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
