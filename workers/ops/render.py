"""How the operator's queries look in a terminal: ``rich`` renderables of their plain data."""

from __future__ import annotations

import datetime as dt
import json
import os

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from bus import limits
from bus.logfmt import one_line
from bus.protocol import AuditRecord
from bus.transport.keys import DLQ_MAXLEN, Keys
from workers.ops.common import _ago
from workers.ops.dead_letters import Cut, DeadLetter
from workers.ops.events import TailedEvent
from workers.ops.hooks import HookRow
from workers.ops.lag import GroupLag


def make_console(stderr: bool = False) -> Console:
    """A console; written to a pipe or file, tables are not squeezed into 80 columns."""
    console = Console(stderr=stderr)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(stderr=stderr, width=200)
    return console


def _clock(ms: int, with_date: bool = True) -> str:
    moment = dt.datetime.fromtimestamp(ms / 1000).astimezone()
    text = moment.strftime("%Y-%m-%d %H:%M:%S.%f" if with_date else "%H:%M:%S.%f")
    return text[:-3]


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", highlight=False)
    for column in columns:
        justify = "right" if column in _NUMERIC else "left"
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    return table


_NUMERIC = {"priority", "timeout", "live", "last beat", "lag", "pending", "lost"}


_NUMERIC |= {"oldest pending"}


_NUMERIC |= {"consumers", "idle", "deliveries", "value"}


def _row(table: Table, *cells: object, style: str = "") -> None:
    """A row of cells shown as text, each escaped: much of what a table shows was written by a
    hook's or a tenant's Redis user (a manifest's patterns, a problem), and an escape sequence
    in it must not reach the operator's terminal."""
    table.add_row(*(Text(one_line(str(c))) for c in cells), style=style or None)


def _streams(r: HookRow, partitions: int) -> str:
    """What a hook reads: a sync hook its shards, an async hook every partition."""
    if r.kind == "sync":
        return f"{r.shards} shard" + ("s" if r.shards != 1 else "")
    return f"{partitions} partition" + ("s" if partitions != 1 else "")


def render_hooks(
    rows: list[HookRow], keys: Keys, liveness_secs: float, partitions: int | None = None
) -> RenderableType:
    if not rows:
        return Text(f"no hooks registered in {keys.hooks}")
    title = f"hooks in {keys.hooks} (live: heartbeat within {liveness_secs:g}s)"
    table = _table(
        title, "hook", "kind", "mode", "events", "match", "policy", "priority", "timeout",
        "live", "last beat", "streams",
    )  # fmt: skip
    if any(r.problem or r.health for r in rows):
        table.add_column("problem", overflow="fold")
    for r in rows:
        if r.stopped:
            last = f"stopped {_ago(r.stopped_secs)} ago"
        else:
            last = _ago(r.last_heartbeat_secs) if r.replicas else "never"
        live = f"{r.live} of {r.replicas}" if r.replicas != r.live else str(r.live)
        if r.lanes > r.replicas:  # --shards: processes, and their lanes apart
            lanes = f"{r.live_lanes} of {r.lanes}" if r.lanes != r.live_lanes else str(r.lanes)
            live += f" ({lanes} lanes)"
        if r.problem:
            cells = (r.name, r.kind, "-", "-", "-", "-", "-", "-", live, last, "-", r.problem)
            _row(table, *cells, style="red")
            continue
        match = [f"tool {p}" for p in r.tool_names] + [f"content {p}" for p in r.tool_content]
        cells: list[object] = [
            r.name,
            r.kind if r.scope != "session" else f"{r.kind} (session)",
            f"{r.mode} (operator)" if r.mode_set_by_operator else r.mode,
            ", ".join(r.events) or "all",
            "; ".join(match) or "any",
            r.failure_policy,
            r.priority,
            "default" if r.timeout is None else f"{r.timeout:g}s",
            live,
            last,
            _streams(r, partitions if partitions is not None else keys.partitions),
        ]
        if len(table.columns) > 11:
            cells.append(r.health)  # what the hook says is wrong with it
        _row(table, *cells, style="red" if r.health else "" if r.live else "yellow")
    return table


def render_lag(rows: list[GroupLag]) -> RenderableType:
    if not rows:
        return Text("no consumer groups yet (no async hook has joined the events stream)")
    table = _table(
        "consumer groups",
        "stream", "group", "lag", "pending", "lost", "oldest pending", "consumers", "idle",
        "note",
    )  # fmt: skip
    for r in rows:
        notes = []
        if r.lost:
            notes.append(f"LOST {r.lost}: cut by the stream cap before handled (see dlq list)")
        if r.at_risk:
            notes.append(f"AT RISK: backlog {r.backlog} past half the stream cap of {r.cap}")
        elif r.consumers == 0 and r.backlog:
            notes.append("no consumer")
        _row(
            table,
            r.stream,
            r.group,
            "?" if r.lag is None else r.lag,
            r.pending,
            r.lost,
            _ago(r.oldest_pending_secs),
            r.consumers,
            _ago(r.idle_secs),
            "; ".join(notes),
            style="red" if r.at_risk or r.lost else "",
        )
    return table


