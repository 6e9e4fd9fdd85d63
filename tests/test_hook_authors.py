"""What a hook author's first week ran into (issue 17, items 1-5): an author's own package, in
a directory of its own outside this repository, run with the installed ``hookbus`` console
script against a real redis-server, as the guide (docs/writing-hooks.md) says to."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from bus import CONTINUE, AgentHook, AsyncAgentHook, Block, HookEvent, HookRegistry
from bus.errors import ConfigError
from bus.settings import BusSettings, HookSettings
from bus.transport.keys import Keys
from tests.harness import until, wait_for, worker_env

TIMEOUT = 60
#: The console script pip installed beside this Python (not ``python -m``, which would put the
#: current directory on sys.path by itself).
HOOKBUS = str(Path(sys.executable).with_name("hookbus"))

GUARD = """
from bus import AgentHook, Block, HookEvent


class Guard(AgentHook):
    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    async def pre_tool_use(self, ctx):
        return Block(reason="guarded")
"""


def author_package(root: Path, name: str = "acme_hooks", **modules: str) -> Path:
    """``root/name/`` with an ``__init__.py`` and one file per module (``guard`` by default)."""
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for module, source in (modules or {"guard": GUARD}).items():
        (package / f"{module}.py").write_text(textwrap.dedent(source))
    return root


def env(settings: BusSettings, **extra: str) -> dict[str, str]:
    out = worker_env(settings, **extra)
    out.pop("PYTHONPATH", None)  # only what the console script itself puts on the path
    return out


def run(settings: BusSettings, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HOOKBUS, *args], cwd=cwd, env=env(settings), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve(
    procs: list[subprocess.Popen[str]], settings: BusSettings, cwd: Path, *args: str
) -> subprocess.Popen[str]:
    log = (cwd / f"worker-{len(procs)}.log").open("w")
    proc = subprocess.Popen(
        [HOOKBUS, "worker", *args], cwd=cwd, env=env(settings), stdin=subprocess.DEVNULL,
        stdout=log, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    log.close()
    procs.append(proc)
    return proc


def wait_registered(settings: BusSettings, cwd: Path, proc: subprocess.Popen[str], *check: str):
    """Until ``hookbus worker … --check`` passes (the worker registered and beats)."""

    def live() -> bool:
        assert proc.poll() is None, (cwd / "worker-0.log").read_text()
        return run(settings, cwd, "worker", *check, "--check").returncode == 0

    until(live, f"{check} to be live", TIMEOUT, lambda: (cwd / "worker-0.log").read_text())


# -- item 1: the author's package imports from the current directory, or --app-dir -------------


@pytest.mark.redis
def test_worker_imports_the_authors_package_from_the_current_directory(
    bus_settings: BusSettings, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    # Before the fix: "No module named 'acme_hooks'", exit status 2, from the package's own dir.
    home = author_package(tmp_path / "project")
    proc = serve(started, bus_settings, home, "acme_hooks.guard:Guard")
    wait_registered(bus_settings, home, proc, "acme_hooks.guard:Guard")


@pytest.mark.redis
def test_worker_imports_from_app_dir(
    bus_settings: BusSettings, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    home = author_package(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = ("acme_hooks.guard:Guard", "--app-dir", str(home))
    proc = serve(started, bus_settings, elsewhere, *target)
    wait_registered(bus_settings, elsewhere, proc, *target)


def test_an_import_failure_says_where_python_looked_and_what_was_meant(
    bus_settings: BusSettings, tmp_path: Path
) -> None:
    home = author_package(tmp_path / "project")
    (home / "acme_hooks" / "needs.py").write_text("import not_installed_anywhere\n")

    def error(target: str) -> str:
        result = run(bus_settings, home, "worker", target)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        return result.stderr

    wrong_package = error("acme_hook.guard:Guard")
    assert "No module named 'acme_hook'" in wrong_package
    assert "did you mean 'acme_hooks'?" in wrong_package
    assert f"looked in (sys.path): {home}," in wrong_package
    assert "--app-dir" in wrong_package

    wrong_module = error("acme_hooks.gaurd:Guard")
    assert "did you mean 'acme_hooks.guard'?" in wrong_module
    assert f"package acme_hooks ({home / 'acme_hooks'}) has no module 'gaurd'" in wrong_module

    wrong_class = error("acme_hooks.guard:Gaurd")
    assert "has no 'Gaurd'" in wrong_class and "did you mean 'Guard'?" in wrong_class

    missing_dependency = error("acme_hooks.needs:Guard")
    assert "imports 'not_installed_anywhere', which is not installed" in missing_dependency

    not_a_hook = error("acme_hooks.guard:Block")
    assert "not a subclass of AgentHook or AsyncAgentHook" in not_a_hook

    no_dir = run(bus_settings, home, "worker", "acme_hooks.guard:Guard", "--app-dir", "nowhere")
    assert no_dir.returncode == 2 and "--app-dir nowhere: no such directory" in no_dir.stderr


# -- item 2: a misspelt hook method, or a subscribed event without one, is refused at load -----


class Misspelt(AgentHook):
    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    async def pre_tooluse(self, ctx: Any) -> Any:
        return Block(reason="never runs")


class SpecSpelling(AgentHook):
    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    async def on_pre_tool_use(self, ctx: Any) -> Any:
        return Block(reason="never runs")


class SyncNameOnAsync(AsyncAgentHook):
    subscribed_events = (HookEvent.POST_TOOL_USE,)

    async def post_tool_use(self, ctx: Any) -> None:
        raise AssertionError("never runs")


class AsyncNameOnSync(AgentHook):
    async def on_session_stop_async(self, ctx: Any) -> None:
        raise AssertionError("never runs")


class SubscribedWithoutMethod(AgentHook):
    subscribed_events = (HookEvent.PRE_TOOL_USE, HookEvent.POST_TOOL_USE)

    async def pre_tool_use(self, ctx: Any) -> Any:
        return CONTINUE


class BatchesWithoutOnBatch(AsyncAgentHook):
    handles_batches = True


class WithHelpers(AgentHook):
    """Helpers that do not look like hook methods, or are private, are fine."""

    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    async def pre_tool_use(self, ctx: Any) -> Any:
        await self.post_to_slack()
        return CONTINUE

    async def post_to_slack(self) -> None:
        return None

    async def _on_error(self) -> None:
        return None


REFUSED = [
    (Misspelt, "pre_tooluse() is not a method an AgentHook is called with: did you mean "
     "'pre_tool_use'?"),
    (SpecSpelling, "on_pre_tool_use() is not a method an AgentHook is called with: did you "
     "mean 'pre_tool_use'?"),
    (SyncNameOnAsync, "post_tool_use() is not a method an AsyncAgentHook is called with: did "
     "you mean 'on_post_tool_use_async'?"),
    (AsyncNameOnSync, "on_session_stop_async() is not a method an AgentHook is called with: "
     "did you mean 'on_session_stop'?"),
    (SubscribedWithoutMethod, "it subscribes to PostToolUse but does not implement "
     "post_tool_use()"),
    (BatchesWithoutOnBatch, "handles_batches is set but on_batch() is not implemented"),
]  # fmt: skip


@pytest.mark.parametrize(("hook", "said"), REFUSED, ids=[h.__name__ for h, _ in REFUSED])
def test_the_embedded_registry_refuses_what_would_never_run(hook: type, said: str) -> None:
    registry = HookRegistry()
    add = registry.add_async if issubclass(hook, AsyncAgentHook) else registry.add
    with pytest.raises(ConfigError) as refused:
        add(hook())
    assert f"hook {hook.__name__} would silently never run some of its code" in str(refused.value)
    assert said in str(refused.value)
    if not issubclass(hook, AsyncAgentHook):
        with pytest.raises(ConfigError, match="never run"):
            registry.add_session_hook("s1", hook())
    assert registry.specs() == []


def test_helpers_that_do_not_look_like_hook_methods_are_accepted() -> None:
    assert HookRegistry().add(WithHelpers()).name == "WithHelpers"


def test_hookbus_worker_refuses_what_would_never_run(
    bus_settings: BusSettings, tmp_path: Path
) -> None:
    home = author_package(tmp_path / "project", misspelt=MISSPELT)
    result = run(bus_settings, home, "worker", "acme_hooks.misspelt:Guard")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "did you mean 'pre_tool_use'?" in result.stderr
    assert "it subscribes to PreToolUse but does not implement pre_tool_use()" in result.stderr
    redis = Redis.from_url(bus_settings.redis_url)
    try:  # refused before it registered
        assert not redis.exists(Keys(bus_settings.prefix).replicas("Guard"))
    finally:
        redis.close()


MISSPELT = """
from bus import AgentHook, Block, HookEvent


