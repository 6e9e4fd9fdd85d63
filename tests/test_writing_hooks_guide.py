"""docs/writing-hooks.md, followed top to bottom the way a reader would, in an empty directory
outside this repository, with the author's own package (issue 17: "Done when").

Every ```sh and ```python block runs in one bash session (so ``cd``, ``export`` and background
jobs carry over, as in a terminal): shell blocks as they are, Python blocks with ``python -``,
and blocks under ``<!-- file: PATH -->`` are written to PATH. Blocks under ``<!-- not run: … -->``
(installing HookBus, Docker, kubectl, a collector) are checked instead: their commands parse,
and the files they use — the Dockerfile, compose.yaml, the Kubernetes manifest — are validated
against the Compose and Kubernetes schemas and against HookBus's own deployment files. Then the
service is started the way section 6 deploys it, without Docker: the image's command (the
Dockerfile's CMD after the entrypoint ``hookbus``) in a directory laid out as the image's /app,
with the Compose service's environment (its own Redis user hook-NoSecrets, its password from a
secret file, the health port) against a Redis started by deploy/redis/start.sh from the ACL file
the guide generates (HookBus's users and hook-NoSecrets), checked by the Compose health check and
asked by an agent; and once more with the Kubernetes Deployment's args, ConfigMap and its own
Secret's URL, probed on the paths its probes ask. Redis's ACL LOG stays empty.

The guide uses Redis's usual port, 6379; the test puts a free port in its place.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness import ROOT, until
from tests.test_deploy import (
    COMPOSE,
    K8S,
    REDIS_DIR,
    SCHEMAS,
    AclRedis,
    check_jsonschema,
    password,
    password_var,
    validate_manifest,
)
from workers.cli import build_parser
from workers.local.redis_server import free_port

GUIDE = ROOT / "docs" / "writing-hooks.md"
FENCE = re.compile(
    r"(?:^<!-- (?P<directive>file|not run): ?(?P<arg>.*?) -->\n)?"
    r"^```(?P<lang>\w+)\n(?P<code>.*?)^```\n",
    re.S | re.M,
)
BLOCK_TIMEOUT = 180
DONE = "::guide-block-done::"


@dataclass
class Block:
    index: int
    lang: str
    code: str
    directive: str | None  # "file", "not run" or None
    arg: str

    @property
    def runs(self) -> bool:
        return self.directive != "not run" and (self.lang in ("sh", "python") or self.file)

    @property
    def file(self) -> str | None:
        return self.arg if self.directive == "file" else None


def blocks() -> list[Block]:
    text = GUIDE.read_text()
    found = [
        Block(i, m["lang"], m["code"], m["directive"], m["arg"] or "")
        for i, m in enumerate(FENCE.finditer(text))
    ]
    assert len(found) == text.count("\n```") // 2, "a fenced block the pattern did not see"
    return found


class Session:
    """One bash process the blocks are typed into; its output is collected line by line."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], cwd=cwd, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,  # its background jobs go with it at the end
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.transcript: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.type("set -eo pipefail")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def type(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text if text.endswith("\n") else text + "\n")
        self.proc.stdin.flush()

    def run(self, what: str, text: str) -> str:
        """Type ``text``, then wait for it to finish; its output. A failing command ends the
        session (set -e): that fails the test with the transcript."""
        self.transcript.append(f"$ # {what}\n")
        self.type(text)
        self.type(f"echo {DONE}")
        out = []
        while True:
            try:
                line = self.lines.get(timeout=BLOCK_TIMEOUT)
            except queue.Empty:
                pytest.fail(f"{what}: no end after {BLOCK_TIMEOUT}s\n{self.output(out)}")
            if line is None:
                code = self.proc.wait()
                pytest.fail(f"{what} failed (the shell exited {code}):\n{self.output(out)}")
            if line.strip() == DONE:
                return "".join(out)
            out.append(line)
            self.transcript.append(line)

    def output(self, out: list[str]) -> str:
        return "".join(self.transcript[-200:])

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def heredoc(command: str, code: str) -> str:
    assert "GUIDE_EOF" not in code
    return f"{command} <<'GUIDE_EOF'\n{code}GUIDE_EOF"


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a reader's fresh terminal with HookBus installed: this virtualenv's
    bin first on PATH, and no HOOKBUS_*, OTEL_* or PYTHONPATH from the test run."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HOOKBUS_", "OTEL_")) and k != "PYTHONPATH"
    }
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(Path(sys.executable).parent.parent)
    return {**env, **extra}


