"""The onceflow command line, for people and for CI.

Offline: `onceflow validate FILE…` (every problem as `file:line:column: severity: path:
message`) and `onceflow schema --out PATH`. Against the database named by DATABASE_URL:
`onceflow budget WORKFLOW_ID` (cap, reserved, spent, released) and `onceflow breaker
WORKFLOW_ID [--resume [--half-open]]`.

Over the ops API (shared/ops/client.py says which credentials and where they come from):
`publish FILE [--activate]`, `activate WORKFLOW VERSION`, `deactivate WORKFLOW`, `runs
[filters]`, `show RUN`, `explain RECORD` (a record key, a HubSpot record URL, an object id or
an email), `cancel RUN --reason WHY`, `approvals`, `approve|reject APPROVAL --comment WHY`,
`replay RUN…` and `retry RUN…` (or `--failed` with filters: every failed run that matches,
listed first, done only with `--yes`). `--json` prints
the API's JSON for scripts; otherwise readable tables.

Exit codes say what happened, so a CI step can branch on them:
  0 done · 1 problems found (an invalid definition, some of a bulk action failed) · 2 usage ·
  3 not authenticated (a token is missing, wrong or lacks IAM) · 4 not found · 5 refused (the
  API said the request is not valid or conflicts) · 6 the ops function is unreachable or failing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from shared.ops.client import ApiError, Credentials, OpsClient
from shared.workflows.schema import render_schema
from shared.workflows.validate import validate_file

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_NOT_FOUND = 4
EXIT_REFUSED = 5
EXIT_UNAVAILABLE = 6


def exit_code_for(err: ApiError) -> int:
    if err.status in (401, 403):
        return EXIT_AUTH
    if err.status == 404:
        return EXIT_NOT_FOUND
    if 400 <= err.status < 500:
        return EXIT_REFUSED
    if err.status == 0 and err.code == "no_url":
        return EXIT_USAGE
    return EXIT_UNAVAILABLE


# ---- output -------------------------------------------------------------------------------


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO) -> None:
    """Columns padded to their widest cell; long cells cut so a row fits a terminal."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    print("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)), file=out)
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def _cell(value: Any, limit: int = 60) -> str:
    text = "" if value is None else str(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _when(value: str | None) -> str:
    return (value or "")[:19].replace("T", " ")


class Progress:
    """A one-line progress bar on stderr, drawn only for a terminal (CI logs stay clean)."""

    def __init__(self, total: int, err: TextIO) -> None:
        self.total, self.done, self.err = total, 0, err
        self.live = err.isatty()

    def step(self) -> None:
        self.done += 1
        if self.live:
            filled = int(30 * self.done / max(self.total, 1))
            bar = "#" * filled + "." * (30 - filled)
            self.err.write(f"\r[{bar}] {self.done}/{self.total}")
            if self.done == self.total:
                self.err.write("\n")
            self.err.flush()


# ---- offline ------------------------------------------------------------------------------


def _validate(files: Sequence[str], out: TextIO, err: TextIO) -> int:
    failed = warnings = 0
    for name in files:
        report = validate_file(name)
        for problem in report.problems:
            print(problem, file=out)
        warnings += len(report.warnings)
        if report.ok:
            print(f"{name}: ok ({len(report.warnings)} warning(s))", file=out)
        else:
            failed += 1
    # The summary is the last line: the problems (stdout, block-buffered when piped) are
    # flushed before it, so `2>&1 | less` doesn't show it first.
    out.flush()
    if failed:
        print(f"{failed} of {len(files)} file(s) have errors", file=err)
    else:
        print(f"{len(files)} file(s) ok, {warnings} warning(s)", file=out)
    return EXIT_PROBLEMS if failed else EXIT_OK


def _schema(out: str | None) -> int:
    text = render_schema()
    if out is None:
        sys.stdout.write(text)
    else:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text, encoding="utf-8")
        print(f"wrote {out}")
    return EXIT_OK


