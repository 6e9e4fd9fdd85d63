"""Import paths that moved when workers/ was laid out by role, still importable.

``workers.demo_hooks`` became ``workers.builtins.demo_hooks``, ``workers.gateway``
``workers.services.gateway``, and so on (``MOVED``). Deployments name hooks by import path
(``hookbus worker workers.demo_hooks:SecretGuard``, Kubernetes manifests, users' imports), so
an old path keeps working: it imports the module at its new path (the same module object)
and says, once, with a ``FutureWarning``, which path to write instead.

Why a meta-path finder rather than a stub module at each old path: stubs would refill the
rooms the move emptied, and a stub is a second module object whose globals are not the real
module's (a test patching ``workers.worker.X`` would patch nothing).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing's: importing typing costs the bridge re and enum
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType

#: Old import path → new import path.
MOVED = {
    "workers.worker": "workers.services.worker",
    "workers.async_worker": "workers.services.async_worker",
    "workers.coordinator_service": "workers.services.coordinator_service",
    "workers.gateway": "workers.services.gateway",
    "workers.probes": "workers.services.probes",
    "workers.loading": "workers.services.loading",
    "workers.loopwatch": "workers.services.loopwatch",
    "workers.cancellation": "workers.builtins.cancellation",
    "workers.audit": "workers.builtins.audit",
    "workers.metrics": "workers.builtins.metrics",
    "workers.redaction": "workers.builtins.redaction",
    "workers.demo_hooks": "workers.builtins.demo_hooks",
    "workers.claude_code": "workers.integrations.claude_code",
    "workers.claude_code_bridge": "workers.integrations.claude_code_bridge",
    "workers.command_hook": "workers.integrations.command_hook",
    "workers.acl": "workers.ops.acl",
    "workers.replay": "workers.ops.replay",
    "workers.health": "workers.ops.health",
    "workers.launcher": "workers.local.launcher",
    "workers.redis_server": "workers.local.redis_server",
    "workers.redis_cluster": "workers.local.redis_cluster",
}


#: Old modules split into several: importing one fails with a line naming where things went.
SPLIT = {
    "workers.operator": "workers.ops (hooks, lag, events, dead_letters, tenants, repair, "
    "breakglass, records; their rendering in workers.ops.render)",
}


def notice(old: str) -> str:
    """The one line that names an old path's new one."""
    return f"{old} moved to {MOVED[old]}: import it from there (the old path will be removed)"


class _Alias:
    """The loader of an old path: the module at its new one. (Duck-typed, as the import
    system allows: importlib.abc would import a dozen modules before the bridge starts.)"""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        import importlib

        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Already executed under its new name."""


class _MovedFinder:
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> ModuleSpec | None:
        if fullname in SPLIT:
            raise ModuleNotFoundError(f"{fullname} was split into {SPLIT[fullname]}")
        new = MOVED.get(fullname)
        if new is None:
            return None
        import warnings
        from importlib.machinery import ModuleSpec

        warnings.warn(notice(fullname), FutureWarning, stacklevel=2)
        return ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Answer the old paths, after every other finder (a module still there wins)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
