"""The deployment files: docker-compose.yml, deploy/k8s/ and deploy/redis/users.acl.

* docker-compose.yml validates against the Compose Specification's JSON Schema
  (deploy/schemas/compose-spec.json, with check-jsonschema); every Kubernetes manifest against
  the Kubernetes schemas kubernetes-validate ships, the KEDA objects against
  deploy/schemas/keda-*.json. Offline: every schema is a file here or in an installed package.
* Every ``hookbus`` command they run (service commands, container args, health checks, probes)
  parses with workers/cli/ parser, and every MODULE:CLASS they name imports.
* The ACL users: deploy/redis/users.acl is what ``hookbus acl`` generates for the stack's hooks;
  the stack, the demo agent, a shell agent, the operator commands and the health checks all run
  against a Redis started by deploy/redis/start.sh, each as its own user (each hook service as
  its hook's), and Redis denies none of their commands (ACL LOG) — while it does deny what a role
  must not do (tests/security/ runs the attacks).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bus.hooks import spec_of
from bus.transport.keys import Keys
from tests.harness import ROOT, audit_events, until
from workers.cli import build_parser
from workers.local.redis_cluster import cluster_port
from workers.local.redis_server import free_port, stop_process
from workers.services.loading import import_target, load_hook

K = Keys("hookbus")  # the deploy uses the default prefix
EVENTS, DECISIONS = K.event_partitions[0], K.decision_partitions[0]

COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s"
SCHEMAS = ROOT / "deploy" / "schemas"
REDIS_DIR = ROOT / "deploy" / "redis"
#: The oldest Kubernetes the manifests claim (or the oldest kubernetes-validate still knows),
#: and the newest it knows.
OLDEST_K8S = "1.29.0"


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def manifests() -> list[tuple[str, int, dict[str, Any]]]:
    """(file name, index, document) of every Kubernetes object in deploy/k8s/."""
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        out += [(path.name, i, d) for i, d in enumerate(docs)]
    return out


# -- schemas ------------------------------------------------------------------------------------


def check_jsonschema(schema: Path, instance: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--schemafile", str(schema), str(instance)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_compose_file_validates_against_the_compose_specification() -> None:
    result = check_jsonschema(SCHEMAS / "compose-spec.json", COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_compose_schema_refuses_a_misspelt_key(tmp_path: Path) -> None:
    broken = compose()
    broken["services"]["coordinator"]["comand"] = broken["services"]["coordinator"].pop("command")
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    result = check_jsonschema(SCHEMAS / "compose-spec.json", path)
    assert result.returncode == 1 and "comand" in result.stdout, result.stdout + result.stderr


def test_the_readme_compose_snippet_for_a_custom_hook_fits_the_compose_file(
    tmp_path: Path,
) -> None:
    """README.md's "Running the stack" shows a service for a custom hook: added under
    services:, it validates, and its commands parse."""
    readme = (ROOT / "README.md").read_text()
    (snippet,) = re.findall(
        r"```yaml\n# docker-compose.yml, under services:\n(.*?)```", readme, re.S
    )
    text = COMPOSE.read_text().replace("\nservices:\n", "\nservices:\n" + snippet, 1)
    path = tmp_path / "docker-compose.yml"
    path.write_text(text)
    result = check_jsonschema(SCHEMAS / "compose-spec.json", path)
    assert result.returncode == 0, result.stdout + result.stderr
    doc = yaml.safe_load(text)
    service = doc["services"]["my-hook"]
    assert build_parser().parse_args(service["command"]).hook == "mypackage.hooks:MyHook"
    assert service["healthcheck"] == doc["x-health"]


# Compose's Redis users: every user of users.acl but default (off): the shared roles, admin,
# scaler, each hook service's own user, the demo tenant.
ROLE_PASSWORDS = [
    f"HOOKBUS_{u.upper().replace('-', '_').replace('.', '_')}_PASSWORD"
    for u in re.findall(r"^user (\S+) on ", (ROOT / "deploy/redis/users.acl").read_text(), re.M)
]
GATEWAY_TOKENS = "HOOKBUS_GATEWAY_TOKEN_DIGESTS"


def readme_env_snippet() -> str:
    """The lines of README.md's "Running the stack" that write .env (before `docker compose`)."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Running the stack") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README.md's Running the stack has no sh block"
    lines = block.group(1).splitlines()
    return "\n".join(lines[: next(i for i, x in enumerate(lines) if x.startswith("docker "))])