class Guard(AgentHook):
    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    async def pre_tooluse(self, ctx):
        return Block(reason="guarded")
"""


# -- item 4: constructor arguments through hookbus worker --set / --config ---------------------

CONFIGURABLE = """
from bus import CONTINUE, AgentHook, Block, HookEvent


class PathGuard(AgentHook):
    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    def __init__(self, paths: list[str], reason: str = "not there", strict: bool = False):
        self.paths, self.reason, self.strict = tuple(paths), reason, strict

    async def pre_tool_use(self, ctx):
        path = str(ctx.tool_args.get("path", ""))
        if path.startswith(self.paths) or (self.strict and not path):
            return Block(reason=f"{self.reason} (strict={self.strict})")
        return CONTINUE
"""


async def ask(settings: BusSettings, name: str, path: str) -> Any:
    """One PreToolUse for ``path`` through the hook service ``name``, once it is live."""
    from agent_adapter.client import HookClient
    from workers.testing import context

    client = await HookClient(settings, HookSettings(hook_timeout_secs=10)).start()
    try:
        await wait_for(lambda: client.directory.live(name), TIMEOUT, f"{name} live")
        return await client.run_pre_tool_use(context("PreToolUse", tool_args={"path": path}))
    finally:
        await client.close()


@pytest.mark.redis
async def test_worker_passes_set_and_config_to_the_hook_constructor(
    bus_settings: BusSettings, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    home = author_package(tmp_path / "project", guard=CONFIGURABLE)
    (home / "guard.json").write_text('{"paths": ["ignored/"], "reason": "from the file"}')
    serve(
        started, bus_settings, home, "acme_hooks.guard:PathGuard", "--config", "guard.json",
        "--set", 'paths=["secrets/", "keys/"]', "--set", "strict=true",
    )  # fmt: skip
    blocked = await ask(bus_settings, "PathGuard", "keys/id.pem")
    assert blocked.is_blocked, (home / "worker-0.log").read_text()
    assert blocked.action.reason == "from the file (strict=True)"  # --set wins, JSON values
    assert not (await ask(bus_settings, "PathGuard", "ignored/x")).is_blocked


def test_worker_says_which_constructor_arguments_a_hook_takes(
    bus_settings: BusSettings, tmp_path: Path
) -> None:
    home = author_package(tmp_path / "project", guard=CONFIGURABLE)
    (home / "list.json").write_text("[1, 2]")

    def error(*args: str) -> str:
        result = run(bus_settings, home, "worker", "acme_hooks.guard:PathGuard", *args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        return result.stderr

    missing = error()
    assert "missing a required argument: 'paths'" in missing
    assert "PathGuard takes: paths: list[str], reason: str = 'not there', strict: bool = False" in (
        missing
    )
    assert "unexpected keyword argument 'reasons'" in error(
        "--set", "paths=[]", "--set", "reasons=x"
    )
    assert "--set 'paths' must look like name=value" in error("--set", "paths")
    assert "must hold a JSON object" in error("--config", "list.json")
    assert "--config nope.json: No such file or directory" in error("--config", "nope.json")


# -- item 5: served() waits for each hook it starts --------------------------------------------

SLOW_START = """
import time

