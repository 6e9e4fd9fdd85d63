"""HookBus's pytest plugin: a hook author's contract test as fixtures, with nothing to set up.

Installed with HookBus and registered through the ``pytest11`` entry point (pyproject.toml),
so an author's test file needs no conftest and no asyncio plugin::

    def test_contract(hookbus_serve):
        hooks = hookbus_serve("acme_hooks.no_secrets:NoSecrets")
        result = hooks.run("PreToolUse", tool_args={"path": ".env"})
        assert result.is_blocked

``hookbus_redis``
    The URL of a private ``redis-server`` on a free port, started at the first test that asks
    for it and stopped at the end of the session. Override the fixture (in a conftest) to use
    a Redis of your own.
``hookbus_serve``
    A function: ``hookbus_serve(*targets, timeout=30, cwd=None)`` serves each target (what
    follows ``hookbus worker``) with its own ``hookbus worker`` process on that Redis, under a
    key prefix of its own (no test sees another's hooks), and returns once each is live: the
    contract of ``workers.testing.served``, as a ``workers.testing.ServedHooks``
    (``run(event, **context fields)``; ``await ask(...)`` in an async test). The workers
    stop when the test ends; one that exits or does not come up fails the test with its log.

Fixtures only: no hook, no option and nothing autouse, so the plugin changes no other test
session it is loaded into (``-p no:hookbus`` leaves it out). It imports HookBus only when a
fixture is used.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from workers.testing import ServedHooks, Target


@pytest.fixture(scope="session")
def hookbus_redis() -> Iterator[str]:
    """The URL of a private redis-server for this test session."""
    from workers.local.redis_server import RedisServer

    with RedisServer() as server:
        yield server.url


@pytest.fixture
def hookbus_serve(hookbus_redis: str) -> Iterator[Callable[..., ServedHooks]]:
    """``hookbus_serve("pkg.module:Hook", ...)``: hook services, live, stopped after the test."""
    from workers.testing import ServedHooks

    started: list[ServedHooks] = []

    def serve(*targets: Target, **options: Any) -> ServedHooks:
        prefix = f"test{os.getpid()}-{len(started)}-{os.urandom(3).hex()}"
        hooks = ServedHooks(targets, redis_url=hookbus_redis, prefix=prefix, **options)
        started.append(hooks)
        return hooks

    yield serve
    for hooks in reversed(started):
        hooks.close()
