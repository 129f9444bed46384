"""The onceflow command line: `onceflow validate FILE…`, `onceflow schema --out PATH`, and
against the database named by DATABASE_URL: `onceflow budget WORKFLOW_ID` (cap, reserved,
spent, released) and `onceflow breaker WORKFLOW_ID [--resume [--half-open]]`.

`validate` prints every problem as `file:line:column: severity: path: message` and exits 1
when any file has an error (warnings alone exit 0).
"""

from __future__ import annotations

import argparse
import json
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


def _budget(workflow_id: str) -> int:
    from shared.budgets import workflow_summary
    from shared.db import get_database

    print(json.dumps(get_database().run(lambda tx: workflow_summary(tx, workflow_id))))
    return 0


def _breaker(workflow_id: str, resume: bool, half_open: bool) -> int:
    """Show the breaker; with --resume, close (or half-open) it, audited like the ops call."""
    from shared import breaker
    from shared.db import get_database

    db = get_database()
    if resume:
        moved = db.run(
            lambda tx: breaker.resume_audited(
                tx, workflow_id, half_open=half_open, by="cli", reason=None
            )
        )
        if moved is None:
            print(f"workflow {workflow_id}'s circuit breaker is not open", file=sys.stderr)
            return 1
    print(json.dumps(db.run(lambda tx: breaker.status(tx, workflow_id)), default=str))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="onceflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="validate workflow definition files")
    validate.add_argument("files", nargs="+", metavar="FILE")
    schema = sub.add_parser("schema", help="export the workflow JSON Schema")
    schema.add_argument("--out", help="write here instead of stdout")
    budget = sub.add_parser("budget", help="a workflow's budget: reserved, spent, released")
    budget.add_argument("workflow_id")
    brk = sub.add_parser("breaker", help="a workflow's circuit breaker; --resume to resume it")
    brk.add_argument("workflow_id")
    brk.add_argument("--resume", action="store_true")
    brk.add_argument("--half-open", action="store_true", help="resume on trial")
    args = parser.parse_args(argv)
    if args.command == "validate":
        return _validate(args.files)
    if args.command == "budget":
        return _budget(args.workflow_id)
    if args.command == "breaker":
        return _breaker(args.workflow_id, args.resume, args.half_open)
    return _schema(args.out)


if __name__ == "__main__":
    sys.exit(main())
