#!/bin/bash
# A Claude Code PreToolUse hook for the Bash tool, as written for Claude Code (nothing in it knows
# HookBus): it blocks `rm -rf` by exiting with 2, the reason on stderr.
COMMAND=$(jq -r '.tool_input.command // empty')
if echo "$COMMAND" | grep -q 'rm -rf'; then
  echo "Blocked: rm -rf is not allowed here" >&2
  exit 2
fi
exit 0