def _budget(workflow_id: str) -> int:
    from shared.budgets import workflow_summary
    from shared.db import get_database

    print(json.dumps(get_database().run(lambda tx: workflow_summary(tx, workflow_id))))
    return EXIT_OK


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
            return EXIT_PROBLEMS
    print(json.dumps(db.run(lambda tx: breaker.status(tx, workflow_id)), default=str))
    return EXIT_OK


# ---- over the ops API ---------------------------------------------------------------------


class Session:
    """One command's client and output streams."""

    def __init__(self, client: OpsClient, as_json: bool, out: TextIO, err: TextIO) -> None:
        self.client, self.as_json, self.out, self.err = client, as_json, out, err

    def emit(self, data: Any, readable: Callable[[], None]) -> None:
        if self.as_json:
            json.dump(data, self.out, indent=2)
            self.out.write("\n")
        else:
            readable()


def _run_filters(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "workflow_id": args.workflow,
        "status": getattr(args, "status", None),
        "record_key": args.record,
        "event_type": args.event_type,
        "created_after": args.since,
        "created_before": args.until,
    }


def _runs(s: Session, args: argparse.Namespace) -> int:
    query = {**_run_filters(args), "limit": args.limit, "cursor": args.cursor}
    page = s.client.call("GET", "/v1/runs", query=query)

    def readable() -> None:
        table(
            [
                (
                    r["id"],
                    r["workflow_name"],
                    r["status"],
                    _when(r["created_at"]),
                    r["record_key"],
                    r["error"],
                )
                for r in page["items"]
            ],
            ("run", "workflow", "status", "started", "record", "error"),
            s.out,
        )
        if page["next_cursor"]:
            print(f"more: --cursor {page['next_cursor']}", file=s.out)

    s.emit(page, readable)
    return EXIT_OK


def _show(s: Session, args: argparse.Namespace) -> int:
    d = s.client.call("GET", f"/v1/runs/{args.run}")

    def readable() -> None:
        r = d["run"]
        print(
            f"{r['workflow_name']} v{d['version_number']}  {r['status']}  run {r['id']}", file=s.out
        )
        print(
            f"started {_when(r['created_at'])}  finished {_when(r['finished_at']) or '-'}",
            file=s.out,
        )
        if r["record_key"]:
            print(f"record {r['record_key']}", file=s.out)
        if r["error"]:
            print(f"error: {r['error']}", file=s.out)
        table(
            [
                (
                    st["step_key"],
                    st["block_type"],
                    st["status"],
                    st["attempt"],
                    st["outcome_code"],
                    st["error"],
                )
                for st in d["steps"]
            ],
            ("step", "block", "status", "attempts", "outcome", "error"),
            s.out,
        )

    s.emit(d, readable)
    return EXIT_OK


def _record_key(s: Session, what: str) -> str:
    found = s.client.call("GET", "/v1/records/search", query={"q": what})
    items = found["items"]
    if len(items) == 1:
        return str(items[0]["record_key"])
    if not items:
        raise ApiError(404, "not_found", f"no record of your connections matches {what!r}")
    keys = "\n".join(f"  {m['record_key']}  ({m['matched_on']})" for m in items)
    raise ApiError(422, "ambiguous", f"{len(items)} records match {what!r}; name one:\n{keys}")


def _explain(s: Session, args: argparse.Namespace) -> int:
    key = _record_key(s, args.record)
    story = s.client.call("GET", "/v1/records/explain", query={"record_key": key})

    def readable() -> None:
        print(f"record {story['record_key']}", file=s.out)
        if not story["events"]:
            print("no event was received for this record", file=s.out)
        for e in story["events"]:
            print(
                f"- {_when(e['occurred_at'])}  {e['event_type']}  (event #{e['event_id']})",
                file=s.out,
            )
            for d in e["decisions"]:
                print(f"    {d['workflow_name']}: {d['outcome']} — {d['explanation']}", file=s.out)
        for row in story.get("stuck_inbox", []):
            print(f"! inbox #{row['id']} {row['status']}: {row['explanation']}", file=s.out)

    s.emit(story, readable)
    return EXIT_OK


