#!/bin/bash
# A Claude Code PostToolUse hook, as written for Claude Code (nothing in it knows HookBus): it
# redacts API keys within the strings of tool_response and answers it in the same shape. Claude
# Code applies updatedToolOutput only when it has tool_response's shape (Read and Bash give
# objects; a string in their place is ignored and the original shown). Nothing to redact: it
# prints nothing.
jq -c '
  (.tool_response | walk(if type == "string"
    then gsub("API_KEY=[^\\s\"]+"; "API_KEY=[redacted]") else . end)) as $redacted
  | if $redacted == .tool_response then empty
    else {hookSpecificOutput: {hookEventName: "PostToolUse", updatedToolOutput: $redacted,
          additionalContext: "an API key was redacted from the tool output"}} end'