def test_the_readme_env_loop_sets_every_variable_compose_needs(tmp_path: Path) -> None:
    """README's .env, built exactly as it says (in a copy of the checkout's deploy/redis), sets
    every variable docker-compose.yml interpolates, each to a non-empty, URL-safe value; the
    token it prints is the tenant demo's for the gateway."""
    from workers.services.gateway import Tokens

    (tmp_path / "deploy" / "redis").mkdir(parents=True)
    (tmp_path / "deploy/redis/users.acl").write_text((REDIS_DIR / "users.acl").read_text())
    result = subprocess.run(["sh", "-eu", "-c", readme_env_snippet()], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    env = dict(line.split("=", 1) for line in (tmp_path / ".env").read_text().splitlines())
    needed = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", COMPOSE.read_text()))
    assert needed and needed <= set(env), sorted(needed - set(env))
    assert all(re.fullmatch(r"[0-9a-f]{48}", env[v]) for v in needed if v.endswith("_PASSWORD"))
    assert sorted(v for v in needed if v.endswith("_PASSWORD")) == sorted(ROLE_PASSWORDS)
    (token,) = re.findall(r"^gateway token of tenant demo: (\S+)$", result.stdout, re.M)
    (tmp_path / "tokens").write_text(env[GATEWAY_TOKENS] + "\n")
    assert Tokens.load(tmp_path / "tokens").tenant(f"Bearer {token}") == "demo"


def test_compose_has_no_development_passwords_and_none_in_urls() -> None:
    """Every password must be given (Compose's ${VAR:?message} refuses to start without it),
    none has a default, and they reach the services as secret files, never in a URL."""
    import urllib.parse

    text = COMPOSE.read_text()
    for var in ROLE_PASSWORDS:
        uses = re.findall(r"\$\{" + var + r"([^}]*)\}", text)
        assert uses and all(u.startswith(":?") for u in uses), (var, uses)
    assert "dev-password" not in text and ":-" not in "".join(re.findall(r"\$\{[^}]*\}", text))
    doc = compose()
    assert {s["environment"] for s in doc["secrets"].values()} == {*ROLE_PASSWORDS, GATEWAY_TOKENS}
    for name, service in doc["services"].items():
        if service.get("image") != "hookbus:latest":
            continue
        env = service["environment"]
        url = urllib.parse.urlsplit(env["HOOKBUS_REDIS_URL"])
        assert url.password is None and url.username, (name, env["HOOKBUS_REDIS_URL"])
        secret = f"hookbus_{url.username}_password"
        tokens = ["hookbus_gateway_tokens"] if service["command"][0] == "gateway" else []
        assert service["secrets"] == [secret, *tokens], name
        assert env["HOOKBUS_REDIS_PASSWORD_FILE"] == f"/run/secrets/{secret}", name
    assert sorted(doc["services"]["redis"]["secrets"]) == sorted(
        s for s in doc["secrets"] if s.endswith("_password")
    )


def test_compose_hardens_every_container() -> None:
    """Read-only root file systems, no capability, no-new-privileges, a restart policy (one-shot
    commands: none), Redis and Jaeger health-checked, Jaeger v2, every port on 127.0.0.1."""
    doc = compose()
    for name, service in doc["services"].items():
        assert service.get("read_only") is True, name
        assert service.get("cap_drop") == ["ALL"], name
        assert service.get("security_opt") == ["no-new-privileges:true"], name
        one_shot = service.get("profiles") == ["tools"] or service.get("command", [""])[0] == "demo"
        assert service.get("restart") == ("no" if one_shot else "unless-stopped"), name
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    for name in ("redis", "jaeger"):
        assert doc["services"][name]["healthcheck"]["test"], name
    image, _, tag = doc["services"]["jaeger"]["image"].partition(":")
    assert image == "jaegertracing/jaeger" and tag.split(".")[0] == "2"
    assert doc["services"]["redis"]["user"] == "999:999"  # needs no capability to drop root


def test_compose_limits_every_service_and_keeps_the_audit_log_on_a_volume() -> None:
    doc = compose()
    for name, service in doc["services"].items():
        limits = service["deploy"]["resources"]["limits"]
        assert limits["memory"] and limits["cpus"], name
    audit = doc["services"]["audit-log"]
    db = Path(audit["environment"]["HOOKBUS_AUDIT_DB"])
    volumes = dict(v.split(":", 1) for v in audit["volumes"])
    assert any(db.is_relative_to(path) for path in volumes.values()), (db, volumes)
    assert set(volumes) <= set(doc["volumes"])  # named volumes: they outlive the container
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert f"mkdir -p {db.parent} && chown 10001 {db.parent}" in dockerfile


def test_the_docker_build_context_is_small() -> None:
    """.dockerignore leaves out .venv, .git, node_modules and the like, and keeps what the
    Dockerfile copies (the context as the docker client computes it)."""
    from docker.utils.build import exclude_paths

    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    files = exclude_paths(str(ROOT), patterns)
    assert not [f for f in files if f.startswith((".venv", ".git/", "node_modules")) or
                "/node_modules/" in f or "__pycache__" in f]  # fmt: skip
    size = sum((ROOT / f).stat().st_size for f in files if (ROOT / f).is_file())
    assert size < 5_000_000, size
    copied = re.findall(r"^COPY (.+) \S+$", (ROOT / "deploy" / "Dockerfile").read_text(), re.M)
    for source in " ".join(copied).split():
        assert source in files, source


def lock(path: Path) -> dict[str, str]:
    """A lock file's packages: canonical name -> its block (the pin and its hashes)."""
    from packaging.utils import canonicalize_name

    blocks = re.split(r"\n(?=[A-Za-z0-9][A-Za-z0-9._-]*==)", path.read_text())
    return {
        canonicalize_name(b.split("==")[0]): "\n".join(
            line for line in b.splitlines() if not line.lstrip().startswith("#")
        ).strip()
        for b in blocks
        if "==" in b.split("\n")[0]
    }


def test_compose_runs_the_starter_policy_which_the_image_holds() -> None:
    """The policy service serves examples/policy/starter.toml by a path relative to the image's
    WORKDIR, where the Dockerfile copies it; the checkout's copy is mounted over it read-only
    (an edit is in force at the next call), and the demo agent waits for it."""
    from workers.builtins.policy import check_file
    from workers.cli.common import hook_config

    services = compose()["services"]
    service = services["policy"]
    args = build_parser().parse_args(service["command"])
    assert args.hook == "workers.builtins.policy:Policy"
    assert hook_config(args) == {"rules": "examples/policy/starter.toml"}
    assert check_file(str(ROOT / "examples/policy/starter.toml")) == []
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    (workdir,) = re.findall(r"^WORKDIR (\S+)$", dockerfile, re.M)
    assert re.search(r"^COPY examples/policy examples/policy$", dockerfile, re.M)
    assert service["volumes"] == [f"./examples/policy:{workdir}/examples/policy:ro"]
    assert services["demo-agent"]["depends_on"]["policy"] == {"condition": "service_healthy"}


def test_the_image_installs_locked_dependencies_before_the_code() -> None:
    """deploy/Dockerfile: the lock files (runtime, and the gateway extra) are copied and
    installed with --require-hashes before any source file, so a code change reuses that layer;
    HookBus itself is installed with --no-deps."""
    steps = [
        line.split(None, 1)
        for line in (ROOT / "deploy" / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
        if line and not line.startswith("#")
    ]
    copies = [i for i, (op, _) in enumerate(steps) if op == "COPY"]
    runs = [(i, arg) for i, (op, arg) in enumerate(steps) if op == "RUN"]
    first_copy = steps[copies[0]][1].split()
    assert first_copy == ["requirements/runtime.txt", "requirements/gateway.txt", "requirements/"]
    deps_at, deps = runs[0]
    assert copies[0] < deps_at < copies[1], "dependencies are installed before the code is copied"
    assert "--require-hashes" in deps.split()
    assert "-r requirements/runtime.txt" in deps and "-r requirements/gateway.txt" in deps
    code_at, code = runs[1]
    assert code_at > copies[-1] and "pip install --no-deps ." in code


def test_the_gateway_lock_covers_the_extra_and_agrees_with_dev_txt() -> None:
    """requirements/gateway.txt: every package the `gateway` extra needs (on CPython 3.11 on
    Linux) that runtime.txt lacks, pinned and hashed exactly as dev.txt (made by `make lock`)."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    runtime, gateway = (
        lock(ROOT / "requirements/runtime.txt"),
        lock(ROOT / "requirements/gateway.txt"),
    )
    dev = lock(ROOT / "requirements/dev.txt")
    assert not set(runtime) & set(gateway)
    for name, block in gateway.items():
        assert dev[name] == block, name
    env = {"python_version": "3.11", "python_full_version": "3.11.0", "sys_platform": "linux",
           "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "platform_machine": "x86_64",
           "extra": ""}  # fmt: skip
    extra = [
        Requirement(r)
        for r in importlib.metadata.requires("hookbus") or []
        if 'extra == "gateway"' in r
    ]
    needed, todo = set(), [r.name for r in extra]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in needed:
            continue
        needed.add(name)
        for r in map(Requirement, importlib.metadata.requires(name) or []):
            if r.marker is None or r.marker.evaluate(env):
                todo.append(r.name)
    assert needed and needed <= set(runtime) | set(gateway), sorted(
        needed - set(runtime) - set(gateway)
    )


def validate_manifest(doc: dict[str, Any]) -> None:
    """Raise if ``doc`` breaks its schema: KEDA's from deploy/schemas/, else Kubernetes'."""
    import jsonschema
    import kubernetes_validate

    if doc["apiVersion"].startswith("keda.sh/"):
        schema = json.loads((SCHEMAS / f"keda-{doc['kind'].lower()}.json").read_text())
        jsonschema.Draft202012Validator(schema).validate(doc)
        return
    known = kubernetes_validate.utils.all_versions()
    oldest = OLDEST_K8S if OLDEST_K8S in known else min(known, key=_version)
    for version in (oldest, kubernetes_validate.latest_version()):
        kubernetes_validate.validate(doc, version, strict=True)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


@pytest.mark.parametrize(
    "doc", [d for _, _, d in manifests()], ids=[f"{f}#{i}" for f, i, _ in manifests()]
)
def test_kubernetes_manifest_validates(doc: dict[str, Any]) -> None:
    validate_manifest(doc)


def test_the_kubernetes_schemas_refuse_mistakes() -> None:
    import jsonschema
    import kubernetes_validate

    docs = {d["kind"]: d for _, _, d in manifests()}
    deployment = copy.deepcopy(docs["Deployment"])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_manifest(deployment)
    scaled = copy.deepcopy(docs["ScaledObject"])
    scaled["spec"]["triggers"][0]["metadata"]["lagcount"] = "5"
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(scaled)
    scaled = copy.deepcopy(docs["ScaledObject"])
    scaled["spec"]["triggers"][0]["metadata"]["lagCount"] = 5  # KEDA takes strings only
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(scaled)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"


def test_the_scaled_objects_follow_the_async_hooks_groups() -> None:
    """Each ScaledObject scales a Deployment of an async hook on that hook's own group."""
    docs = [d for _, _, d in manifests()]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    assert {s["spec"]["scaleTargetRef"]["name"] for s in scaled} == {
        "hookbus-audit-log",
        "hookbus-metrics",
    }
    for s in scaled:
        args = deployments[s["spec"]["scaleTargetRef"]["name"]]["spec"]["template"]["spec"]
        hook = spec_of(load_hook(args["containers"][0]["args"][1])).name
        (trigger,) = s["spec"]["triggers"]
        assert trigger["type"] == "redis-streams"
        assert trigger["metadata"]["stream"] == Keys().event_partitions[0]
        assert trigger["metadata"]["consumerGroup"] == hook
        assert int(trigger["metadata"]["lagCount"]) > 0


# -- every command exists -------------------------------------------------------------------


def commands() -> list[tuple[str, list[str]]]:
    """(where, argv after ``hookbus``) of every hookbus command the deployment files run."""
    found: list[tuple[str, list[str]]] = []
    for name, service in compose()["services"].items():
        if service.get("image") != "hookbus:latest":
            continue
        found.append((f"compose {name} command", list(service["command"])))
    for file, i, doc in deployments():
        for c in doc["spec"]["template"]["spec"]["containers"]:
            assert "command" not in c, "the image's entrypoint is hookbus: use args"
            found.append((f"{file}#{i} {c['name']} args", list(c["args"])))
    return found


def deployments() -> list[tuple[str, int, dict[str, Any]]]:
    return [(f, i, d) for f, i, d in manifests() if d["kind"] == "Deployment"]


@pytest.mark.parametrize("argv", [a for _, a in commands()], ids=[w for w, _ in commands()])
def test_every_command_exists_in_the_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.cli.common import hook_config

    args = build_parser().parse_args(argv)  # SystemExit (a failure) on an unknown command
    assert callable(args.func)
    if argv[0] == "worker":
        monkeypatch.chdir(ROOT)  # the image's WORKDIR holds what the checkout does (the policy)
        spec_of(load_hook(argv[1], config=hook_config(args)))  # it imports, and is a hook


def long_running(argv: list[str]) -> bool:
    return argv[0] in ("worker", "coordinator")


def test_compose_services_are_checked_on_their_health_endpoint() -> None:
    """Every worker and coordinator is checked on /readyz of its own HOOKBUS_HEALTH_PORT, over
    HTTP, by a check that names no hook class (tests/test_probes.py runs the check)."""
    doc = compose()
    checked = []
    for name, service in doc["services"].items():
        if service.get("image") != "hookbus:latest" or not long_running(service["command"]):
            continue
        test = service["healthcheck"]["test"]
        assert test == doc["x-health"]["test"], name
        port = service["environment"]["HOOKBUS_HEALTH_PORT"]
        assert test[:3] == ["CMD", "python", "-c"] and f"127.0.0.1:{port}/readyz" in test[3]
        checked.append(name)
    assert len(checked) == 6


def test_deployments_probe_the_health_endpoint_and_name_the_hook_once() -> None:
    """One probe convention: liveness asks /livez (never Redis), readiness /readyz, on the
    container port named "health" that the ConfigMap's HOOKBUS_HEALTH_PORT opens — the gateway
    on its own port, named "http"; no probe starts a process; a worker's MODULE:CLASS is written
    once, in its args."""
    (config,) = [d for _, _, d in manifests() if d["kind"] == "ConfigMap"]
    port = int(config["data"]["HOOKBUS_HEALTH_PORT"])
    found = 0
    for file, _, doc in deployments():
        (c,) = doc["spec"]["template"]["spec"]["containers"]
        assert long_running(c["args"]) or c["args"][0] == "gateway", file
        found += 1
        if c["args"][0] == "gateway":
            name, port_of = "http", int(c["args"][c["args"].index("--port") + 1])
        else:
            name, port_of = "health", port
        assert {"name": name, "containerPort": port_of} in c["ports"], file
        paths = {}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert "exec" not in c[probe], (file, probe)
            assert c[probe]["httpGet"]["port"] == name, (file, probe)
            paths[probe] = c[probe]["httpGet"]["path"]
        assert paths == {
            "startupProbe": "/livez",
            "readinessProbe": "/readyz",
            "livenessProbe": "/livez",
        }, file
        if c["args"][0] == "worker":
            assert yaml.safe_dump(doc).count(c["args"][1]) == 1, file
    assert found == 7  # coordinator, gateway, four hook services, the starter policy


# -- ACL users ----------------------------------------------------------------------------------


def compose_hook_services() -> dict[str, tuple[str, str]]:
    """Compose service → (MODULE:CLASS it serves, the Redis user its URL names)."""
    out = {}
    for name, service in compose()["services"].items():
        command = service.get("command") or []
        if service.get("image") == "hookbus:latest" and command[:1] == ["worker"]:
            user = urllib.parse.urlsplit(service["environment"]["HOOKBUS_REDIS_URL"]).username
            out[name] = (command[1], str(user))
    return out


def make_acl_command() -> list[str]:
    """The ``hookbus acl`` arguments of the Makefile's ``acl`` target (which writes users.acl)."""
    makefile = (ROOT / "Makefile").read_text()
    (hooks,) = re.findall(r"^STACK_HOOKS = (\S+)$", makefile, re.M)
    (recipe,) = re.findall(r"^\t\$\(BIN\)/hookbus (acl .*)$", makefile, re.M)
    argv = shlex.split(recipe.replace("$(STACK_HOOKS)", hooks))
    out = argv.index("-o")
    assert argv[out + 1] == "deploy/redis/users.acl"
    return argv[:out] + argv[out + 2 :]


def test_users_acl_is_what_hookbus_acl_generates_for_the_stack(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """deploy/redis/users.acl is the output of `make acl`, for exactly the hook services
    docker-compose.yml runs; it holds nothing but user lines (Redis refuses the rest)."""
    from workers.cli import main

    text = (REDIS_DIR / "users.acl").read_text()
    argv = make_acl_command()
    assert main(argv) == 0
    assert capsys.readouterr().out == text
    args = build_parser().parse_args(argv)
    assert sorted(args.hooks.split(",")) == sorted(t for t, _ in compose_hook_services().values())
    assert all(line.startswith("user ") for line in text.splitlines())


def test_each_hook_service_connects_as_its_own_hook_user() -> None:
    """Compose and Kubernetes: every hook service's URL names ``hook-<its hook>``, a user of
    users.acl, and no two services share a credential."""
    for service, (target, user) in compose_hook_services().items():
        assert user == f"hook-{import_target(target).name}", service  # the class's: Policy's
        # takes its file (--set rules=…)
        assert user in USERS
    secrets = {
        d["metadata"]["name"]: d["stringData"] for _, _, d in manifests() if d["kind"] == "Secret"
    }
    seen = set()
    for file, _, doc in manifests():
        if doc["kind"] != "Deployment":
            continue
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        if container["args"][0] != "worker":
            continue
        (url,) = [e for e in container["env"] if e["name"] == "HOOKBUS_REDIS_URL"]
        ref = url["valueFrom"]["secretKeyRef"]
        assert ref["name"] not in seen, file
        seen.add(ref["name"])
        user = urllib.parse.urlsplit(secrets[ref["name"]][ref["key"]]).username
        assert user == f"hook-{import_target(container['args'][1]).name}", file
        assert user in USERS
        assert sorted(secrets[ref["name"]]) == ["password", ref["key"]], (
            "a hook's Secret holds its own user's URL and password only"
        )


def test_kubernetes_passes_passwords_as_files_and_grants_pods_nothing_more() -> None:
    """No Redis URL of a Secret holds a password; each Deployment's container reads its password
    from a file (HOOKBUS_REDIS_PASSWORD_FILE) mounted from just its own user's key of a Secret,
    whose URL names the same user; no ServiceAccount token; replicas spread over nodes; a
    NetworkPolicy covers every pod in and out; KEDA authenticates as the scaler user; the
    gateway's tokens are a mounted file too."""
    docs = [d for _, _, d in manifests()]
    secrets = {d["metadata"]["name"]: d["stringData"] for d in docs if d["kind"] == "Secret"}
    for name, data in secrets.items():
        for key, value in data.items():
            if value.startswith("redis"):
                assert urllib.parse.urlsplit(value).password is None, (name, key)
    for file, _, doc in deployments():
        pod = doc["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, file
        labels = doc["spec"]["selector"]["matchLabels"]
        (term,) = pod["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == labels, file
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname", file
        (c,) = pod["containers"]
        env = {e["name"]: e for e in c["env"]}
        assert "HOOKBUS_REDIS_PASSWORD" not in env, file
        for e in c["env"]:  # from a Secret into the environment: only a URL with no password
            if ref := e.get("valueFrom", {}).get("secretKeyRef"):
                value = secrets[ref["name"]][ref["key"]]
                assert urllib.parse.urlsplit(value).password is None, (file, e["name"])
        path = Path(env["HOOKBUS_REDIS_PASSWORD_FILE"]["value"])
        (mount,) = [m for m in c["volumeMounts"] if path.parent == Path(m["mountPath"])]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        (item,) = volume["secret"]["items"]
        assert item["path"] == path.name, file
        url_ref = env["HOOKBUS_REDIS_URL"]["valueFrom"]["secretKeyRef"]
        assert volume["secret"]["secretName"] == url_ref["name"], file
        url = secrets[url_ref["name"]][url_ref["key"]]
        user = urllib.parse.urlsplit(url).username
        assert item["key"] in ("password", f"{user}-password"), file
        assert item["key"] in secrets[url_ref["name"]], file
        if c["args"][0] == "gateway":
            tokens = Path(c["args"][c["args"].index("--tokens") + 1])
            (mount,) = [m for m in c["volumeMounts"] if Path(m["mountPath"]) == tokens.parent]
            (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
            assert volume["secret"]["items"] == [{"key": "tokens", "path": tokens.name}]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    everyone = [p for p in policies if p["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "hookbus"}]  # fmt: skip
    assert everyone and everyone[0]["spec"]["policyTypes"] == ["Ingress", "Egress"]
    (auth,) = [d for d in docs if d["kind"] == "TriggerAuthentication"]
    refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
    assert secrets[refs["username"]["name"]][refs["username"]["key"]] == "scaler"
    assert "scaler" in USERS


def test_hookbus_acl_generates_users_for_any_prefix_hooks_and_tenants(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bus.errors import ConfigError
    from workers.cli import main
    from workers.ops.acl import hook_user_of, users

    argv = ["acl", "--hooks", "Guard,Tail=async,workers.builtins.audit:AsyncAuditLogHook",
            "--tenants", "acme,beta", "--prefix", "hb2"]  # fmt: skip
    assert main(argv) == 0
    lines = {
        line.split()[1]: line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("user ")
    }
    assert list(lines) == [
        "default", "coordinator", "agent", "operator", "scaler", "admin", "hook-Guard",
        "hook-Tail", "hook-AsyncAuditLogHook", "tenant-acme", "tenant-beta",
    ]  # fmt: skip
    assert all("hookbus:" not in line for line in lines.values())
    assert "~hb2:hook:{Guard}:* ~hb2:hook:{Guard#*}:*" in lines["hook-Guard"]
    assert "events" not in lines["hook-Guard"]
    assert "~hb2:events:* +evalsha" in lines["hook-Tail"]
    assert "~hb2:events:* ~hb2:audit +evalsha" in lines["hook-AsyncAuditLogHook"]
    assert lines["tenant-acme"] == (
        "user tenant-acme on resetchannels -@all +ping "
        "(%W~hb2:t:{acme}:decisions +xadd) (~hb2:t:{acme}:inbox:* +blpop +blmpop)"
    )
    # For Redis >= 7.2, +client|setinfo; for a cluster, what cluster clients send; never for
    # default (off) or admin (+@all).
    assert main([*argv, "--redis-version", "7.2", "--cluster"]) == 0
    newer = {line.split()[1]: line for line in capsys.readouterr().out.splitlines()}
    assert newer["tenant-acme"] == (
        f"{lines['tenant-acme']} +client|setinfo +command +cluster|slots +cluster|shards "
        "+cluster|nodes +asking"
    )
    assert newer["default"] == lines["default"] and newer["admin"] == lines["admin"]
    assert main([*argv, "--redis-version", "6.2"]) == 2
    # --explain: what each user is for, for people (every line a comment: not an ACL file).
    assert main([*argv, "--explain"]) == 0
    explained = capsys.readouterr().out.splitlines()
    assert all(line.startswith("#") or not line for line in explained)
    assert "# user scaler on resetchannels -@all +ping %R~hb2:events:*" in "\n".join(explained)
    cancel = hook_user_of("workers.builtins.cancellation:RedisCancellationHook")
    assert cancel.capabilities == ("read-cancellations",)
    for bad in ("Bad Name", "Guard=maybe", "workers.nothere:X", "json:dumps"):
        with pytest.raises(ConfigError):
            hook_user_of(bad)
    with pytest.raises(ConfigError, match="listed twice"):
        users([hook_user_of("Guard"), hook_user_of("Guard=async")], [])
    with pytest.raises(ConfigError, match="tenant"):
        users([], ["a.b"])
    assert main(["acl", "--hooks", "Bad Name"]) == 2


USERS = re.findall(r"^user (\S+) ", (REDIS_DIR / "users.acl").read_text(), re.M)


def password(user: str) -> str:
    return f"{user}-{os.getpid()}-pw"


#: The users HookBus processes connect as (not default, off; admin, Redis's administrator;
#: scaler, KEDA's).
PASSWORDS = {user: password(user) for user in USERS if user not in ("default", "admin", "scaler")}
ADMIN = password("admin")


def password_var(user: str) -> str:
    """The variable deploy/redis/start.sh reads a user's password from."""
    return f"HOOKBUS_{user.upper().replace('-', '_').replace('.', '_')}_PASSWORD"


class AclRedis:
    """redis-server started by deploy/redis/start.sh from users.acl (its ``admin`` user reads
    ACL LOG), and a user for each of ``hooks`` (MODULE:CLASS or NAME,
    as ``hookbus acl --hooks`` takes them) the stack does not run. ``acl``: another file
    ``hookbus acl`` generated, in place of users.acl. Each user's password: ``password(user)``."""

    def __init__(self, tmp: Path, hooks: tuple[str, ...] = (), acl: Path | None = None) -> None:
        from workers.ops.acl import hook_user_of, users

        extra = [
            (user, rules)
            for user, _, rules in users([hook_user_of(h) for h in hooks], [])
            if user.startswith("hook-")
        ]
        lines = "".join(f"user {user} {rules}\n" for user, rules in extra)
        base = (acl or REDIS_DIR / "users.acl").read_text()
        template = tmp / "users.acl"
        if not re.search(r"^user admin ", base, re.M):  # a file of an older `hookbus acl`
            lines += "user admin on ~* &* +@all\n"
        template.write_text(base + lines)
        self.users = [u for u in re.findall(r"^user (\S+) ", base + lines, re.M) if u != "default"]
        self.port = free_port()
        env = {
            **os.environ,
            "HOOKBUS_ACL_TEMPLATE": str(template),
            "HOOKBUS_ACL_FILE": str(tmp / "rendered.acl"),
            "HOOKBUS_SECRETS_DIR": str(tmp / "no-secrets"),
            **{password_var(u): password(u) for u in self.users},
        }
        self.log = tmp / "redis.log"
        self.proc = subprocess.Popen(
            ["sh", str(REDIS_DIR / "start.sh"), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(tmp), "--logfile", str(self.log)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        import redis

        self.admin = redis.Redis(port=self.port, username="admin", password=ADMIN)

        def up() -> bool:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read().decode() if self.proc.stdout else ""
                log = self.log.read_text() if self.log.exists() else ""
                pytest.fail(f"start.sh exited {self.proc.returncode}: {out}{log[-1000:]}")
            try:
                return bool(self.admin.ping())
            except redis.RedisError:
                return False

        until(up, "redis-server started by deploy/redis/start.sh", timeout=20)

    def url(self, user: str) -> str:
        return f"redis://{user}:{password(user)}@127.0.0.1:{self.port}/0"

    def denied(self) -> list[str]:
        """What Redis refused, one line per ACL LOG entry."""
        entries: Any = self.admin.acl_log()
        return [
            f"{e['username']}: {e['reason']} {e['object']} ({e['context']}, x{e['count']})"
            for e in entries
        ]

    def close(self) -> None:
        self.admin.close()
        stop_process(self.proc)
        if self.proc.stdout:
            self.proc.stdout.close()


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[AclRedis]:
    server = AclRedis(tmp_path)
    try:
        yield server
    finally:
        server.close()


def test_start_sh_refuses_a_user_without_password(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKBUS_")}
    env |= {"HOOKBUS_ACL_FILE": str(tmp_path / "r.acl"), "HOOKBUS_SECRETS_DIR": str(tmp_path)}
    env |= {"HOOKBUS_COORDINATOR_PASSWORD": "x"}
    result = subprocess.run(
        ["sh", str(REDIS_DIR / "start.sh"), "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "start.sh: no password for Redis user agent: set HOOKBUS_AGENT_PASSWORD or "
        f"{tmp_path}/hookbus_agent_password"
    )
    # A hook user's variable: its name in capitals, '-' and '.' as '_'.
    env |= {"HOOKBUS_AGENT_PASSWORD": "x", "HOOKBUS_OPERATOR_PASSWORD": "x"}
    env |= {"HOOKBUS_SCALER_PASSWORD": "x", "HOOKBUS_ADMIN_PASSWORD": "x"}
    result = subprocess.run(
        ["sh", str(REDIS_DIR / "start.sh"), "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "start.sh: no password for Redis user hook-CancellationHook: set HOOKBUS_HOOK_"
        f"CANCELLATIONHOOK_PASSWORD or {tmp_path}/hookbus_hook-CancellationHook_password"
    )


def hookbus(
    url: str, *args: str, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOOKBUS_REDIS_URL": url, "COLUMNS": "250", "NO_COLOR": "1"}
    env.pop("HOOKBUS_PREFIX", None)
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env=env, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    if check:
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.mark.redis
@pytest.mark.timeout(240)
def test_every_role_works_under_its_acl_user_and_nothing_is_denied(
    acl_redis: AclRedis, tmp_path: Path
) -> None:
    from workers.local.launcher import Stack

    env = {k: v for k, v in os.environ.items() if k != "HOOKBUS_PREFIX"}
    env |= {"HOOKBUS_AUDIT_DB": str(tmp_path / "audit.db")}
    stack = Stack({role: acl_redis.url(role) for role in PASSWORDS}, tmp_path / "logs", env=env)
    tail = None
    try:
        stack.start()
        why = stack.wait_ready(90)
        assert why is None, f"{why}\n{acl_redis.denied()}"
        operator, agent = acl_redis.url("operator"), acl_redis.url("agent")
        # A follower of the events stream, then the demo agent, as the agent user.
        with (tmp_path / "tail.out").open("w") as out:
            tail = subprocess.Popen(
                [sys.executable, "-m", "workers.cli", "events", "tail", "--count", "1"],
                env={**env, "HOOKBUS_REDIS_URL": operator, "COLUMNS": "250", "NO_COLOR": "1"},
                cwd=ROOT, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        until(
            lambda: b"following" in (tmp_path / "tail.out").read_bytes(),
            "events tail",
            explain=lambda: (tmp_path / "tail.out").read_text(),
        )
        demo = hookbus(agent, "demo", "--attach", timeout=120)
        assert "attached to the running hook services" in demo.stdout
        assert "cancelled by the user" in demo.stdout
        assert tail.wait(30) == 0, (tmp_path / "tail.out").read_text()

        # An agent in another language (redis-cli) asks the coordinator service.
        def shell_decision() -> str:
            shell = subprocess.run(
                ["bash", str(ROOT / "examples" / "shell" / "pretooluse.sh"), "file_read",
                 '{"path":"app/.env"}'],
                env={**env, "REDIS_URL": agent}, capture_output=True, text=True, timeout=60,
                check=False,
            )  # fmt: skip
            assert shell.returncode == 0, (shell.stdout, shell.stderr)
            action: str = json.loads(shell.stdout)["result"]["action"]["type"]
            return action

        assert shell_decision() == "Block"
        # A request nobody can answer: the coordinator dead-letters it.
        acl_redis.admin.xadd(Keys().decision_partitions[0], {"data": "not json"})
        until(lambda: acl_redis.admin.xlen("hookbus:dlq"), "a dead letter", 20, acl_redis.denied)

        # The operator's commands.
        listed = hookbus(operator, "hooks", "list").stdout
        for hook in (
            "CancellationHook", "SecretGuard", "Policy", "AsyncAuditLogHook", "AsyncMetricsHook"
        ):  # fmt: skip
            assert hook in listed
        hookbus(operator, "lag")
        hookbus(operator, "metrics")
        letter_id = re.findall(r"\b\d{13}-\d+\b", hookbus(operator, "dlq", "list").stdout)[0]
        hookbus(operator, "dlq", "show", letter_id)
        hookbus(operator, "replay", "AsyncMetricsHook", "--from", "-", "--to", "+")
        hookbus(operator, "dlq", "purge", "--yes")
        hookbus(operator, "cancel", "some-session")
        # Break-glass: the operator switches it on, SecretGuard only warns, the audit log hook
        # records the switch; then off, and SecretGuard blocks again.
        hookbus(operator, "breakglass", "on", "--reason", "acl test", "--for", "5m")
        until(lambda: shell_decision() == "Continue", "break-glass", 30, acl_redis.denied)
        assert "acl test" in hookbus(operator, "breakglass", "status").stdout
        assert "break-glass on" in hookbus(operator, "audit", "list").stdout
        hookbus(operator, "breakglass", "off")
        until(lambda: shell_decision() == "Block", "enforcement again", 30, acl_redis.denied)
        hookbus(operator, "hooks", "mode", "SecretGuard", "warn")
        hookbus(operator, "hooks", "mode", "Policy", "warn")  # its starter rules block .env too
        until(lambda: shell_decision() == "Continue", "warn mode", 30, acl_redis.denied)
        hookbus(operator, "hooks", "mode", "SecretGuard", "enforce")
        until(lambda: shell_decision() == "Block", "enforce mode", 30, acl_redis.denied)

        def audited() -> bool:
            statuses = [s for (s,) in audit_events(tmp_path / "audit.db", "status")]
            return sum(s.startswith("BREAKGLASS") for s in statuses) == 2

        until(audited, "break-glass in the audit log", 30, acl_redis.denied)

        # Every health check, as the role that runs it and as the operator.
        for user, target in (
            ("hook-SecretGuard", "workers.builtins.demo_hooks:SecretGuard"),
            ("hook-AsyncAuditLogHook", "workers.builtins.audit:AsyncAuditLogHook"),
        ):
            for url in (acl_redis.url(user), operator):
                hookbus(url, "worker", target, "--check")
                hookbus(url, "worker", target, "--check", "--here")
        for url in (acl_redis.url("coordinator"), operator):
            hookbus(url, "coordinator", "--check")
        for role in PASSWORDS:
            hookbus(acl_redis.url(role), "check")
    finally:
        if tail is not None and tail.poll() is None:
            tail.kill()
            tail.wait()
        ended = stack.stop()
    assert all(how == "stopped" for _, how in ended), ended
    logs = "\n".join(p.read_text() for p in sorted((tmp_path / "logs").glob("*.log")))
    assert "NOPERM" not in logs and "WRONGPASS" not in logs, logs
    assert acl_redis.denied() == []


@pytest.mark.redis
def test_the_compose_redis_health_check_passes_as_the_operator(
    acl_redis: AclRedis, tmp_path: Path
) -> None:
    kind, command = compose()["services"]["redis"]["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    command = command.replace("$$", "$").replace("redis-cli", f"redis-cli -p {acl_redis.port}")
    command = command.replace("/run/secrets/", f"{tmp_path}/")
    secret = tmp_path / "hookbus_operator_password"
    secret.write_text(PASSWORDS["operator"])
    assert subprocess.run(["sh", "-c", command], timeout=30).returncode == 0
    secret.write_text("wrong")
    assert subprocess.run(["sh", "-c", command], timeout=30).returncode == 1


@pytest.mark.redis
def test_hookbus_reads_its_redis_password_from_a_file(acl_redis: AclRedis, tmp_path: Path) -> None:
    """What the Compose services do: a URL without a password, and the password in a secret
    file (HOOKBUS_REDIS_PASSWORD_FILE)."""
    secret = tmp_path / "hookbus_agent_password"
    secret.write_text(PASSWORDS["agent"] + "\n")  # a file written with echo ends in a newline
    url = f"redis://agent@127.0.0.1:{acl_redis.port}/0"

    def check(**env: str) -> subprocess.CompletedProcess[str]:
        full = {k: v for k, v in os.environ.items() if not k.startswith("HOOKBUS_")}
        return subprocess.run(
            [sys.executable, "-m", "workers.cli", "check"],
            env={**full, "HOOKBUS_REDIS_URL": url, **env}, cwd=ROOT,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    ok = check(HOOKBUS_REDIS_PASSWORD_FILE=str(secret))
    assert ok.returncode == 0 and ok.stdout.startswith("ok: Redis at redis://agent:***@"), ok
    assert PASSWORDS["agent"] not in ok.stdout + ok.stderr  # the password is never printed
    assert "unknown environment variable" not in ok.stderr  # X_FILE of a known X is known
    secret.write_text("wrong")
    refused = check(HOOKBUS_REDIS_PASSWORD_FILE=str(secret))
    assert refused.returncode != 0 and "authentication failed" in refused.stderr.lower(), refused
    missing = check(HOOKBUS_REDIS_PASSWORD_FILE=str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert f"HOOKBUS_REDIS_PASSWORD_FILE={tmp_path / 'nope'}: No such file" in missing.stderr
    both = check(HOOKBUS_REDIS_PASSWORD_FILE=str(secret), HOOKBUS_REDIS_PASSWORD="x")
    assert both.returncode == 2 and "both HOOKBUS_REDIS_PASSWORD and" in both.stderr


@pytest.mark.redis
def test_each_role_is_refused_what_it_does_not_need(acl_redis: AclRedis) -> None:
    import redis

    def refused(role: str | None, *command: Any) -> type[Exception]:
        if role is None:  # RESP2: RESP3's HELLO would be refused before the command
            client = redis.Redis(port=acl_redis.port, protocol=2)
        else:
            client = redis.Redis(port=acl_redis.port, username=role, password=PASSWORDS[role])
        try:
            with pytest.raises(redis.exceptions.RedisError) as error:
                client.execute_command(*command)
            return error.type
        finally:
            client.close()

    noperm = redis.exceptions.NoPermissionError
    keys = Keys()
    events, decisions = keys.event_partitions[0], keys.decision_partitions[0]
    worker = "hook-SecretGuard"
    acl_redis.admin.xadd(events, {"data": "x"})
    assert refused(None, "PING") is redis.exceptions.AuthenticationError  # nothing anonymous
    assert refused(worker, "XADD", events, "*", "data", "forged") is noperm
    assert refused(worker, "DEL", events) is noperm
    assert refused(worker, "SET", keys.cancelled("s1"), "1") is noperm
    assert refused("agent", "DEL", events) is noperm
    read = ("XREADGROUP", "GROUP", "g", "c", "STREAMS", events, ">")
    assert refused("agent", *read) is noperm
    assert refused(worker, *read) is noperm  # a sync hook does not follow the events
    assert refused("agent", "SET", keys.manifest("Fake"), "{}") is noperm
    # An agent can neither read what is asked of a hook nor answer in a hook's place.
    requests = keys.requests("SecretGuard")
    acl_redis.admin.xadd(requests, {"data": "{}"})
    assert refused("agent", "XRANGE", requests, "-", "+") is noperm
    read = ("XREADGROUP", "GROUP", "workers", "a", "STREAMS", requests, ">")
    assert refused("agent", *read) is noperm
    assert refused("agent", "XREAD", "STREAMS", requests, "0") is noperm
    assert refused("agent", "RPUSH", keys.inbox("c1"), '{"status":"ok"}') is noperm
    assert refused("agent", "LPUSH", keys.inbox("c1"), '{"status":"ok"}') is noperm
    assert refused("agent", "SET", keys.manifest("SecretGuard"), "{}") is noperm
    assert refused("agent", "HSET", keys.modes, "SecretGuard", "dryrun") is noperm
    # Nor can a hook change how hooks are applied (modes) or forge decisions or cancellations.
    assert refused(worker, "HSET", keys.modes, "SecretGuard", "dryrun") is noperm
    assert refused(worker, "XADD", decisions, "*", "data", "forged") is noperm
    for role in ("agent", worker, "coordinator", "tenant-demo"):  # only an operator may
        assert refused(role, "SET", keys.breakglass, "{}") is noperm
        assert refused(role, "DEL", keys.breakglass) is noperm
    assert refused("coordinator", "SET", keys.manifest("Fake"), "{}") is noperm
    assert refused("coordinator", "DEL", events) is noperm
    assert refused("operator", "DEL", keys.hooks) is noperm
    assert refused("operator", "XADD", events, "*", "data", "forged") is noperm
    for role in PASSWORDS:
        assert refused(role, "GET", "elsewhere:key") is noperm
        assert refused(role, "FLUSHALL") is noperm
        assert refused(role, "CONFIG", "GET", "*") is noperm


@pytest.mark.redis
def test_every_role_reads_redis_clock_and_only_workers_publish_offsets(
    acl_redis: AclRedis,
) -> None:
    """Deadlines and liveness are on Redis's clock (bus/transport/clock.py): every role but a
    tenant's may read ``TIME``; a hook's replicas publish their offsets, coordinators and agents
    read them and cannot forge them, nor can another hook."""
    import redis

    keys = Keys()
    clocks, replicas = keys.clocks("SecretGuard"), keys.replicas("SecretGuard")
    clients = {r: redis.Redis.from_url(acl_redis.url(r)) for r in PASSWORDS}
    worker = "hook-SecretGuard"
    try:
        for user, client in clients.items():
            if user.startswith("tenant-"):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    client.time()
                continue
            secs, _ = client.time()
            assert abs(secs - time.time()) < 60
        assert clients[worker].hset(clocks, "w-1-ab", 5000) == 1
        for role in ("coordinator", "agent", "operator", worker):
            assert clients[role].hgetall(clocks) == {b"w-1-ab": b"5000"}
            assert clients[role].zrange(replicas, 0, "+inf", byscore=True) == []
        for role in ("coordinator", "agent", "operator", "hook-CancellationHook"):
            with pytest.raises(redis.exceptions.NoPermissionError):
                clients[role].hset(clocks, "w-1-ab", 0)
        assert clients[worker].hdel(clocks, "w-1-ab") == 1
    finally:
        for client in clients.values():
            client.close()


def test_the_generated_users_password_variables_are_known() -> None:
    """A hook or tenant user's password variable (start.sh reads it) is no typo to warn about;
    a variable that only looks like one is."""
    from bus.settings import unknown_variables

    env = {password_var(u): "x" for u in USERS if u != "default"}
    assert unknown_variables(env) == []
    [warned] = unknown_variables({"HOOKBUS_HOOK_GUARD_PASSWRD": "x"})
    assert warned.startswith("HOOKBUS_HOOK_GUARD_PASSWRD")


# -- the ACL file as Redis loads it -------------------------------------------------------------


def password_dir(directory: Path, users: list[str], **override: str) -> Path:
    """A --password-dir: the file DIR/USER holds the user's password(s), one per line."""
    directory.mkdir(exist_ok=True)
    for user in users:
        if user != "default":
            (directory / user).write_text(override.get(user, password(user)) + "\n")
    return directory


def generate(path: Path, passwords: Path, *more: str) -> Path:
    """The stack's users (`make acl`), with passwords from ``passwords``, written to ``path``."""
    from workers.cli import main

    assert (
        main([*make_acl_command(), "--password-dir", str(passwords), "-o", str(path), *more]) == 0
    )
    return path


class PlainRedis:
    """redis-server started with ``--aclfile FILE`` and nothing in between (no start.sh)."""

    def __init__(self, tmp: Path, aclfile: Path, *args: str, admin: str = ADMIN) -> None:
        import redis

        # a cluster node needs its bus port (+10 000) free and the port <= 55535
        self.port = cluster_port() if "--cluster-enabled" in args else free_port()
        self.log = tmp / f"redis-{self.port}.log"
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(tmp), "--logfile", str(self.log),
             "--aclfile", str(aclfile), *args],
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.admin = redis.Redis(port=self.port, username="admin", password=admin)

        def up() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"redis-server exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                return bool(self.admin.ping())
            except redis.RedisError:
                return False

        until(up, "redis-server --aclfile", timeout=20)

    def client(self, user: str, secret: str | None = None) -> Any:
        import redis

        return redis.Redis(port=self.port, username=user, password=secret or password(user))

    def close(self) -> None:
        self.admin.close()
        stop_process(self.proc)


#: One command each user's role runs (what it is for), and one it may not.
ROLE_COMMANDS: dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]] = {
    "coordinator": (("ZRANGE", "hookbus:coordinators", 0, -1), ("DEL", "hookbus:hooks")),
    "agent": (("SMEMBERS", "hookbus:hooks"), ("XRANGE", K.requests("SecretGuard"), "-", "+")),
    "operator": (("HGETALL", K.modes), ("DEL", K.hooks)),
    "scaler": (("XINFO", "GROUPS", EVENTS), ("XRANGE", EVENTS, "-", "+")),
    "admin": (("ACL", "LOAD"), ()),
    "tenant-demo": (("XADD", "hookbus:t:{demo}:decisions", "*", "data", "x"), ("TIME",)),
}


def role_commands(user: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    if user.startswith("hook-"):
        name = user.removeprefix("hook-")
        return ("SISMEMBER", K.hooks, name), ("XADD", EVENTS, "*", "data", "forged")
    return ROLE_COMMANDS[user]


@pytest.mark.redis
def test_redis_7_loads_the_generated_file_as_it_is_and_each_user_does_its_job(
    tmp_path: Path,
) -> None:
    """`hookbus acl --password-dir` writes what redis-server takes as its --aclfile and through
    ACL LOAD (the admin's command here), unedited; each user logs in with the password of its
    file, runs what its role is for and is refused what it is not."""
    import redis

    passwords = password_dir(tmp_path / "passwords", USERS)
    aclfile = generate(tmp_path / "users.acl", passwords)
    text = aclfile.read_text()
    assert "#" + hashlib.sha256(password("agent").encode()).hexdigest() in text
    assert password("agent") not in text  # hashes only
    server = PlainRedis(tmp_path, aclfile)
    try:
        server.admin.xgroup_create(EVENTS, "g", id="0", mkstream=True)
        for user in USERS:
            if user == "default":
                continue
            allowed, refused = role_commands(user)
            client = server.client(user)
            try:
                assert client.execute_command(*allowed) is not None, user
                if refused:
                    with pytest.raises(redis.exceptions.NoPermissionError):
                        client.execute_command(*refused)
            finally:
                client.close()
        with pytest.raises(redis.exceptions.AuthenticationError):
            server.client("agent", "wrong").ping()
    finally:
        server.close()
    assert "Error" not in server.log.read_text()


def test_hookbus_acl_says_which_password_file_is_missing(tmp_path: Path) -> None:
    passwords = password_dir(tmp_path / "passwords", [u for u in USERS if u != "tenant-demo"])
    result = hookbus("redis://unused", *make_acl_command(), "--password-dir", str(passwords),
                     check=False)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"hookbus: --password-dir: no password for Redis user tenant-demo: {passwords}/"
        "tenant-demo: No such file or directory"
    )


@pytest.mark.redis
def test_the_scaler_reads_lag_and_nothing_else(tmp_path: Path) -> None:
    """KEDA's user: XINFO GROUPS (lagCount), XPENDING (pendingEntriesCount), XLEN
    (streamLength) on the streams services read; no entry, no other key, no write."""
    import redis

    server = PlainRedis(tmp_path, generate(tmp_path / "u.acl", password_dir(tmp_path / "p", USERS)))
    scaler = server.client("scaler")
    try:
        streams = [EVENTS, DECISIONS, K.requests("SecretGuard"), "hookbus:t:{demo}:decisions"]
        for stream in streams:
            server.admin.xadd(stream, {"data": "secret"})
            server.admin.xgroup_create(stream, "g", id="0")
            assert scaler.xinfo_groups(stream)[0]["lag"] == 1
            assert scaler.xpending(stream, "g")["pending"] == 0
            assert scaler.xlen(stream) == 1
            for command in (("XRANGE", stream, "-", "+"), ("XREAD", "STREAMS", stream, "0"),
                            ("XINFO", "STREAM", stream), ("XADD", stream, "*", "a", "b"),
                            ("XREADGROUP", "GROUP", "g", "c", "STREAMS", stream, ">"),
                            ("DEL", stream)):  # fmt: skip
                with pytest.raises(redis.exceptions.NoPermissionError):
                    scaler.execute_command(*command)
        for command in (("GET", K.breakglass), ("HGETALL", K.modes), ("TIME",), ("KEYS", "*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                scaler.execute_command(*command)
    finally:
        scaler.close()
        server.close()


class Raw:
    """One connection, spoken to in RESP by hand: redis-py would reconnect behind our back,
    and the point is to see whether this very connection survives."""

    def __init__(self, port: int) -> None:
        import socket

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""

    def send(self, *args: str) -> None:
        parts = [f"*{len(args)}\r\n".encode()]
        parts += [f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args]
        self.sock.sendall(b"".join(parts))

    def line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            try:
                chunk = self.sock.recv(4096)
            except ConnectionResetError:  # closed by Redis before our PING reached it: a reset
                return b"(closed)"
            if not chunk:
                return b"(closed)"
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\r\n")
        return line

    def call(self, *args: str) -> bytes:
        try:
            self.send(*args)
        except (BrokenPipeError, ConnectionResetError):  # Redis closed it already
            return b"(closed)"
        return self.line()

    def close(self) -> None:
        self.sock.close()


@pytest.mark.redis
def test_rotating_a_hooks_and_a_tenants_password_keeps_their_connections(
    tmp_path: Path,
) -> None:
    """docs/security.md's rotation: the new password as a second line of the user's file,
    `hookbus acl --apply` (ACL SETUSER, as admin): both passwords work; the clients switch;
    the old line removed, --apply again: only the new works. No restart, and every connection
    stays open throughout — a tenant's BLPOP waiting for its decision gets it."""
    import redis

    users = ["hook-SecretGuard", "tenant-demo"]
    passwords = password_dir(tmp_path / "p", USERS)
    server = PlainRedis(tmp_path, generate(tmp_path / "users.acl", passwords))
    admin_url = f"redis://admin:{ADMIN}@127.0.0.1:{server.port}/0"
    apply = [*make_acl_command(), "--password-dir", str(passwords), "--apply"]
    inbox = "hookbus:t:{demo}:inbox:c1"
    hook, tenant = Raw(server.port), Raw(server.port)
    try:
        assert hook.call("AUTH", "hook-SecretGuard", password("hook-SecretGuard")) == b"+OK"
        assert tenant.call("AUTH", "tenant-demo", password("tenant-demo")) == b"+OK"
        tenant.send("BLPOP", inbox, "0")  # waiting for its decision throughout
        for user in users:
            (passwords / user).write_text(f"{password(user)}\nnew-{password(user)}\n")
        assert "ok: 12 Redis users set" in hookbus(admin_url, *apply).stdout
        for user in users:
            for secret in (password(user), f"new-{password(user)}"):
                assert server.client(user, secret).ping()
            (passwords / user).write_text(f"new-{password(user)}\n")
        hookbus(admin_url, *apply)
        for user in users:
            with pytest.raises(redis.exceptions.AuthenticationError):
                server.client(user, password(user)).ping()
            assert server.client(user, f"new-{password(user)}").ping()
        assert hook.call("PING") == b"+PONG"  # the same connection, never closed
        server.admin.rpush(inbox, "the decision")
        assert [tenant.line() for _ in range(5)][-1] == b"the decision"
        # Why --apply and not ACL LOAD: Redis 7.0 closes every connection of the users it
        # loads, even unchanged (docs/security.md).
        generate(tmp_path / "users.acl", passwords)
        assert server.admin.acl_load()
        assert hook.call("PING") == b"(closed)"
    finally:
        hook.close()
        tenant.close()
        server.close()


@pytest.mark.redis
def test_on_a_cluster_the_generated_users_work_and_a_noperm_is_one_line(tmp_path: Path) -> None:
    """A Redis Cluster (one node, every slot): without --cluster, a cluster client may not
    find the nodes, and the operator's `hookbus tenants add` says so in one line naming the
    user and the command (it was a 40-line traceback ending in "Cluster mode is not enabled");
    with --cluster (set with --apply, through the cluster client), every user's cluster client
    works."""
    import redis
    from redis.cluster import RedisCluster

    passwords = password_dir(tmp_path / "p", USERS)
    aclfile = generate(tmp_path / "users.acl", passwords)
    server = PlainRedis(tmp_path, aclfile, "--cluster-enabled", "yes", "--cluster-config-file",
                        str(tmp_path / "nodes.conf"))  # fmt: skip
    try:
        server.admin.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        until(lambda: b"cluster_state:ok" in server.admin.execute_command("CLUSTER", "INFO"),
              "the one-node cluster")  # fmt: skip
        url = f"redis+cluster://operator:{password('operator')}@127.0.0.1:{server.port}"
        denied = hookbus(url, "tenants", "add", "acme", check=False)
        assert denied.returncode == 2 and "Traceback" not in denied.stderr, denied.stderr
        (line,) = [x for x in denied.stderr.splitlines() if not x.startswith("hookbus: talking to")]
        assert re.match(r"hookbus: Redis user operator may not run (CLUSTER SLOTS|COMMAND) ",
                        line), line  # fmt: skip

        # --apply on a cluster sets every node (one here), as the admin user.
        admin = f"redis+cluster://admin:{ADMIN}@127.0.0.1:{server.port}"
        hookbus(admin, *make_acl_command(), "--password-dir", str(passwords), "--cluster",
                "--apply")  # fmt: skip
        server.admin.xgroup_create(EVENTS, "g", id="0", mkstream=True)
        hookbus(url, "tenants", "add", "acme")
        for user in USERS:
            if user in ("default", "admin"):
                continue
            allowed, _ = role_commands(user)
            client = RedisCluster(host="127.0.0.1", port=server.port, username=user,
                                  password=password(user))  # fmt: skip
            try:
                key = allowed[2] if allowed[0] == "XINFO" else allowed[1]
                target = client.get_node_from_key(key)
                assert client.execute_command(*allowed, target_nodes=target) is not None, user
            except redis.RedisError as exc:
                pytest.fail(f"{user}: {exc!r}")
            finally:
                client.close()
    finally:
        server.close()


@pytest.mark.redis
def test_the_compose_gateway_runs_as_the_coordinator_and_answers_its_probes(
    acl_redis: AclRedis, tmp_path: Path
) -> None:
    """The gateway service as Compose runs it (its command, environment and secret files, with
    this Redis and a free port): healthy by its health check (/readyz), alive on /livez, and a
    tenant's token from the token file is accepted; Redis denied it nothing."""
    import urllib.error
    import urllib.request

    service = compose()["services"]["gateway"]
    secrets, port = tmp_path / "secrets", free_port()
    secrets.mkdir()
    (secrets / "hookbus_coordinator_password").write_text(password("coordinator") + "\n")
    token = "t" * 43
    digest = hashlib.sha256(token.encode()).hexdigest()
    (secrets / "hookbus_gateway_tokens").write_text(f"demo:{digest}\n")

    def local(value: str) -> str:
        return (
            value.replace("/run/secrets/", f"{secrets}/")
            .replace("@redis:6379", f"@127.0.0.1:{acl_redis.port}")
            .replace("8787", str(port))
        )

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOOKBUS_", "OTEL_"))}
    env |= {k: local(v) for k, v in service["environment"].items() if not k.startswith("OTEL_")}
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", *map(local, service["command"])],
            env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip
    kind, python, flag, code = service["healthcheck"]["test"]
    assert (kind, python, flag) == ("CMD", "python", "-c") and "/readyz" in code
    try:
        until(
            lambda: subprocess.run([sys.executable, "-c", local(code)], capture_output=True,
                                   timeout=30).returncode == 0,
            "the gateway healthy", 60, log.read_text,
        )  # fmt: skip
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5) as answer:
            assert answer.status == 200

        def status(bearer: str) -> int:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/decisions", method="POST", data=b"{}",
                headers={"Authorization": f"Bearer {bearer}"},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    return int(answer.status)
            except urllib.error.HTTPError as exc:
                return exc.code

        assert status("wrong") == 401
        assert status(token) == 401  # a tenant the bus does not serve yet (README's next step)
        added = subprocess.run(
            [sys.executable, "-m", "workers.cli", "tenants", "add", "demo"],
            env={k: v for k, v in env.items() if not k.startswith("HOOKBUS_")}
            | {"HOOKBUS_REDIS_URL": acl_redis.url("operator")}, cwd=ROOT,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        until(lambda: status(token) == 400, "demo served", 10, log.read_text)  # past the token
    finally:
        proc.terminate()
        assert proc.wait(60) == 0, log.read_text()
    assert acl_redis.denied() == []


@pytest.mark.redis
def test_start_sh_takes_each_line_of_a_secret_file_as_a_password(tmp_path: Path) -> None:
    """Compose's rotation: while the secret file hookbus_<user>_password holds the old and the
    new password, one per line, Redis takes both."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for user in USERS:
        (secrets / f"hookbus_{user}_password").write_text(password(user) + "\n")
    (secrets / "hookbus_hook-SecretGuard_password").write_text("old-pw\nnew-pw\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKBUS_")}
    env |= {"HOOKBUS_ACL_FILE": str(tmp_path / "r.acl"), "HOOKBUS_SECRETS_DIR": str(secrets)}
    port = free_port()
    proc = subprocess.Popen(
        ["sh", str(REDIS_DIR / "start.sh"), "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    import redis

    admin = redis.Redis(port=port, username="admin", password=password("admin"))

    def up() -> bool:
        assert proc.poll() is None, "start.sh exited"
        try:
            return bool(admin.ping())
        except redis.RedisError:
            return False

    try:
        until(up, "redis-server started by start.sh", timeout=20)
        for secret in ("old-pw", "new-pw"):
            client = redis.Redis(port=port, username="hook-SecretGuard", password=secret)
            assert client.ping()
            client.close()
        (secrets / "hookbus_hook-SecretGuard_password").write_text("has a space\n")
    finally:
        admin.close()
        stop_process(proc)
    result = subprocess.run(["sh", str(REDIS_DIR / "start.sh"), "--port", str(free_port())],
                            env=env, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "start.sh: the password of Redis user hook-SecretGuard contains white space"
    )


@pytest.mark.redis
def test_a_command_redis_refuses_is_one_line_naming_the_user_and_the_command(
    acl_redis: AclRedis,
) -> None:
    """A NOPERM on a key (Redis 7.0 does not name the command then) is one line with the user
    and the command, not a traceback."""
    refused = hookbus(acl_redis.url("agent"), "tenants", "add", "acme", check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    # the Redis it talked to (every operator command says it), then the one line of the refusal
    (line,) = [x for x in refused.stderr.splitlines() if not x.startswith("hookbus: talking to")]
    assert line.startswith("hookbus: Redis user agent may not run SADD ("), line