def _publish(s: Session, args: argparse.Namespace) -> int:
    source = Path(args.file).read_text(encoding="utf-8")
    result = s.client.call("POST", "/v1/workflows", body={"source": source})
    if args.activate:
        result["activation"] = s.client.call(
            "POST",
            f"/v1/workflows/{result['workflow_id']}/activate",
            body={"version_id": result["version_id"]},
        )

    def readable() -> None:
        made = "published" if result["created"] else "already published (same content)"
        print(
            f"{args.file}: {made} as version {result['number']} "
            f"of workflow {result['workflow_id']}",
            file=s.out,
        )
        for w in result["warnings"]:
            print(f"  warning: {w['path']}: {w['message']}", file=s.out)
        if args.activate:
            print(f"  active version: {result['version_id']}", file=s.out)

    s.emit(result, readable)
    return EXIT_OK


def _activate(s: Session, args: argparse.Namespace) -> int:
    version = args.version
    if version.isdigit():  # a version number: find its id
        listed = s.client.call("GET", f"/v1/workflows/{args.workflow}/versions")
        match = [v for v in listed["items"] if v["number"] == int(version)]
        if not match:
            raise ApiError(404, "not_found", f"workflow {args.workflow} has no version {version}")
        version = match[0]["id"]
    result = s.client.call(
        "POST", f"/v1/workflows/{args.workflow}/activate", body={"version_id": version}
    )
    s.emit(
        result, lambda: print(f"workflow {args.workflow}: version {version} is active", file=s.out)
    )
    return EXIT_OK


def _deactivate(s: Session, args: argparse.Namespace) -> int:
    result = s.client.call("POST", f"/v1/workflows/{args.workflow}/deactivate", body={})
    s.emit(result, lambda: print(f"workflow {args.workflow}: deactivated", file=s.out))
    return EXIT_OK


def _cancel(s: Session, args: argparse.Namespace) -> int:
    """Cancel a running run (the API does it, audited); a run that already ended is refused
    with who ended it and when."""
    result = s.client.call("POST", f"/v1/runs/{args.run}/cancel", body={"reason": args.reason})
    skipped = ", ".join(result["skipped_steps"]) or "none"
    s.emit(
        result,
        lambda: print(f"run {args.run}: cancelled; skipped steps: {skipped}", file=s.out),
    )
    return EXIT_OK


def _confirm_install(s: Session, args: argparse.Namespace) -> int:
    """Confirm a HubSpot app install with the code its callback page showed; only the token
    that started the install may (shared/oauth_install.py says why)."""
    result = s.client.call(
        "POST",
        f"/v1/apps/hubspot/{args.app}/installs/confirm",
        body={"confirm_code": args.code},
    )
    s.emit(
        result,
        lambda: print(
            f"portal {result['portal_id']}: {result['outcome']} for tenant "
            f"{result['tenant_id']} (connection {result['connection_id']})",
            file=s.out,
        ),
    )
    return EXIT_OK


def _approvals(s: Session, args: argparse.Namespace) -> int:
    """The approvals the caller's token may decide, oldest deadline first."""
    result = s.client.call("GET", "/v1/approvals")

    def table() -> None:
        for a in result["items"]:
            print(
                f"{a['id']:>6}  until {a.get('until') or a.get('expires_at')}  "
                f"run {a['run_id']}  {a.get('summary') or ''}",
                file=s.out,
            )
        if not result["items"]:
            print("no approval waits for you", file=s.out)

    s.emit(result, table)
    return EXIT_OK


def _decide(s: Session, args: argparse.Namespace, decision: str) -> int:
    """Approve or reject one approval; a second decision is refused with who decided first."""
    body = {"comment": args.comment} if args.comment else {}
    result = s.client.call("POST", f"/v1/approvals/{args.approval}/{decision}", body=body)
    s.emit(
        result,
        lambda: print(
            f"approval {args.approval}: {result['decision']} by {result['decided_by']} "
            f"(run {result['run_id']}, step {result['step_key']})",
            file=s.out,
        ),
    )
    return EXIT_OK