from bus import AgentHook, Block, HookEvent

time.sleep(3)  # a slow import: the other hook is live long before this one


class SlowStart(AgentHook):
    name = "SlowToStart"
    subscribed_events = (HookEvent.PRE_TOOL_USE,)

    async def pre_tool_use(self, ctx):
        if ctx.tool_name == "file_write":
            return Block(reason="slow but there")
"""

RECORDS = """
from bus import AsyncAgentHook, HookEvent


class Records(AsyncAgentHook):
    name = "EventRecords"
    subscribed_events = (HookEvent.POST_TOOL_USE,)

    def __init__(self, path: str):
        self.path = path

    async def on_post_tool_use_async(self, ctx):
        with open(self.path, "a") as f:
            f.write(ctx.tool_name + "\\n")
"""


@pytest.mark.redis
async def test_served_waits_for_each_of_its_hooks(
    bus_settings: BusSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.testing import context, served

    home = author_package(tmp_path / "project", guard=GUARD, slow=SLOW_START, records=RECORDS)
    monkeypatch.chdir(home)  # where the workers import from, as an author's test runs
    seen = tmp_path / "seen.txt"
    targets = (
        "acme_hooks.guard:Guard",
        "acme_hooks.slow:SlowStart",
        ["acme_hooks.records:Records", "--set", f"path={seen}"],
    )
    async with served(*targets, redis_url=bus_settings.redis_url) as hooks:
        # No waiting here: every hook is live, the slow one and the async one too.
        write = context("PreToolUse", tool_name="file_write", tool_args={"path": "x"})
        result = await hooks.run_pre_tool_use(write)
        assert result.is_blocked
        assert {e.hook_name for e in result.blocking_errors} == {"Guard", "SlowToStart"}
        await hooks.run_post_tool_use(context("PostToolUse", tool_name="search"))
        await wait_for(lambda: seen.exists() and seen.read_text() == "search\n", 30, "records")


async def test_served_fails_with_the_workers_log_when_one_does_not_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.testing import served

    home = author_package(tmp_path / "project", guard=GUARD, misspelt=MISSPELT)
    monkeypatch.chdir(home)
    with pytest.raises(RuntimeError) as failed:
        async with served("acme_hooks.guard:Guard", "acme_hooks.misspelt:Guard"):
            raise AssertionError("not reached")
    assert "`hookbus worker acme_hooks.misspelt:Guard` did not start" in str(failed.value)
    assert "did you mean 'pre_tool_use'?" in str(failed.value)


def test_a_password_put_into_the_url_is_never_shown() -> None:
    """HOOKBUS_REDIS_PASSWORD goes into the URL (bus.settings.with_password), a unix socket's in
    its query: every line that shows the URL hides it."""
    from bus.settings import BusSettings, redacted

    for url in ("redis://worker@redis:6379/0", "unix:///run/redis.sock?db=0"):
        settings = BusSettings.from_env(
            {"HOOKBUS_REDIS_URL": url, "HOOKBUS_REDIS_PASSWORD": "s3&c:r@t"}
        )
        assert "s3" not in redacted(settings.redis_url) and "***" in redacted(settings.redis_url)


# -- issue 35, item 16: the contract test as pytest fixtures (workers/pytest_plugin.py) ---------

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "writing-hooks.md"


def guide_file(path: str) -> str:
    """The block docs/writing-hooks.md saves as ``path``."""
    block = rf"<!-- file: {re.escape(path)} -->\n```\w+\n(.*?)```\n"
    (code,) = re.findall(block, GUIDE.read_text(), re.S)
    return code


def author_pytest(project: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``python -m pytest -q tests`` in the author's project, as the guide runs it: the
    installed package's plugin, no conftest, no PYTHONPATH, no pytest configuration of ours."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HOOKBUS_", "PYTEST_"))}
    environ.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, "tests"],
        cwd=project,
        env=environ, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip


@pytest.mark.redis
@pytest.mark.timeout(600)
def test_the_guides_tests_pass_with_the_plugins_fixtures_and_fail_on_a_broken_hook(
    tmp_path: Path,
) -> None:
    hook = guide_file("acme_hooks/no_secrets.py")
    project = author_package(tmp_path / "project", no_secrets=hook)
    (project / "tests").mkdir()
    tests = guide_file("tests/test_no_secrets.py")
    assert "hookbus_serve" in tests and "import pytest" not in tests
    (project / "tests" / "test_no_secrets.py").write_text(tests)
    assert not list(project.rglob("conftest.py"))

    passed = author_pytest(project)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert re.search(r"^2 passed", passed.stdout, re.M), passed.stdout

    # The same tests against a hook that lets secrets through: both fail, the contract test on
    # what the hook service answered.
    leaky = hook.replace("if path.endswith(self.suffixes)", "if False")
    assert leaky != hook
    (project / "acme_hooks" / "no_secrets.py").write_text(leaky)
    failed = author_pytest(project)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert re.search(r"^2 failed", failed.stdout, re.M), failed.stdout
    assert "FAILED tests/test_no_secrets.py::test_contract" in failed.stdout
    # -p no:hookbus leaves the plugin out, as the guide says.
    left_out = author_pytest(project, "-p", "no:hookbus")
    assert "fixture 'hookbus_serve' not found" in left_out.stdout, left_out.stdout


def test_the_plugin_has_fixtures_only_and_imports_hookbus_lazily() -> None:
    """Loaded into every pytest session of an environment HookBus is installed in (this
    project's too): nothing autouse, no hooks, and HookBus imported only by a fixture."""
    import ast
    import importlib.metadata

    (entry,) = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "hookbus"]
    assert entry.value == "workers.pytest_plugin"
    source = Path(__file__).resolve().parent.parent / "workers" / "pytest_plugin.py"
    tree = ast.parse(source.read_text())
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert {f.name for f in functions} == {"hookbus_redis", "hookbus_serve"}
    for function in functions:
        (decorator,) = function.decorator_list
        assert "fixture" in ast.unparse(decorator) and "autouse" not in ast.unparse(decorator)
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    top = {a.name for n in imports for a in n.names}
    top |= {n.module for n in imports if isinstance(n, ast.ImportFrom)}
    assert not any(str(name).startswith(("bus", "workers", "agent_adapter")) for name in top), top


@pytest.mark.redis
async def test_served_hooks_answer_an_async_test_and_stop_once(
    bus_settings: BusSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``hookbus_serve`` returns, awaited from a test's own event loop (its client lives on
    a loop of its own), and closed twice: once by the test, once by the fixture."""
    from workers.testing import ServedHooks

    home = author_package(tmp_path / "project")
    monkeypatch.chdir(home)
    url, prefix = bus_settings.redis_url, bus_settings.prefix
    hooks = ServedHooks(["acme_hooks.guard:Guard"], redis_url=url, prefix=prefix)
    replicas = Keys(prefix).replicas("Guard")
    with Redis.from_url(url) as r:
        try:
            result = await hooks.ask("PreToolUse", tool_name="file_write")
            assert result.is_blocked and result.action.reason == "guarded"
            assert r.zrangebyscore(replicas, 0, "+inf")  # live: a positive heartbeat
        finally:
            hooks.close()
        hooks.close()
        assert not r.zrangebyscore(replicas, 0, "+inf")  # it deregistered as it stopped
