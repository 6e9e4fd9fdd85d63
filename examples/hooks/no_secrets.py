from bus import CONTINUE, AgentHook, Block, HookEvent, MutateInput, ToolMatchFilter


class NoSecrets(AgentHook):
    """Keeps the agent out of secret files and its shell commands out of production."""

    subscribed_events = (HookEvent.PRE_TOOL_USE,)
    match_filter = ToolMatchFilter.parse(["file_*", "run_shell"])
    timeout = 2.0  # seconds; past it the call is skipped...
    failure_policy = "fail"  # ...unless we say so: then an unanswered call is blocked
    enforcement = "enforce"  # roll out with "dryrun", then "warn"

    def __init__(self, suffixes=(".env", ".pem")):  # hookbus worker --set suffixes=[...]
        self.suffixes = tuple(suffixes)

    async def pre_tool_use(self, ctx):
        path = str(ctx.tool_args.get("path", ""))
        if path.endswith(self.suffixes) or "/secrets/" in path:
            return Block(reason=f"{path} holds secrets; ask a person for what you need")
        command = str(ctx.tool_args.get("command", ""))
        if "--env=prod" in command:
            safer = command.replace("--env=prod", "--env=staging")
            return MutateInput(
                updated_args={**ctx.tool_args, "command": safer},
                additional_context="production is off limits; the command now targets staging",
            )
        return CONTINUE
