"""HookBus's processes and what they run, by role: ``services`` (each long-running process),
``builtins`` (the hooks HookBus ships), ``integrations`` (Claude Code and command hooks),
``ops`` (what an operator asks), ``local`` (Redis servers and stacks on this machine), ``cli``
(the ``hookbus`` command) and ``testing`` (the hook author's harness)."""

from workers import moved

moved.install()
