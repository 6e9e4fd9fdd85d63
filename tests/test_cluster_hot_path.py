"""The hot path on a Redis Cluster: :func:`bus.transport.redis_io.pipelined` sends each node's
commands through a plain client of that node, routed by the cluster client's slot map, and a
task that holds connections (``held_connection``) keeps one per node.

Against the session's private cluster (``redis_cluster`` in conftest.py): real nodes, real
MOVED redirections.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import RedisCluster

from bus.protocol import DATA_FIELD
from bus.settings import BusSettings
from bus.transport.keys import Keys
from bus.transport.redis_io import close, connect, held_connection, pipelined, release_held

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


async def test_a_task_keeps_one_connection_per_node_and_a_stale_slot_map_is_redirected(
    cluster_settings: BusSettings,
) -> None:
    settings = BusSettings(
        redis_url=cluster_settings.redis_url, prefix=cluster_settings.prefix, partitions=3
    )
    keys = Keys.of(settings)
    redis = connect(settings)
    cluster: Any = redis
    assert isinstance(cluster, RedisCluster)
    streams = keys.event_partitions  # one on each master
    inbox = keys.inbox("hot-path")
    commands = [
        *(("XADD", s, "*", DATA_FIELD, b"e") for s in streams),
        ("RPUSH", inbox, b"r1"),
        ("XLEN", streams[0]),
    ]
    held = await held_connection(redis)
    try:
        await cluster.initialize()
        masters = {cluster.get_node_from_key(s).name for s in streams}
        assert len(masters) == 3

        first = await pipelined(redis, commands, held)
        assert all(isinstance(r, bytes) and b"-" in r for r in first[:3]), first
        assert first[3:] == [1, 1]
        assert len(held) == 3  # one connection per node it sent to
        kept = {address: id(conn) for address, (_, conn) in held.items()}
        second = await pipelined(redis, commands, held)
        assert second[3:] == [2, 2]
        assert {address: id(conn) for address, (_, conn) in held.items()} == kept

        # A slot map gone stale (a failover or a resharding moved the inbox's slot): the node
        # the client wrongly picks answers MOVED, the command did not run; it is sent again
        # where it belongs, once, and the map is learned anew.
        slot = cluster.keyslot(inbox)
        right = cluster.nodes_manager.slots_cache[slot]
        wrong = next(cluster.get_node_from_key(s) for s in streams if
                     cluster.get_node_from_key(s).name != right[0].name)  # fmt: skip
        cluster.nodes_manager.slots_cache[slot] = [wrong]
        assert await pipelined(redis, [("RPUSH", inbox, b"r3")], held) == [3]
        assert await redis.lrange(inbox, 0, -1) == [b"r1", b"r1", b"r3"]
        assert cluster.get_node_from_key(inbox).name == right[0].name

        await release_held(redis, held)
        assert not held
        unheld = await pipelined(redis, [("LLEN", inbox)])  # each node's pool, given back
        assert unheld == [3]
    finally:
        await redis.delete(inbox, *streams)
        await close(redis)
