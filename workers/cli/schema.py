"""``hookbus schema export``: JSON Schema and AsyncAPI of the wire protocol."""

from __future__ import annotations

import argparse
import sys


def _schema(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bus.schema import drift, export

    directory = Path(args.out)
    if args.check:
        problems = drift(directory)
        for p in problems:
            print(f"{directory}/{p}", file=sys.stderr)
        if problems:
            print(
                "schema drift: run `hookbus schema export` and commit the result", file=sys.stderr
            )
            return 1
        print(f"{directory} matches the code")
        return 0
    written = export(directory)
    print(f"wrote {len(written)} files to {directory}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    schema = sub.add_parser("schema", help="JSON Schema and AsyncAPI of the wire protocol")
    schema_sub = schema.add_subparsers(dest="schema_command", required=True, metavar="ACTION")
    export_cmd = schema_sub.add_parser("export", help="write docs/schema/ from the code")
    export_cmd.add_argument("--out", default="docs/schema", help="directory (docs/schema)")
    export_cmd.add_argument("--check", action="store_true", help="only compare; exit 1 on drift")
    export_cmd.set_defaults(func=_schema)
