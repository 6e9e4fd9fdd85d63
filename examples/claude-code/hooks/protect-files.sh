#!/bin/bash
# A Claude Code PreToolUse hook for Edit and Write, as written for Claude Code: it answers with
# JSON on stdout, denying edits of lock files and asking before edits of anything under config/.
FILE=$(jq -r '.tool_input.file_path // empty')
decide() {
  jq -n --arg d "$1" --arg r "$2" \
    '{hookSpecificOutput: {hookEventName: "PreToolUse", permissionDecision: $d, permissionDecisionReason: $r}}'
}
case "$FILE" in
  *.lock) decide deny "$FILE is generated: edit its source instead" ;;
  */config/*) decide ask "$FILE configures production" ;;
esac
exit 0
