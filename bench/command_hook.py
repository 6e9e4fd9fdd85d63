"""A command hook as other agent CLIs run them: one process per call, JSON in, JSON out.

``python bench/command_hook.py NAME`` reads one PreToolUse event as JSON on stdin (the fields
Claude Code's hooks receive) and writes an "allow" decision as JSON on stdout. It is what
``bench.command_hooks`` starts once per hook per call; it imports nothing beyond ``json`` and
``sys``, as small a Python hook as one can write.
"""

import json
import sys


def main() -> None:
    event = json.load(sys.stdin)
    name = sys.argv[1] if len(sys.argv) > 1 else "command-hook"
    decision = {
        "hookSpecificOutput": {
            "hookEventName": event["hook_event_name"],
            "permissionDecision": "allow",
            "permissionDecisionReason": f"{name}: {event['tool_name']} allowed",
        }
    }
    json.dump(decision, sys.stdout)


if __name__ == "__main__":
    main()
