"""deploy/k8s-cluster: the Kubernetes stack on a Redis Cluster, scaled by KEDA per partition.

* Every object in the overlay validates (KEDA's schema in deploy/schemas/, Kubernetes' otherwise,
  as tests/test_deploy.py does for the base), and the kustomization names every file.
* Every patch names an object of the base, so that kustomize has something to patch.
* The triggers follow the key layout (bus/transport/keys.py) for the overlay's HOOKBUS_PARTITIONS:
  an async hook's ScaledObject has one trigger per events partition on its own group (and one on
  the audit trail if it follows it), the coordinator service's one per decisions partition on
  group ``coordinators``, a sync hook's one per request shard (its ``--shards``) on ``workers``;
  every Deployment that runs ``worker`` or ``coordinator`` is scaled by exactly one.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from typing import Any

import pytest
import yaml

from bus.hooks import AsyncAgentHook, spec_of
from bus.transport.keys import COORDINATORS_GROUP, WORKERS_GROUP, Keys
from tests.harness import ROOT
from tests.test_deploy import K8S, manifests, validate_manifest
from workers.services.loading import parse_config
from workers.services.worker import load_hook

OVERLAY = K8S.parent / "k8s-cluster"


def overlay_docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(OVERLAY.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return out


def kustomization() -> dict[str, Any]:
    return dict(yaml.safe_load((OVERLAY / "kustomization.yaml").read_text()))


@pytest.mark.parametrize(
    "doc",
    [d for _, d in overlay_docs()],
    ids=[f"{f}:{d['metadata']['name']}" for f, d in overlay_docs()],
)
def test_every_object_of_the_overlay_validates(doc: dict[str, Any]) -> None:
    validate_manifest(doc)


def test_the_kustomization_names_every_file_and_patches_only_what_the_base_has() -> None:
    k = kustomization()
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    assert k["resources"][0] == "../k8s"
    files = {p.name for p in OVERLAY.glob("*.yaml")} - {"kustomization.yaml"}
    patch_files = {p["path"] for p in k["patches"] if "path" in p}
    assert set(k["resources"][1:]) | patch_files == files
    base = {(d["kind"], d["metadata"]["name"]) for _, _, d in manifests()}
    for name in patch_files:
        for doc in yaml.safe_load_all((OVERLAY / name).read_text()):
            assert (doc["kind"], doc["metadata"]["name"]) in base, (name, doc["metadata"]["name"])
    for patch in (p for p in k["patches"] if "target" in p):
        assert ("Deployment", patch["target"]["name"]) in base
        assert yaml.safe_load(patch["patch"]) == [{"op": "remove", "path": "/spec/replicas"}]


def partitions() -> int:
    (config,) = [d for _, d in overlay_docs() if d["kind"] == "ConfigMap"]
    return int(config["data"]["HOOKBUS_PARTITIONS"])


def set_config(args: list[str]) -> dict[str, str]:
    """The ``--set KEY=VALUE`` pairs of ``hookbus worker`` arguments (a relative file path as the
    image's working directory, the repository's root, resolves it)."""
    config = parse_config([args[i + 1] for i, a in enumerate(args) if a == "--set"])
    return {
        k: str(ROOT / v) if isinstance(v, str) and (ROOT / v).is_file() else v
        for k, v in config.items()
    }


def expected_triggers(args: list[str], keys: Keys) -> set[tuple[str, str]]:
    """(stream, group) of every stream the Deployment running ``hookbus *args`` reads."""
    if args[0] == "coordinator":
        return {(s, COORDINATORS_GROUP) for s in keys.decision_partitions}
    hook = load_hook(args[1], config=set_config(args))
    name = spec_of(hook).name
    if isinstance(hook, AsyncAgentHook):
        streams = set(keys.event_partitions) | ({keys.audit} if hook.follows_audit_trail else set())
        return {(s, name) for s in streams}
    shards = int(args[args.index("--shards") + 1]) if "--shards" in args else 1
    return {(keys.requests(name, k, shards), WORKERS_GROUP) for k in range(shards)}


def test_each_service_scales_on_every_stream_it_reads_one_trigger_each() -> None:
    keys = Keys("hookbus", partitions())
    assert partitions() > 1
    deployments = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["args"]
        for _, _, d in manifests()
        if d["kind"] == "Deployment"
        # the gateway reads no stream: it answers HTTP requests (its replicas are fixed)
        and d["spec"]["template"]["spec"]["containers"][0]["args"][0] != "gateway"
    }
    scaled = {
        d["spec"]["scaleTargetRef"]["name"]: d
        for _, d in overlay_docs()
        if d["kind"] == "ScaledObject"
    }
    assert set(scaled) == set(deployments)
    for name, so in scaled.items():
        triggers = so["spec"]["triggers"]
        assert {t["type"] for t in triggers} == {"redis-cluster-streams"}, name
        assert {t["authenticationRef"]["name"] for t in triggers} == {"hookbus-redis"}, name
        found = [(t["metadata"]["stream"], t["metadata"]["consumerGroup"]) for t in triggers]
        assert len(found) == len(set(found)), name
        assert set(found) == expected_triggers(deployments[name], keys), name


def test_kedas_credentials_name_the_cluster_nodes_the_secret_holds() -> None:
    docs = [d for _, d in overlay_docs()]
    (auth,) = [d for d in docs if d["kind"] == "TriggerAuthentication"]
    refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
    assert set(refs) == {"addresses", "username", "password"}
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    secret = secrets[refs["addresses"]["name"]]
    nodes = secret["stringData"][refs["addresses"]["key"]].split(",")
    assert len(nodes) >= 3 and all(n.rpartition(":")[2].isdigit() for n in nodes)
    redis_urls = [k for k in secret["stringData"] if k.endswith("-url") and k != "audit-db-url"]
    urls = [secret["stringData"][k] for k in redis_urls]
    assert urls and all(u.startswith("redis+cluster://") for u in urls)


def test_the_readme_command_prints_the_streams_the_triggers_name() -> None:
    """README.md gives the command that prints the partitions' streams for a number of
    partitions; for the overlay's number, it prints exactly those of the triggers."""
    (line,) = [
        line for line in (OVERLAY / "README.md").read_text().splitlines()
        if line.startswith('python -c "from bus.transport.keys import Keys')
    ]  # fmt: skip
    command = shlex.split(line)
    assert f"Keys('hookbus', {partitions()})" in command[2]
    out = subprocess.run(
        [sys.executable, "-c", command[2]], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    streams = {
        t["metadata"]["stream"]
        for _, d in overlay_docs()
        if d["kind"] == "ScaledObject"
        for t in d["spec"]["triggers"]
        if ":events:" in t["metadata"]["stream"] or ":decisions:" in t["metadata"]["stream"]
    }
    assert sorted(out) == sorted(streams)


def test_every_secret_of_the_overlay_names_the_cluster_and_keeps_each_hooks_own_user() -> None:
    """Each Secret's URLs are redis+cluster:// ones, and each hook service keeps its own Redis
    user (hook-NAME), as in the base."""
    built = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True, check=True
    )
    secrets = [d for d in yaml.safe_load_all(built.stdout) if d and d["kind"] == "Secret"]
    urls = {
        (s["metadata"]["name"], k): v
        for s in secrets
        for k, v in s.get("stringData", {}).items()
        if k.endswith("-url") and k != "audit-db-url"  # the audit log's PostgreSQL
    }
    assert urls and all(v.startswith("redis+cluster://") for v in urls.values()), urls
    hooks = {n: v for (n, k), v in urls.items() if n.startswith("hookbus-hook-")}
    assert len(hooks) == 5 and all("://hook-" in v for v in hooks.values()), hooks
    assert not any("://worker:" in v for v in urls.values())
