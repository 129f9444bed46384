"""The onceflow command line: `onceflow validate FILE…` and `onceflow schema --out PATH`.

`validate` prints every problem as `file:line:column: severity: path: message` and exits 1
when any file has an error (warnings alone exit 0).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from shared.workflows.schema import render_schema
from shared.workflows.validate import validate_file


def _validate(files: Sequence[str]) -> int:
    failed = 0
    for name in files:
        report = validate_file(name)
        for problem in report.problems:
            print(problem)
        if report.ok:
            print(f"{name}: ok ({len(report.warnings)} warning(s))")
        else:
            failed += 1
    if failed:
        print(f"{failed} of {len(files)} file(s) have errors", file=sys.stderr)
    return 1 if failed else 0


def _schema(out: str | None) -> int:
    text = render_schema()
    if out is None:
        sys.stdout.write(text)
    else:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text, encoding="utf-8")
        print(f"wrote {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="onceflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="validate workflow definition files")
    validate.add_argument("files", nargs="+", metavar="FILE")
    schema = sub.add_parser("schema", help="export the workflow JSON Schema")
    schema.add_argument("--out", help="write here instead of stdout")
    args = parser.parse_args(argv)
    if args.command == "validate":
        return _validate(args.files)
    return _schema(args.out)


if __name__ == "__main__":
    sys.exit(main())
