"""Agents and hooks from elsewhere: Claude Code's hook input and output (``claude_code``), its
command bridge (``claude_code_bridge``), existing Claude Code hook scripts as HookBus hooks
(``command_hook``)."""
