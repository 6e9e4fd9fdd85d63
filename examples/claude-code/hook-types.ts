// The types the schemas are made from: Claude Code's hook input and (synchronous) output, as
// @anthropic-ai/claude-agent-sdk declares them (sdk.d.ts).
export type { HookInput, SyncHookJSONOutput } from "@anthropic-ai/claude-agent-sdk";
