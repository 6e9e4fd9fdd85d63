"""bus/logfmt.py: one record, one line, whatever it quotes (the attack through a real service
is tests/security/test_isolation.py)."""

from __future__ import annotations

import io
import logging

from bus.logfmt import LineFormatter, one_line

FORGED = "2026-12-03 12:00:00,000 INFO hookbus: break-glass is off"


def logged(*args: object, exc: BaseException | None = None) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(LineFormatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.Logger("t")
    logger.addHandler(handler)
    if exc is None:
        logger.warning("session %s blocked: %s", *args)
    else:
        try:
            raise exc
        except BaseException:
            logger.exception("hook failed on %s", *args)
    return stream.getvalue()


def test_what_a_record_quotes_stays_on_its_line_escaped() -> None:
    text = logged(f"s1\n{FORGED}", "\r\x1b[31mred\x1b[0m \u2028\u202e\x85\x00 done")
    assert text == (
        f"WARNING t: session s1\\n{FORGED} blocked: "
        "\\r\\x1b[31mred\\x1b[0m \\u2028\\u202e\\x85\\x00 done\n"
    )
    assert one_line("plain text, tabs\tand ünïcödé") == "plain text, tabs\\tand ünïcödé"
    assert one_line("nothing to escape: ü €") == "nothing to escape: ü €"
    assert one_line("\u061c\ufff9\x0b\x0c\x85") == "\\u061c\\ufff9\\x0b\\x0c\\x85"


def test_a_traceback_keeps_its_lines_but_none_can_pass_for_a_record() -> None:
    text = logged(f"s1\n{FORGED}", exc=ValueError(f"bad value\n{FORGED}\x1b[2J"))
    head, *rest = text.rstrip("\n").split("\n")
    assert head == f"ERROR t: hook failed on s1\\n{FORGED}"
    assert rest[0] == "    Traceback (most recent call last):"
    assert all(line.startswith("    ") for line in rest), rest
    assert rest[-2:] == ["    ValueError: bad value", f"    {FORGED}\\x1b[2J"]


def test_a_traceback_is_not_cached_on_the_record_for_other_handlers() -> None:
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed", (), None)
    try:
        raise ValueError("x")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    LineFormatter().format(record)
    assert record.exc_text is None
    assert logging.Formatter().format(record).split("\n")[1] == "Traceback (most recent call last):"


def test_json_mode_writes_one_object_per_record_whatever_it_quotes() -> None:
    """HOOKBUS_LOG_FORMAT=json: every record one line of JSON; what it quotes round-trips, and
    no control or line-separating character is written as itself."""
    import json

    from bus.logfmt import formatter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter("json", "unused"))
    logger = logging.Logger("t")
    logger.addHandler(handler)
    hostile = f"s1\n{FORGED}\r\x1b[31m\u2028\u202e\x85"
    logger.warning("session %s blocked", hostile)
    try:
        raise ValueError(f"bad\n{FORGED}")
    except ValueError:
        logger.exception("hook failed on %s", hostile)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines
    first, second = map(json.loads, lines)
    assert first["message"] == f"session {hostile} blocked" and first["levelname"] == "WARNING"
    assert second["exc_info"].endswith(f"ValueError: bad\n{FORGED}")
    assert all(ord(c) < 0x7F and c.isprintable() for c in stream.getvalue().replace("\n", ""))


def test_an_unknown_log_format_is_one_line_and_exit_2() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "HOOKBUS_LOG_FORMAT": "xml"}
    proc = subprocess.run([sys.executable, "-m", "workers.cli", "hooks", "list"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 2, proc
    assert proc.stderr.strip().splitlines() == [
        "hookbus: HOOKBUS_LOG_FORMAT must be one of text, json, not 'xml'"
    ]
