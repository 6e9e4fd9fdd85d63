"""The hooks HookBus ships: the specification's embedded built-ins (``embedded``:
CancellationHook, MetricsHook, AuditLogHook, ``with_builtins``), and the services' built-in
hooks (``cancellation``, ``audit``, ``metrics``, ``redaction``, ``demo_hooks``, ``policy``, and
``mcp_guards`` for MCP tools).

``from workers.builtins import with_builtins`` (the path before this package existed) still
works: names not found here are looked up in ``embedded``.
"""

from bus.lazy import names_of

__getattr__ = names_of(__name__, "embedded")