@pytest.fixture
def outside(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An empty directory that is not inside this repository."""
    path = tmp_path_factory.mktemp("reader")
    assert not path.resolve().is_relative_to(ROOT)
    yield path


@pytest.mark.redis
@pytest.mark.timeout(900)
def test_the_guide_runs_top_to_bottom_and_deploys_the_authors_hook(
    outside: Path, tmp_path: Path
) -> None:
    port = str(free_port())
    session = Session(outside, clean_env())
    skipped: list[Block] = []
    try:
        for block in blocks():
            what = f"block {block.index} ({block.lang}{', ' + block.file if block.file else ''})"
            if not block.runs:
                skipped.append(block)
                continue
            code = block.code.replace("6379", port)
            if block.file:
                session.run(what, f'mkdir -p "$(dirname {block.file})"')
                session.run(what, heredoc(f"cat > {block.file}", block.code))
            elif block.lang == "sh":
                session.run(what, code)
            else:
                session.run(what, heredoc("python -", code))
        transcript = "".join(session.transcript)
        Path(os.environ.get("HOOKBUS_TEST_GUIDE_TRANSCRIPT", os.devnull)).write_text(transcript)
    finally:
        session.close()
        subprocess.run(["redis-cli", "-p", port, "shutdown", "nosave"], capture_output=True,
                       timeout=30, check=False)  # fmt: skip
    project = outside / "acme-hooks"
    assert (project / "acme_hooks" / "no_secrets.py").is_file(), transcript
    # What the reader saw: Redis answered, pytest passed, the hook was listed and asked.
    assert "ok: Redis at redis://127.0.0.1:" in transcript
    assert re.search(r"^2 passed", transcript, re.M), transcript
    assert "NoSecrets" in transcript and "Block(reason='.env holds secrets" in transcript

    check_skipped_blocks(skipped)
    check_acl(project)
    check_deployment_files(project)
    run_as_deployed(project, tmp_path)


# -- what is not run here ---------------------------------------------------------------------


def check_skipped_blocks(skipped: list[Block]) -> None:
    """Every command of a block not run exists: hookbus commands parse, paths into the HookBus
    checkout exist, the Dockerfile and manifests it names are the ones the guide wrote."""
    assert {b.lang for b in skipped} == {"sh"}
    text = "\n".join(b.code for b in skipped)
    for line in text.splitlines():
        words = shlex.split(line.split(" #")[0])
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before a command
            words = words[1:]
        if words[:1] == ["hookbus"]:
            build_parser().parse_args(words[1:])
        for word in words:
            if word.startswith("/path/to/hookbus"):
                path = Path(word.replace("/path/to/hookbus", str(ROOT)))
                assert path.exists(), word
    assert "-f /path/to/acme-hooks/compose.yaml" in text
    assert "cp /path/to/acme-hooks/users.acl deploy/redis/users.acl" in text
    assert f"{password_var(USER)}=" in text
    assert "kubectl apply -f k8s/no-secrets.yaml" in text


USER = "hook-NoSecrets"  # the hook service's own Redis user (workers/ops/acl.py: hook-NAME)


def acl_users(path: Path) -> dict[str, str]:
    """User name -> its line, of an ACL file ``hookbus acl`` wrote."""
    return {m[1]: m[0] for m in re.finditer(r"^user (\S+) .*$", path.read_text(), re.M)}


def check_acl(project: Path) -> None:
    """The ACL file the guide generated: HookBus's stack's users, unchanged, and hook-NoSecrets
    with the rules of a sync hook (only its own keys)."""
    from workers.ops.acl import HookUser, hook_rules

    mine, stack = acl_users(project / "users.acl"), acl_users(REDIS_DIR / "users.acl")
    assert mine.pop(USER) == f"user {USER} {hook_rules(HookUser('NoSecrets'))}"
    assert mine == stack


def image_command(project: Path) -> tuple[str, list[tuple[str, str]], list[str]]:
    """The Dockerfile's base image, its COPYs (source, destination) and its CMD."""
    dockerfile = (project / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM (\S+)$", dockerfile, re.M)
    copies = [
        (m[1], m[2]) for m in re.finditer(r"^COPY (?:--chown=\S+ )?(\S+) (\S+)$", dockerfile, re.M)
    ]
    (cmd,) = re.findall(r"^CMD (\[.*\])$", dockerfile, re.M)
    return base, copies, yaml.safe_load(cmd)


def check_deployment_files(project: Path) -> None:
    base, copies, cmd = image_command(project)
    assert base.startswith("hookbus:")
    for source, destination in copies:
        assert (project / source).exists(), source
        assert destination.startswith("/app/"), destination  # the base image's WORKDIR
    assert "WORKDIR /app" in (ROOT / "deploy" / "Dockerfile").read_text()
    assert build_parser().parse_args(cmd).hook == "acme_hooks.no_secrets:NoSecrets"

    # compose.yaml, added to HookBus's docker-compose.yml, is a valid Compose file, and its
    # service is set up like HookBus's own hook services: its own user, its own secret (given to
    # Redis too), the health port and check.
    stack = yaml.safe_load(COMPOSE.read_text())
    mine = yaml.safe_load((project / "compose.yaml").read_text())
    merged = merge_compose(stack, mine)
    path = project / "merged-compose.yml"
    path.write_text(yaml.safe_dump(merged))
    result = check_jsonschema(SCHEMAS / "compose-spec.json", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert set(mine["services"]) == {"redis", "no-secrets"}
    assert set(mine["services"]["redis"]) == {"secrets"}  # it adds a secret, changes nothing
    service, guard = mine["services"]["no-secrets"], stack["services"]["secret-guard"]
    for svc, name in ((guard, "SecretGuard"), (service, "NoSecrets")):
        user, secret = f"hook-{name}", f"hookbus_hook-{name}_password"
        env = svc["environment"]
        assert env["HOOKBUS_REDIS_URL"] == f"redis://{user}@redis:6379/0", name
        assert env["HOOKBUS_REDIS_PASSWORD_FILE"] == f"/run/secrets/{secret}", name
        assert svc["secrets"] == [secret], name
        assert secret in merged["services"]["redis"]["secrets"], name
        assert merged["secrets"][secret] == {"environment": password_var(user)}, name
        assert env["HOOKBUS_HEALTH_PORT"] == stack["x-env"]["HOOKBUS_HEALTH_PORT"], name
        assert svc["healthcheck"]["test"] == stack["x-health"]["test"], name
    passwords = {
        s for s in merged["secrets"] if s.endswith("_password")
    }  # not the gateway's tokens
    assert set(merged["services"]["redis"]["secrets"]) == passwords

    # The Deployment validates, reads HookBus's ConfigMap and Secret, probes the health port.
    secret, deployment = k8s_objects(project)
    validate_manifest(secret)
    validate_manifest(deployment)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert build_parser().parse_args(container["args"]).hook == cmd[1]
    config = yaml.safe_load((K8S / "configmap.yaml").read_text())
    assert container["envFrom"] == [{"configMapRef": {"name": config["metadata"]["name"]}}]
    url = secret["stringData"]["redis-url"]
    assert url.startswith(f"redis://{USER}@"), url  # its own user, like HookBus's, no password
    (guard,) = [
        d for d in yaml.safe_load_all((K8S / "secret.yaml").read_text())
        if d["metadata"]["name"] == "hookbus-hook-secret-guard"
    ]  # fmt: skip
    assert guard["stringData"]["redis-url"].startswith("redis://hook-SecretGuard@")
    assert sorted(secret["stringData"]) == sorted(guard["stringData"])  # the password apart
    (ref,) = [v["valueFrom"]["secretKeyRef"] for v in container["env"] if "valueFrom" in v]
    assert ref == {"name": secret["metadata"]["name"], "key": "redis-url"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == int(config["data"]["HOOKBUS_HEALTH_PORT"])
    assert yaml.safe_dump(deployment).count(cmd[1]) == 1  # the class, named once


def merge_compose(stack: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    """``docker compose -f docker-compose.yml -f compose.yaml``'s model, for what the guide's
    file holds: a new service, or a known one's lists (secrets) extended and mappings updated;
    top-level secrets added."""
    merged = {**stack, "services": dict(stack["services"]), "secrets": dict(stack["secrets"])}
    for name, service in mine["services"].items():
        if name not in merged["services"]:
            merged["services"][name] = service
            continue
        known = dict(merged["services"][name])
        for key, value in service.items():
            if isinstance(value, list):
                known[key] = list(dict.fromkeys([*known.get(key, []), *value]))
            elif isinstance(value, dict):
                known[key] = {**known.get(key, {}), **value}
            else:
                known[key] = value
        merged["services"][name] = known
    merged["secrets"].update(mine.get("secrets", {}))
    return merged


def k8s_objects(project: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The guide's Secret and Deployment."""
    secret, deployment = yaml.safe_load_all((project / "k8s" / "no-secrets.yaml").read_text())
    assert (secret["kind"], deployment["kind"]) == ("Secret", "Deployment")
    return secret, deployment


# -- the service, started the way section 6 deploys it ----------------------------------------


def image_app(project: Path, where: Path) -> Path:
    """A directory laid out as the image's /app: the Dockerfile's COPYs, applied."""
    _, copies, _ = image_command(project)
    app = where / "app"
    app.mkdir()
    for source, destination in copies:
        shutil.copytree(project / source, app / Path(destination).relative_to("/app"))
    return app


def get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return 0
    finally:
        conn.close()


def run_as_deployed(project: Path, tmp_path: Path) -> None:
    _, _, cmd = image_command(project)
    app = image_app(project, tmp_path)
    (tmp_path / "redis").mkdir()
    redis = AclRedis(tmp_path / "redis", acl=project / "users.acl")  # the guide's ACL file
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # Compose: the service's environment, "redis" being this Redis, /run/secrets a
        # directory of ours, its health port a free one.
        service = yaml.safe_load((project / "compose.yaml").read_text())["services"]["no-secrets"]
        secrets = tmp_path / "secrets"
        secrets.mkdir()
        for user in redis.users:
            (secrets / f"hookbus_{user}_password").write_text(password(user) + "\n")
        health = free_port()
        env = {
            k: str(v)
            .replace("@redis:6379", f"@127.0.0.1:{redis.port}")
            .replace("/run/secrets/", f"{secrets}/")
            for k, v in service["environment"].items()
            if not k.startswith("OTEL_EXPORTER")  # no Jaeger here
        }
        env["HOOKBUS_HEALTH_PORT"] = str(health)
        procs.append(start(["hookbus", *cmd], app, clean_env(**env), tmp_path / "compose.log"))
        kind, python, flag, code = service["healthcheck"]["test"]
        check = [sys.executable, flag, code.replace(":8081/", f":{health}/")]
        assert (kind, python) == ("CMD", "python")

        def healthy() -> bool:
            assert procs[0].poll() is None, (tmp_path / "compose.log").read_text()
            return subprocess.run(check, capture_output=True, timeout=30).returncode == 0

        until(
            healthy,
            "the Compose service healthy",
            60,
            lambda: (tmp_path / "compose.log").read_text(),
        )
        asked = asyncio.run(ask_as_agent(redis))
        assert asked.is_blocked and asked.blocking_errors[0].hook_name == "NoSecrets"

        # Kubernetes: the Deployment's args, the ConfigMap's settings, its own Secret's URL
        # (hook-NoSecrets, its password and this Redis in place of the placeholders); ready and
        # alive on the paths its probes ask.
        secret, deployment = k8s_objects(project)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        config = yaml.safe_load((K8S / "configmap.yaml").read_text())["data"]
        probe_port = free_port()
        url = secret["stringData"]["redis-url"].replace(
            "@redis.example.internal:6379/", f"@127.0.0.1:{redis.port}/"
        )
        assert url == redis.url(USER).replace(f":{password(USER)}@", "@")
        (mounted,) = [v for v in container["env"] if v["name"] == "HOOKBUS_REDIS_PASSWORD_FILE"]
        password_file = tmp_path / "k8s-secret" / Path(mounted["value"]).name
        password_file.parent.mkdir()
        password_file.write_text(password(USER))  # the Secret's key, as Kubernetes mounts it
        env = {k: str(v) for k, v in config.items() if not k.startswith("OTEL_")}
        env |= {"HOOKBUS_HEALTH_PORT": str(probe_port), "HOOKBUS_REDIS_URL": url,
                "HOOKBUS_REDIS_PASSWORD_FILE": str(password_file),
                "OTEL_SERVICE_NAME": "acme-no-secrets"}  # fmt: skip
        procs.append(
            start(["hookbus", *container["args"]], app, clean_env(**env), tmp_path / "k8s.log")
        )
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            path = container[probe]["httpGet"]["path"]
            until(lambda p=path: get(probe_port, p) == 200, f"{probe} {path}", 60,
                  lambda: (tmp_path / "k8s.log").read_text())  # fmt: skip
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in procs]
        redis_denied = redis.denied()
        redis.close()
    assert codes == [0] * len(procs), codes  # SIGTERM: both stopped cleanly
    assert redis_denied == []  # hook-NoSecrets was allowed everything the hook service did


def start(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )


async def ask_as_agent(redis: AclRedis) -> Any:
    """One PreToolUse, as the agent user, through the deployed hook service."""
    from agent_adapter.client import HookClient
    from bus.settings import BusSettings, HookSettings
    from workers.testing import context, wait_for_hooks

    settings = BusSettings(redis_url=redis.url("agent"), refresh_secs=0.2)
    async with HookClient(settings, HookSettings(hook_timeout_secs=10)) as hooks:
        await wait_for_hooks(hooks, "NoSecrets", timeout=60)
        ctx = context("PreToolUse", tool_name="file_read", tool_args={"path": "deploy/prod.pem"})
        return await hooks.run_pre_tool_use(ctx)