def render_event(event: TailedEvent, width: int = 100) -> Text:
    """One line: time, event, session, tool, short context."""
    when = _clock(event.ts, with_date=False)
    if event.problem:
        return Text(f"{when}  malformed entry {event.entry_id}: {event.problem}", style="red")
    rest = {k: v for k, v in event.context.items() if k not in ("session_id", "tool_name")}
    context = json.dumps(rest, ensure_ascii=False, separators=(",", ":")) if rest else ""
    line = Text(f"{when}  ")
    line.append(f"{event.event:<18}", style="bold")
    line.append(f"  {event.session_id or '-'}  {event.tool or '-'}  {_short(context, width)}")
    return line


def render_dlq_cuts(cuts: list[Cut]) -> list[Text]:
    """One red line per unit whose dead-letter cap cut letters."""
    return [
        Text(
            f"CUT {c.count}: {c.unit}'s dead letters ({c.stream}) cut by its cap of "
            f"~{DLQ_MAXLEN} (oldest first); see docs/reliability.md",
            style="bold red",
        )
        for c in cuts
    ]


def render_dead_letters(
    letters: list[DeadLetter],
    more: bool,
    keys: Keys,
    hook: str | None,
    cuts: list[Cut] | None = None,
) -> RenderableType:
    whose = f" of {hook}" if hook else ""
    where = keys.hook_dlq(hook) if hook else "every unit's dead-letter stream"
    lines = render_dlq_cuts(cuts or [])
    if not letters:
        return Group(Text(f"no dead letters{whose} in {where}"), *lines)
    table = _table(f"dead letters{whose} ({where})", "id", "time", "unit", "hook/source")
    table.add_column("deliveries", justify="right")
    table.add_column("reason", overflow="ellipsis", no_wrap=True, max_width=80)
    for d in letters:
        source = d.hook or d.source
        _row(table, d.id, _clock(d.ts), d.unit, source, d.deliveries or "-", d.reason)
    if more:
        lines.append(Text(f"showing the {len(letters)} newest; raise --limit to see more"))
    return Group(table, *lines) if lines else table


def render_audit(records: list[AuditRecord], broken: int, keys: Keys) -> RenderableType:
    if not records and not broken:
        return Text(f"nothing in the audit trail {keys.audit}")
    table = _table(f"audit trail {keys.audit}", "time", "what", "hook / by", "event", "session")
    table.add_column("tool")
    table.add_column("detail", overflow="ellipsis", no_wrap=True, max_width=80)
    for r in records:
        if r.kind == "breakglass":
            what = f"break-glass {r.mode}"
            detail = r.detail + (f" (until {_clock(r.until_ms)})" if r.mode == "on" else "")
            _row(table, _clock(r.ts), what, r.by, "", "", "", detail, style="bold red")
            continue
        if r.kind in ("tenant", "repair"):
            what = "repair" if r.kind == "repair" else f"tenant {r.mode}"
            _row(table, _clock(r.ts), what, r.by, "", "", "", r.detail, style="bold")
            continue
        detail = r.detail + (f" [break-glass: {r.breakglass}]" if r.breakglass else "")
        event = r.event.value if r.event is not None else ""
        _row(table, _clock(r.ts), r.mode, r.hook, event, r.session_id, r.tool_name, detail)
    if not broken:
        return table
    return Group(table, Text(f"{broken} entries could not be read (not AuditRecords)"))


def render_dead_letter(letter: DeadLetter) -> RenderableType:
    table = Table(show_header=False, box=None, highlight=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("id", Text(letter.id))
    if letter.unit:
        table.add_row("unit", Text(f"{letter.unit} ({letter.stream})"))
    table.add_row("time", Text(_clock(letter.ts)))
    for name, value in letter.fields.items():
        if name != "data":
            table.add_row(name, Text(value))
    try:  # a dead letter is often what no decoder could take: bounded before it is parsed
        limits.check(letter.data.encode("utf-8", "surrogatepass"), "data")
        pretty = json.dumps(json.loads(letter.data), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return Group(table, Text("data:", style="bold"), Text(letter.data))
    return Group(table, Text("data (JSON):", style="bold"), Text(pretty))


def render_metrics(metrics: dict[str, dict[str, str]]) -> RenderableType:
    if not metrics:
        return Text("no metrics collected yet")
    table = _table("metrics", "hook", "figure", "value")
    for hook, figures in metrics.items():
        for name, value in sorted(figures.items()):
            _row(table, hook, name, _number(value))
    return table


def _number(value: str) -> str:
    try:
        number = float(value)
    except ValueError:
        return value
    if number.is_integer() and "." not in value:
        return str(int(number))
    return f"{number:.3f}".rstrip("0").rstrip(".")