def _targets(s: Session, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The runs a bulk action names: the ids given, or every failed run matching the filters."""
    if args.runs:
        return [{"id": r} for r in args.runs]
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = {**_run_filters(args), "status": "failed", "limit": 200, "cursor": cursor}
        page = s.client.call("GET", "/v1/runs", query=query)
        found += page["items"]
        cursor = page["next_cursor"]
        if not cursor or len(found) >= args.max:
            return found[: args.max]


def _bulk(s: Session, args: argparse.Namespace, action: str) -> int:
    if bool(args.runs) == bool(args.failed):
        print(f"onceflow {action}: name RUN ids, or --failed with filters", file=s.err)
        return EXIT_USAGE
    targets = _targets(s, args)
    if args.failed and not args.yes:
        preview = {"action": action, "would_apply_to": len(targets), "runs": targets}

        def show_preview() -> None:
            print(f"{len(targets)} failed run(s) match; nothing was done (add --yes):", file=s.out)
            table(
                [
                    (r["id"], r.get("workflow_name"), _when(r.get("created_at")), r.get("error"))
                    for r in targets
                ],
                ("run", "workflow", "started", "error"),
                s.out,
            )

        s.emit(preview, show_preview)
        return EXIT_OK
    body = {"reason": args.reason} if args.reason else {}
    results: list[dict[str, Any]] = []
    progress = Progress(len(targets), s.err)
    for run in targets:
        try:
            answer = s.client.call("POST", f"/v1/runs/{run['id']}/{action}", body=body)
            results.append({"run_id": run["id"], "ok": True, "result": answer})
        except ApiError as err:
            if err.status == 0 or err.status >= 500 or err.status in (401, 403):
                raise
            results.append(
                {"run_id": run["id"], "ok": False, "code": err.code, "message": err.message}
            )
        progress.step()
    failed = [r for r in results if not r["ok"]]

    def readable() -> None:
        table(
            [
                (
                    r["run_id"],
                    "done" if r["ok"] else f"refused ({r['code']})",
                    _new_run(r) if r["ok"] else r["message"],
                )
                for r in results
            ],
            ("run", action, "detail"),
            s.out,
        )
        print(f"{len(results) - len(failed)} of {len(results)} {action}ed", file=s.out)

    s.emit({"action": action, "results": results}, readable)
    return EXIT_PROBLEMS if failed else EXIT_OK


def _new_run(r: dict[str, Any]) -> str:
    result = r["result"]
    if "run" in result:
        return f"new run {result['run']['id']}"
    return f"restarted {', '.join(result.get('restarted_steps', [])) or 'nothing'}"


# ---- the parser ---------------------------------------------------------------------------


def _filters(p: argparse.ArgumentParser, *, status: bool) -> None:
    p.add_argument("--workflow", metavar="WORKFLOW_ID")
    if status:
        p.add_argument("--status", choices=("running", "succeeded", "failed", "cancelled"))
    p.add_argument("--record", metavar="RECORD_KEY")
    p.add_argument("--event-type", metavar="TYPE", help="e.g. hubspot.contact.created")
    p.add_argument("--since", metavar="ISO_TIME", help="started at or after (with a zone)")
    p.add_argument("--until", metavar="ISO_TIME", help="started before (with a zone)")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="onceflow", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = top.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="validate workflow definition files (offline)")
    validate.add_argument("files", nargs="+", metavar="FILE")
    schema = sub.add_parser("schema", help="export the workflow JSON Schema")
    schema.add_argument("--out", help="write here instead of stdout")
    budget = sub.add_parser(
        "budget", help="a workflow's budget: reserved, spent, released (DATABASE_URL)"
    )
    budget.add_argument("workflow_id")
    brk = sub.add_parser(
        "breaker", help="a workflow's circuit breaker; --resume to resume it (DATABASE_URL)"
    )
    brk.add_argument("workflow_id")
    brk.add_argument("--resume", action="store_true")
    brk.add_argument("--half-open", action="store_true", help="resume on trial")

    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument("--url", help="the ops function's URL (default: $ONCEFLOW_OPS_URL)")
    remote.add_argument("--token", help="onceflow ops token (default: $ONCEFLOW_OPS_TOKEN)")
    remote.add_argument(
        "--id-token", help="Google identity token for IAM (default: $ONCEFLOW_ID_TOKEN)"
    )
    remote.add_argument("--json", action="store_true", help="print the API's JSON")

    p = sub.add_parser("publish", parents=[remote], help="publish a definition as a new version")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--activate", action="store_true", help="and activate that version")
    p = sub.add_parser("activate", parents=[remote], help="activate a version of a workflow")
    p.add_argument("workflow", metavar="WORKFLOW_ID")
    p.add_argument("version", metavar="VERSION", help="a version id or number")
    p = sub.add_parser("deactivate", parents=[remote], help="deactivate a workflow")
    p.add_argument("workflow", metavar="WORKFLOW_ID")
    p = sub.add_parser("runs", parents=[remote], help="list runs, newest first")
    _filters(p, status=True)
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--cursor")
    p = sub.add_parser("show", parents=[remote], help="one run with its steps")
    p.add_argument("run", metavar="RUN")
    p = sub.add_parser("explain", parents=[remote], help="why did (or didn't) it run?")
    p.add_argument("record", metavar="RECORD", help="record key, HubSpot URL, object id or email")
    p = sub.add_parser("cancel", parents=[remote], help="cancel a running run")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--reason", required=True, help="why, kept on the run and in the audit log")
    p = sub.add_parser(
        "confirm-install",
        parents=[remote],
        help="confirm a HubSpot app install with the code its callback page showed",
    )
    p.add_argument("app", metavar="APP_ID")
    p.add_argument("code", metavar="CODE")
    sub.add_parser("approvals", parents=[remote], help="approvals you may decide")
    for decision in ("approve", "reject"):
        p = sub.add_parser(decision, parents=[remote], help=f"{decision} a waiting approval")
        p.add_argument("approval", metavar="APPROVAL", help="the approval's id")
        p.add_argument("--comment", help="why, kept with the decision and audited")
    for action, what in (("replay", "as new linked runs"), ("retry", "in place")):
        p = sub.add_parser(action, parents=[remote], help=f"{action} failed runs {what}")
        p.add_argument("runs", nargs="*", metavar="RUN")
        p.add_argument("--failed", action="store_true", help="every failed run matching filters")
        _filters(p, status=False)
        p.add_argument("--yes", action="store_true", help="act (without it --failed previews)")
        p.add_argument("--max", type=int, default=1000, help="at most this many runs")
        p.add_argument("--reason", help="kept in the audit log")
    return top


LOCAL: dict[str, Callable[[argparse.Namespace], int]] = {
    "validate": lambda a: _validate(a.files, sys.stdout, sys.stderr),
    "schema": lambda a: _schema(a.out),
    "budget": lambda a: _budget(a.workflow_id),
    "breaker": lambda a: _breaker(a.workflow_id, a.resume, a.half_open),
}
REMOTE: dict[str, Callable[[Session, argparse.Namespace], int]] = {
    "publish": _publish,
    "activate": _activate,
    "deactivate": _deactivate,
    "runs": _runs,
    "show": _show,
    "explain": _explain,
    "cancel": _cancel,
    "confirm-install": _confirm_install,
    "approvals": _approvals,
    "approve": lambda s, a: _decide(s, a, "approve"),
    "reject": lambda s, a: _decide(s, a, "reject"),
    "replay": lambda s, a: _bulk(s, a, "replay"),
    "retry": lambda s, a: _bulk(s, a, "retry"),
}


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    args = parser().parse_args(argv)
    if args.command in LOCAL:
        return LOCAL[args.command](args)
    try:
        creds = Credentials.from_env(args.url, args.token, args.id_token)
        with OpsClient(creds) as client:
            return REMOTE[args.command](Session(client, args.json, out, err), args)
    except ApiError as exc:
        print(f"onceflow {args.command}: {exc}", file=err)
        return exit_code_for(exc)
    except OSError as exc:  # a FILE that can't be read
        print(f"onceflow {args.command}: {exc}", file=err)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
