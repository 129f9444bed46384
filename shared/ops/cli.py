"""The onceflow command line, for people and for CI.

Offline: `onceflow validate FILE…` (every problem as `file:line:column: severity: path:
message`) and `onceflow schema --out PATH`.

Everything else goes over the ops API (shared/ops/client.py says which credentials and where
they come from). Setting up: `tenants create|list`, `connections create|list`, `tokens
create|list|revoke` (creating tenants and tokens takes an admin token), `messaging
show|slack|smtp` and `approvers add|list|remove` (how approvals reach people:
shared/ops/cli_people.py). Workflows: `workflows`
(ids, names, versions), `publish FILE [--activate]`, `activate WORKFLOW VERSION`, `deactivate
WORKFLOW`, `budget WORKFLOW`, `breaker WORKFLOW [--resume [--half-open]]` (a WORKFLOW by id or
name). Runs: `runs [filters]` (`--since 1h`, `--since 2026-12-01`), `show RUN`, `explain
RECORD` (a record key, a HubSpot record URL, an object id or an email), `explain --would-run
WORKFLOW RECORD` (would it start a run now, and if not why: admission's reason; exit 1 for
no), `rehearse WORKFLOW --record RECORD` (a dry run: real CRM reads, the writes it would
send, never sent), `cancel RUN --reason
WHY`, `approvals`, `approve|reject APPROVAL --comment WHY`, `replay RUN…` and `retry RUN…`
(or `--failed` with filters: every failed run that matches, listed first, done only with
`--yes`). `--json` prints the API's JSON (UTC times) for scripts; otherwise tables at most 100
characters wide, with times relative and in the local zone.

Exit codes say what happened, so a CI step can branch on them:
  0 done · 1 problems found (an invalid definition, some of a bulk action failed) · 2 usage ·
  3 not authenticated (a token is missing, wrong or lacks IAM) · 4 not found · 5 refused (the
  API said the request is not valid or conflicts) · 6 the ops function is unreachable or failing
  · 141 the reader closed the pipe (`onceflow runs | head`), quietly.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from shared.admission.redecide import REDECIDABLE
from shared.ops import cli_outbound, cli_people, terminal
from shared.ops.client import ApiError, Credentials, OpsClient
from shared.providers import registry
from shared.providers.descriptor import ProjectSpec, SubscriptionKey
from shared.publishing.schema import render_schema
from shared.publishing.validate import validate_file
from shared.steps.states import RunStatus

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_NOT_FOUND = 4
EXIT_REFUSED = 5
EXIT_UNAVAILABLE = 6
# The reader went away (`onceflow runs | head`): 128 + SIGPIPE, as cat, grep or yes end.
EXIT_CLOSED_PIPE = 141
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$")


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
    terminal.table(rows, headers, out)


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


def _test(args: argparse.Namespace) -> int:
    """`onceflow test SCENARIO.yaml…`: each scenario played on a virtual clock against a
    throwaway database and the fake CRM (devstack/scenario.py). 0 all passed, 1 an expectation
    failed (expected and actual printed), 2 a scenario is invalid (file:line:column)."""
    try:
        # Looked up at run time: the local stack (fake CRM, throwaway cluster) is in a
        # checkout, never in the deployed bundle, and stays outside shared/'s type check.
        scenario = importlib.import_module("devstack.scenario")
    except ImportError:
        print(
            "onceflow test: run it from a checkout of onceflow (needs devstack/)", file=sys.stderr
        )
        return EXIT_USAGE
    return int(scenario.main(args.files, sys.stdout, sys.stderr, database_url=args.database_url))


def _schema(out: str | None) -> int:
    text = render_schema()
    if out is None:
        sys.stdout.write(text)
    else:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text, encoding="utf-8")
        print(f"wrote {out}")
    return EXIT_OK


# ---- over the ops API ---------------------------------------------------------------------


class Session:
    """One command's client and output streams."""

    def __init__(self, client: OpsClient, as_json: bool, out: TextIO, err: TextIO) -> None:
        self.client, self.as_json, self.out, self.err = client, as_json, out, err

    def say(self, data: Any, line: Callable[[], str]) -> None:
        """`data` as JSON, or the one line a person reads."""
        self.emit(data, lambda: print(line(), file=self.out))

    def emit(self, data: Any, readable: Callable[[], None]) -> None:
        if self.as_json:
            json.dump(data, self.out, indent=2)
            self.out.write("\n")
        else:
            readable()


def _workflow_id(s: Session, named: str) -> str:
    """A workflow named by its id or by its name (unique among the caller's workflows)."""
    if _UUID.match(named):
        return named
    listed = s.client.call("GET", "/v1/workflows")["items"]
    matches = [w for w in listed if w["name"] == named]
    if len(matches) == 1:
        return str(matches[0]["id"])
    if not matches:
        raise ApiError(404, "not_found", f"no workflow named {named!r} (onceflow workflows)")
    ids = "\n".join(f"  {w['id']}  (tenant {w['tenant_id']})" for w in matches)
    raise ApiError(422, "ambiguous", f"{len(matches)} workflows are named {named!r}:\n{ids}")


def _run_filters(s: Session, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "workflow_id": _workflow_id(s, args.workflow) if args.workflow else None,
        "status": getattr(args, "status", None),
        "record_key": args.record,
        "event_type": args.event_type,
        "created_after": args.since,
        "created_before": args.until,
    }


def _runs(s: Session, args: argparse.Namespace) -> int:
    query = {**_run_filters(s, args), "limit": args.limit, "cursor": args.cursor}
    page = s.client.call("GET", "/v1/runs", query=query)
    if args.quiet and not s.as_json:  # ids only, one a line: RUN=$(onceflow runs -q | head -1)
        for r in page["items"]:
            print(r["id"], file=s.out)
        return EXIT_OK

    def readable() -> None:
        table(
            [
                (
                    r["id"],
                    r["workflow_name"],
                    r["status"],
                    terminal.ago(r["created_at"]),
                    terminal.short_record(r["record_key"]),
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
            f"started {terminal.when(r['created_at'])}  "
            f"finished {terminal.when(r['finished_at']) or '-'}",
            file=s.out,
        )
        if r["record_key"]:
            print(f"record {r['record_key']}", file=s.out)
        if r["error"]:
            print(terminal.wrap(f"error: {r['error']}"), file=s.out)
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
        for line in (line for st in d["steps"] for line in cli_people.approval_lines(st)):
            print(terminal.wrap(line), file=s.out)

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
    if args.would_run:
        return _would_run(s, args)
    key = _record_key(s, args.record)
    story = s.client.call("GET", "/v1/records/explain", query={"record_key": key})

    def readable() -> None:
        print(f"record {story['record_key']}", file=s.out)
        if not story["events"]:
            print("no event was received for this record", file=s.out)
        for e in story["events"]:
            print(
                f"- {terminal.when(e['occurred_at'])}  {e['event_type']}  (event #{e['event_id']})",
                file=s.out,
            )
            for d in e["decisions"]:
                print(f"    {d['workflow_name']}: {d['outcome']} — {d['explanation']}", file=s.out)
        for row in story.get("stuck_inbox", []):
            print(f"! inbox #{row['id']} {row['status']}: {row['explanation']}", file=s.out)

    s.emit(story, readable)
    return EXIT_OK


def _would_run(s: Session, args: argparse.Namespace) -> int:
    """`explain --would-run WORKFLOW RECORD`: would the record start a run now? Admission's
    answer for the record as the CRM has it now, written nowhere (exit 0 yes, 1 no)."""
    answer = s.client.call(
        "GET",
        "/v1/records/would-run",
        query={
            "workflow_id": _workflow_id(s, args.would_run),
            "record_key": _record_key(s, args.record),
            "event_type": args.event_type,
        },
    )

    def readable() -> None:
        print(f"record {answer['record_key']}  on {answer['event_type']}", file=s.out)
        if answer["would_run"]:
            print(f"yes, a new run (dedup {answer['dedup_mode']})", file=s.out)
        else:
            print(terminal.wrap(f"no, because {answer['reason']}: {answer['detail']}"), file=s.out)
            print(terminal.wrap(f"  {answer['explanation']}"), file=s.out)
        carried = ", ".join(f"{k}={v!r}" for k, v in answer["changed_fields"].items())
        print(f"a change now would carry: {carried or 'no fields'}", file=s.out)
        if answer["breaker_state"] != "closed":
            print(f"circuit breaker: {answer['breaker_state']}", file=s.out)
        for note in answer["notes"]:
            print(terminal.wrap(note), file=s.out)

    s.emit(answer, readable)
    return EXIT_OK if answer["would_run"] else EXIT_PROBLEMS


def _rehearsal_event(s: Session, workflow_id: str, args: argparse.Namespace) -> dict[str, Any]:
    """What `rehearse` runs against: `--event`, else the record's newest stored event this
    workflow decided about or is bound to (its connection serves the steps' CRM reads), else
    an event supplied from the record as the CRM has it now (the would-run read)."""
    if args.event is not None:
        return {"event_id": args.event}
    key = _record_key(s, args.record)
    story = s.client.call("GET", "/v1/records/explain", query={"record_key": key})
    for e in sorted(story["events"], key=lambda e: e["event_id"], reverse=True):
        wanted = args.event_type is None or e["event_type"] == args.event_type
        if wanted and any(str(d["workflow_id"]) == workflow_id for d in e["decisions"]):
            return {"event_id": e["event_id"]}
    now = s.client.call(
        "GET",
        "/v1/records/would-run",
        query={"workflow_id": workflow_id, "record_key": key, "event_type": args.event_type},
    )
    _, object_type, object_id = key.split(":", 2)
    identity = {"id", "object_type", "key", "connection_id"}
    print(
        f"no stored event for {key}: rehearsing a {now['event_type']} of the record as the "
        "CRM has it now (a step reading the CRM needs config.connection_id)",
        file=s.err,
    )
    return {
        "event": {
            "event_type": now["event_type"],
            "record_object_type": object_type,
            "record_object_id": object_id,
            "payload": {
                "properties": {k: v for k, v in now["record"].items() if k not in identity}
            },
        }
    }


def _rehearse(s: Session, args: argparse.Namespace) -> int:
    """`rehearse WORKFLOW --record R`: run the workflow in the rehearsal namespace (its CRM
    reads are real, its writes stop before they leave: shared/ops/rehearsal.py) and show each
    step, the branches taken, the writes it would send and the waits it would make."""
    workflow_id = _workflow_id(s, args.workflow)
    body = {"workflow_id": workflow_id, **_rehearsal_event(s, workflow_id, args)}
    if args.version:
        body["version_id"] = args.version
    result = s.client.call("POST", "/v1/rehearsals", body=body)

    def readable() -> None:
        print(f"rehearsal run {result['run_id']}: {result['status']}", file=s.out)
        for st in result["steps"]:
            line = f"- {st['step_key']} ({st['block_type']}): {st['status']}"
            if st["branch_choice"]:
                line += f", took branch {st['branch_choice']}"
            print(line, file=s.out)
            for text in _rehearsed_step(st):
                print(terminal.wrap(f"    {text}"), file=s.out)
        writes = len(result["would_send"])
        print(f"{writes} write(s) would have been sent; none was.", file=s.out)

    s.emit(result, readable)
    return EXIT_OK if result["status"] != "failed" else EXIT_PROBLEMS


def _rehearsed_step(step: Mapping[str, Any]) -> list[str]:
    """A rehearsed step's lines: what it would have sent, waited for or asked, or its error."""
    out = step["output"] if isinstance(step["output"], dict) else {}
    lines: list[str] = []
    if out.get("dry_run") is True:
        sent = out.get("would_send") or {}
        target = " ".join(
            str(sent[k]) for k in ("method", "url", "object_type", "object_id") if k in sent
        )
        lines.append(f"would send {out.get('block')} {target}".rstrip())
        if isinstance(sent.get("properties"), dict):
            lines += [f"{k} = {v!r}" for k, v in sent["properties"].items()]
        if sent.get("body"):
            lines.append(f"body: {str(sent['body'])[:300]}")
    if "rehearsal" in out:
        what = out.get("waiting_for") or out.get("summary") or ""
        lines.append(f"{out['rehearsal']}" + (f": {what}" if what else ""))
    if step["error"]:
        lines.append(f"error: {step['error']}")
    return lines


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
    s.say(result, lambda: f"workflow {args.workflow}: version {version} is active")
    for warning in result.get("warnings") or []:
        print(f"warning: {warning}", file=s.err)
    return EXIT_OK


def _deactivate(s: Session, args: argparse.Namespace) -> int:
    result = s.client.call("POST", f"/v1/workflows/{args.workflow}/deactivate", body={})
    s.say(result, lambda: f"workflow {args.workflow}: deactivated")
    return EXIT_OK


def _cancel(s: Session, args: argparse.Namespace) -> int:
    """Cancel a running run (the API does it, audited); a run that already ended is refused
    with who ended it and when."""
    result = s.client.call("POST", f"/v1/runs/{args.run}/cancel", body={"reason": args.reason})
    skipped = ", ".join(result["skipped_steps"]) or "none"
    s.say(result, lambda: f"run {args.run}: cancelled; skipped steps: {skipped}")
    return EXIT_OK


def _confirm_install(s: Session, args: argparse.Namespace) -> int:
    """Confirm an app install with the code its callback page showed; only the token that
    started the install may (shared/providers/install.py says why)."""
    result = s.client.call(
        "POST",
        f"/v1/apps/{args.provider}/{args.app}/installs/confirm",
        body={"confirm_code": args.code},
    )
    s.say(
        result,
        lambda: (
            f"portal {result['portal_id']}: {result['outcome']} for tenant "
            f"{result['tenant_id']} (connection {result['connection_id']})"
        ),
    )
    return EXIT_OK


def _keys(items: Sequence[Mapping[str, Any]]) -> frozenset[SubscriptionKey]:
    return frozenset((i["object_type"], i["event_kind"], i.get("property_name")) for i in items)


def _project(s: Session, args: argparse.Namespace) -> int:
    """`onceflow <provider> project DIR --app APP_ID`: write or update a project-based app's
    files (the provider's `AppProject`) with what ops says it needs, then record what the files
    declare afterwards, read back from them (drift is measured against that record: the
    deployment never sees the directory)."""
    provider = args.command
    found = registry.get(provider)
    project = found.project if found is not None else None
    if project is None:  # the parser offers only providers with projects
        raise ApiError(404, "not_found", f"provider {provider!r} has no project-based apps")
    path = f"/v1/apps/{provider}/{args.app}/project"
    report = s.client.call("GET", path)
    if report["platform"] != "project":
        raise ApiError(
            409,
            "not_a_project_app",
            f"app {args.app} is registered as a legacy app (provider_apps.platform);"
            " its subscriptions are kept through the provider's API or UI",
        )
    spec = ProjectSpec(
        app_id=args.app,
        name=args.name or f"onceflow-{args.app}",
        scopes=tuple(report["scopes"]),
        redirect_urls=tuple(args.redirect_url or report["redirect_urls"]),
        target_url=args.target_url or report["target_url"],
        subscriptions=_keys(report["needed"]),
    )
    try:
        declared = project.write(Path(args.dir), spec)
    except ValueError as exc:  # a file there that is not the JSON the vendor's CLI reads
        print(f"onceflow {provider} project: {exc}", file=s.err)
        return EXIT_USAGE
    recorded = s.client.call(
        "POST",
        path,
        body={
            "subscriptions": [
                {"object_type": o, "event_kind": k, "property_name": p}
                for o, k, p in sorted(declared, key=lambda k: (k[0], k[1], k[2] or ""))
            ]
        },
    )
    for problem in report["unsupported"]:
        print(f"warning: not expressible as a subscription: {problem}", file=s.err)
    if spec.target_url is None:
        print(
            "warning: no webhook URL known (ONCEFLOW_PUBLIC_URL on ops, or --target-url);"
            " the files keep the one they had",
            file=s.err,
        )
    s.say(
        recorded,
        lambda: (
            f"{args.dir}: app {args.app} declares {len(declared)} subscriptions"
            f" ({len(recorded['missing'])} still missing); deploy it with `{project.deploy_hint}`"
        ),
    )
    return EXIT_OK


def _claim_install(s: Session, args: argparse.Namespace) -> int:
    """Claim an install that started at the provider, with the portal and code the app's own
    callback page showed (shared/providers/install.py `finish_unclaimed` says why)."""
    body = {"portal_id": args.portal, "claim_code": args.code}
    if args.tenant:
        body["tenant_id"] = args.tenant
    result = s.client.call("POST", f"/v1/apps/{args.provider}/{args.app}/installs/claim", body=body)
    s.say(
        result,
        lambda: (
            f"portal {result['portal_id']}: {result['outcome']} for tenant "
            f"{result['tenant_id']} (connection {result['connection_id']})"
        ),
    )
    return EXIT_OK


def _approvals(s: Session, args: argparse.Namespace) -> int:
    """The approvals the caller's token may decide, oldest deadline first."""
    result = s.client.call("GET", "/v1/approvals")

    def readable() -> None:
        if not result["items"]:
            print("no approval waits for you", file=s.out)
            return
        table(
            [
                (a["id"], terminal.ago(a["expires_at"]), a["run_id"], a.get("summary"))
                for a in result["items"]
            ],
            ("approval", "until", "run", "summary"),
            s.out,
        )

    s.emit(result, readable)
    return EXIT_OK


def _decide(s: Session, args: argparse.Namespace, decision: str) -> int:
    """Approve or reject one approval; a second decision is refused with who decided first."""
    body = {"comment": args.comment} if args.comment else {}
    result = s.client.call("POST", f"/v1/approvals/{args.approval}/{decision}", body=body)
    s.say(
        result,
        lambda: (
            f"approval {args.approval}: {result['decision']} by {result['decided_by']} "
            f"(run {result['run_id']}, step {result['step_key']})"
        ),
    )
    return EXIT_OK


def _bulk_by_token(s: Session, args: argparse.Namespace, action: str) -> int:
    """`onceflow bulk ACTION [filters]` (and `replay|retry --failed`): the API's preview, whose
    token names exactly the listed set; with --yes, act on it at once; `--bulk-token T` acts on
    a token previewed earlier. Acting twice on one token does nothing more."""
    token = args.bulk_token
    if token is None:
        body: dict[str, Any] = {
            k: v for k, v in _run_filters(s, args).items() if k != "status" and v is not None
        }
        if getattr(args, "connection", None):
            body["connection_id"] = args.connection
        if args.reason:
            body["reason"] = args.reason
        preview = s.client.call("POST", "/v1/bulk/preview", body={"action": action, **body})
        if not args.yes:

            def show_preview() -> None:
                print(
                    f"{len(preview['targets'])} {action} target(s)"
                    f"{' (more match)' if preview['more'] else ''}; nothing was done. "
                    f"Act with: onceflow bulk {action} --bulk-token {preview['token']}",
                    file=s.out,
                )
                for target in preview["targets"]:
                    print(target, file=s.out)

            s.emit(
                {**preview, "would_apply_to": len(preview["targets"])},
                show_preview,
            )
            return EXIT_OK
        token = preview["token"]
    return _bulk_act(s, token, action)


def _bulk_act(s: Session, token: str, action: str) -> int:
    """Act on a bulk preview's token and say each target's outcome (a repeat does nothing)."""
    result = s.client.call("POST", "/v1/bulk/act", body={"token": token})
    refused = [o for o in result["outcomes"] if not o["ok"]]

    def readable() -> None:
        table(
            [
                (o["target"], "done" if o["ok"] else f"refused ({o['code']})", o["message"])
                for o in result["outcomes"]
            ],
            ("target", action, "detail"),
            s.out,
        )
        done = len(result["outcomes"]) - len(refused)
        again = " (acted on before: nothing more done)" if result["repeated"] else ""
        print(f"{done} of {len(result['outcomes'])} {BULK_PAST[action]}{again}", file=s.out)

    s.emit(result, readable)
    return EXIT_PROBLEMS if refused else EXIT_OK


BULK_PAST = {
    "replay": "replayed",
    "retry": "retried",
    "cancel": "cancelled",
    "requeue_inbox": "requeued",
    "redecide": "re-admitted",
}


def _redecide(s: Session, args: argparse.Namespace) -> int:
    """`onceflow redecide [filters]`: the refusals (of --refusal reasons, refused in the window)
    and what each workflow's current version says of them now; nothing is decided. With --yes
    act at once; `--bulk-token T` acts on an earlier preview. Each (event, workflow, version)
    is decided once: acting again does nothing more."""
    if args.bulk_token:
        return _bulk_act(s, args.bulk_token, "redecide")
    body: dict[str, Any] = {
        k: v for k, v in _run_filters(s, args).items() if k != "status" and v is not None
    }
    if args.refusal:
        body["reasons"] = args.refusal
    if args.reason:
        body["reason"] = args.reason
    preview = s.client.call("POST", "/v1/bulk/preview", body={"action": "redecide", **body})
    if args.yes:
        return _bulk_act(s, preview["token"], "redecide")

    def readable() -> None:
        table(
            [
                (
                    str(d["refusal_id"]),
                    d["record_key"] or "-",
                    d["was_reason"],
                    "would run" if d["would_run"] else f"{d['outcome']}: {d['detail']}",
                )
                for d in preview["redecisions"]
            ],
            ("refusal", "record", "was", "now"),
            s.out,
        )
        runs = sum(1 for d in preview["redecisions"] if d["would_run"])
        print(
            f"{runs} of {len(preview['targets'])} refused event(s) would run now"
            f"{' (more match)' if preview['more'] else ''}; nothing was done. "
            f"Act with: onceflow redecide --bulk-token {preview['token']}",
            file=s.out,
        )

    s.emit(preview, readable)
    return EXIT_OK


def _bulk(s: Session, args: argparse.Namespace, action: str) -> int:
    if bool(args.runs) == bool(args.failed or args.bulk_token):
        print(
            f"onceflow {action}: name RUN ids, or --failed with filters, or --bulk-token",
            file=s.err,
        )
        return EXIT_USAGE
    if args.failed or args.bulk_token:
        return _bulk_by_token(s, args, action)
    targets = [{"id": r} for r in args.runs]
    body: dict[str, Any] = {"reason": args.reason} if args.reason else {}
    if action == "replay":
        body["on_version"] = args.on_version
        if args.from_step:
            body["from_step"] = args.from_step
        if args.input is not None:
            body["input"] = args.input
        if getattr(args, "fresh_ai_answers", False):
            body["fresh_ai_answers"] = True
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


# ---- workflows, budgets and breakers --------------------------------------------------------


def _workflows(s: Session, args: argparse.Namespace) -> int:
    result = s.client.call("GET", "/v1/workflows")

    def readable() -> None:
        table(
            [
                (
                    w["id"],
                    w["name"],
                    w["tenant_id"],
                    w["latest_version"],
                    "yes" if w["active_version_id"] else "no",
                )
                for w in result["items"]
            ],
            ("workflow", "name", "tenant", "latest", "active"),
            s.out,
        )

    s.emit(result, readable)
    return EXIT_OK


def _budget(s: Session, args: argparse.Namespace) -> int:
    workflow = _workflow_id(s, args.workflow)
    b = s.client.call("GET", f"/v1/workflows/{workflow}/budget")
    cap = "no cap" if b["credits"] is None else f"cap {b['credits']}"
    s.say(
        b,
        lambda: (
            f"workflow {workflow}: {cap} per {b['per']}; reserved {b['reserved']}, "
            f"spent {b['spent']}, released {b['released']}"
        ),
    )
    return EXIT_OK


def _breaker(s: Session, args: argparse.Namespace) -> int:
    """Show the breaker; with --resume, close (or half-open) it through the API (audited)."""
    workflow = _workflow_id(s, args.workflow)
    if args.resume:
        body: dict[str, Any] = {"half_open": args.half_open}
        if args.reason:
            body["reason"] = args.reason
        b = s.client.call("POST", f"/v1/workflows/{workflow}/resume", body=body)
    else:
        b = s.client.call("GET", f"/v1/workflows/{workflow}/breaker")

    def readable() -> None:
        opened = f", opened {terminal.ago(b['opened_at'])}" if b["opened_at"] else ""
        print(
            f"workflow {workflow}: {b['state']} ({b['consecutive_failures']} failure(s) in a row,"
            f" tripped {b['trips']} time(s){opened})",
            file=s.out,
        )
        print(f"  {b['explanation']}", file=s.out)

    s.emit(b, readable)
    return EXIT_OK


# ---- tenants, connections and tokens ----------------------------------------------------


def _tenants_create(s: Session, args: argparse.Namespace) -> int:
    body = {"id": args.tenant, "name": args.name, "credits": args.credits}
    t = s.client.call("POST", "/v1/tenants", body={k: v for k, v in body.items() if v is not None})
    s.say(t, lambda: f"tenant {t['id']} created, {t['credit_balance']} credits")
    return EXIT_OK


def _tenants_list(s: Session, args: argparse.Namespace) -> int:
    result = s.client.call("GET", "/v1/tenants")
    s.emit(
        result,
        lambda: table(
            [
                (t["id"], t["name"], t["credit_balance"], t["connections"], t["workflows"])
                for t in result["items"]
            ],
            ("tenant", "name", "credits", "connections", "workflows"),
            s.out,
        ),
    )
    return EXIT_OK


def _limits(s: Session, args: argparse.Namespace) -> int:
    """`GET /v1/limits` as a table: each limit, its window, what it admitted, what waits."""
    result = s.client.call(
        "GET", "/v1/limits", query={"tenant_id": args.tenant, "limit": args.limit}
    )

    def window(v: Mapping[str, Any]) -> str:
        if v["kind"] == "concurrency":
            return f"{v['limit']} at once"
        if v["period_seconds"] is None:
            return "-"
        per = f"{v['period_seconds']:g}s"
        if v["kind"] == "batch":
            return f"{v['limit']} or {per}"
        return f"quiet {per}" if v["limit"] is None else f"{v['limit']} per {per}"

    def readable() -> None:
        table(
            [
                (
                    v["kind"],
                    v["tenant_id"],
                    v["subject"],
                    window(v),
                    v["admitted"] if v["kind"] not in ("debounce", "batch") else "-",
                    f"{v['waiting']} {v['waiting_what']}" if v["waiting"] else "-",
                    terminal.ago(v["oldest_wait_since"]) if v["oldest_wait_since"] else "-",
                    terminal.ago(v["next_at"]) if v["next_at"] else "-",
                )
                for v in result["items"]
            ],
            ("limit", "tenant", "subject", "window", "admitted", "waiting", "oldest", "next"),
            s.out,
        )
        if result["truncated"]:
            print(f"(more than {args.limit} of a kind: --limit or --tenant)", file=s.out)

    s.emit(result, readable)
    return EXIT_OK


def _watch(pairs: Sequence[str]) -> dict[str, list[str]]:
    """`contact:lifecyclestage` pairs as {"contact": ["lifecyclestage"]}."""
    watched: dict[str, list[str]] = {}
    for pair in pairs:
        object_type, sep, field_name = pair.partition(":")
        if not sep or not object_type or not field_name:
            raise ApiError(400, "usage", f"--watch takes OBJECT:FIELD, not {pair!r}")
        watched.setdefault(object_type, []).append(field_name)
    return watched


def _connections_create(s: Session, args: argparse.Namespace) -> int:
    body = {
        "tenant_id": args.tenant,
        "provider": args.provider,
        "webhook_secret_env": args.webhook_secret_env,
        "api_credentials_env": args.api_credentials_env,
        "credential_kind": args.credential_kind,
        "api_base_url": args.api_base_url,
        "provider_account_id": args.account,
        "provider_app_id": args.app,
        "watched_fields": _watch(args.watch),
    }
    c = s.client.call(
        "POST", "/v1/connections", body={k: v for k, v in body.items() if v is not None}
    )
    s.say(
        c,
        lambda: (
            f"connection {c['id']}: {c['provider']} account {c['provider_account_id'] or '-'}"
            f" for tenant {c['tenant_id']} ({c['credential_kind']}"
            f" in {c['api_credentials_env'] or '-'})"
        ),
    )
    return EXIT_OK


def _connections_list(s: Session, args: argparse.Namespace) -> int:
    result = s.client.call("GET", "/v1/connections")
    s.emit(
        result,
        lambda: table(
            [
                (
                    c["id"],
                    c["tenant_id"],
                    c["provider"],
                    c["provider_account_id"],
                    c["status"],
                    c["credential_kind"],
                    c["api_base_url"] or "(vendor)",
                )
                for c in result["items"]
            ],
            ("connection", "tenant", "provider", "account", "status", "credential", "api"),
            s.out,
        ),
    )
    return EXIT_OK


def _tokens_create(s: Session, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"label": args.label, "roles": args.role}
    if args.admin:
        body["admin"] = True
    else:
        body["tenant_id"] = args.tenant
    if args.expires:
        body["expires_at"] = terminal.parse_future(args.expires)
    t = s.client.call("POST", "/v1/tokens", body=body)
    s.emit(t, lambda: _print_minted(s, t))
    return EXIT_OK


def _bootstrap(s: Session, args: argparse.Namespace) -> int:
    """The deployment's first admin token, from the one-time bootstrap secret (read from
    stdin by `_dispatch`, never from argv where `ps` shows it)."""
    t = s.client.call("POST", "/v1/bootstrap", body={"label": args.label})
    s.emit(t, lambda: _print_minted(s, t))
    return EXIT_OK


def _print_minted(s: Session, t: dict[str, Any]) -> None:
    """The token alone on stdout (`export ONCEFLOW_OPS_TOKEN=$(onceflow tokens create …)`);
    what it is, on stderr."""
    print(t["token"], file=s.out)
    d = t["details"]
    scope = "admin" if d["tenant_id"] is None else f"tenant {d['tenant_id']}"
    until = f", expires {terminal.local(d['expires_at'])}" if d["expires_at"] else ""
    print(f"token {d['id']} for {scope}{until}; shown only this once", file=s.err)


def _tokens_list(s: Session, args: argparse.Namespace) -> int:
    result = s.client.call("GET", "/v1/tokens")

    def state(t: dict[str, Any]) -> str:
        if t["revoked_at"]:
            return f"revoked {terminal.ago(t['revoked_at'])}"
        if t["expires_at"]:
            return f"expires {terminal.ago(t['expires_at'])}"
        return "active"

    s.emit(
        result,
        lambda: table(
            [
                (
                    t["id"],
                    t["label"],
                    t["tenant_id"] or "(admin)",
                    ",".join(t["roles"]),
                    terminal.ago(t["created_at"]),
                    state(t),
                )
                for t in result["items"]
            ],
            ("token", "label", "tenant", "roles", "created", "state"),
            s.out,
        ),
    )
    return EXIT_OK


def _tokens_revoke(s: Session, args: argparse.Namespace) -> int:
    t = s.client.call("POST", f"/v1/tokens/{args.token_id}/revoke", body={})
    s.say(t, lambda: f"token {t['id']} ({t['label']}): revoked")
    return EXIT_OK


# ---- the parser ---------------------------------------------------------------------------


def _moment(text: str) -> str:
    try:
        return terminal.parse_moment(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _filters(p: argparse.ArgumentParser, *, status: bool) -> None:
    p.add_argument("--workflow", metavar="WORKFLOW_ID")
    if status:
        p.add_argument("--status", choices=[s.value for s in RunStatus])
    p.add_argument("--record", metavar="RECORD_KEY")
    p.add_argument("--event-type", metavar="TYPE", help="e.g. hubspot.contact.created")
    p.add_argument(
        "--since", metavar="WHEN", type=_moment, help="started at or after: 1h, 2d, a date, a time"
    )
    p.add_argument("--until", metavar="WHEN", type=_moment, help="started before (as --since)")


def _setup_parsers(sub: Any, remote: argparse.ArgumentParser) -> None:
    """`workflows`, `budget`, `breaker`, and `tenants`, `connections` and `tokens` (what an
    operator sets up before any workflow)."""
    p = sub.add_parser("workflows", parents=[remote], help="list workflows: ids, names, versions")
    p.add_argument("action", nargs="?", choices=("list",), default="list")
    p = sub.add_parser(
        "budget", parents=[remote], help="a workflow's budget: cap, reserved, spent, released"
    )
    p.add_argument("workflow", metavar="WORKFLOW", help="its id or name")
    p = sub.add_parser(
        "breaker", parents=[remote], help="a workflow's circuit breaker; --resume to resume it"
    )
    p.add_argument("workflow", metavar="WORKFLOW", help="its id or name")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--half-open", action="store_true", help="resume on trial")
    p.add_argument("--reason", help="kept in the audit log")
    p = sub.add_parser(
        "limits",
        parents=[remote],
        help="what each rate limit, run-start throttle, concurrency key, debounce burst and "
        "batch is holding back",
    )
    p.add_argument("--tenant", metavar="TENANT_ID", help="an admin token's filter")
    p.add_argument("--limit", type=int, default=100, help="at most this many of each kind")
    _tenant_parsers(sub, remote)
    _connection_parsers(sub, remote)
    _token_parsers(sub, remote)
    cli_people.parsers(sub, remote)
    cli_outbound.add_parsers(sub, remote)


def _tenant_parsers(sub: Any, remote: argparse.ArgumentParser) -> None:
    tenants = sub.add_parser("tenants", help="tenants: create (admin token), list")
    tsub = tenants.add_subparsers(dest="action", required=True)
    p = tsub.add_parser("create", parents=[remote], help="create a tenant (admin token)")
    p.add_argument("tenant", metavar="TENANT", help="its id, as definitions name it")
    p.add_argument("--name", help="a display name (default: the id)")
    p.add_argument("--credits", type=int, help="credits it starts with")
    tsub.add_parser("list", parents=[remote], help="tenants you can see")


def _connection_parsers(sub: Any, remote: argparse.ArgumentParser) -> None:
    conns = sub.add_parser("connections", help="CRM connections: create, list")
    csub = conns.add_subparsers(dest="action", required=True)
    p = csub.add_parser("create", parents=[remote], help="connect a tenant's CRM account")
    p.add_argument("--tenant", help="required with an admin token")
    p.add_argument("--provider", required=True, choices=registry.PROVIDERS)
    p.add_argument(
        "--webhook-secret-env",
        required=True,
        metavar="VAR",
        help="the NAME of the env var holding the webhook secret (never the secret)",
    )
    p.add_argument(
        "--api-credentials-env", metavar="VAR", help="env var holding the API token or service key"
    )
    p.add_argument(
        "--credential-kind",
        choices=("token", "service_key"),
        help="what that variable holds (default: token; a HubSpot private app's token is one)",
    )
    p.add_argument("--api-base-url", metavar="URL", help="the CRM's API (default: the vendor's)")
    p.add_argument("--account", metavar="ID", help="the provider account (HubSpot portal id)")
    p.add_argument("--app", metavar="APP_ID", help="the HubSpot app it was installed through")
    p.add_argument(
        "--watch", action="append", default=[], metavar="OBJECT:FIELD", help="repeatable"
    )
    csub.add_parser("list", parents=[remote], help="connections you can see")


def _install_parsers(sub: Any, remote: argparse.ArgumentParser) -> None:
    """`confirm-install` (an install started in ops) and `claim-install` (one that started at
    the provider)."""
    p = sub.add_parser(
        "confirm-install",
        parents=[remote],
        help="confirm a HubSpot app install with the code its callback page showed",
    )
    p.add_argument("app", metavar="APP_ID")
    p.add_argument("code", metavar="CODE")
    oauth_providers = registry.oauth_providers()
    p.add_argument(
        "--provider",
        choices=oauth_providers,
        default=oauth_providers[0],
        help=f"whose app (default: {oauth_providers[0]})",
    )
    p = sub.add_parser(
        "claim-install",
        parents=[remote],
        help="claim an app install that started at the provider, with its page's code",
    )
    p.add_argument("app", metavar="APP_ID")
    p.add_argument("portal", metavar="PORTAL_ID", help="the portal the page named")
    p.add_argument("code", metavar="CODE")
    p.add_argument("--tenant", help="required with an admin token")
    p.add_argument(
        "--provider",
        choices=oauth_providers,
        default=oauth_providers[0],
        help=f"whose app (default: {oauth_providers[0]})",
    )


def _project_parsers(sub: Any, remote: argparse.ArgumentParser) -> None:
    """`onceflow <provider> project DIR`, for each provider whose apps can be projects."""
    for provider in registry.project_providers():
        found = registry.get(provider)
        title = found.title if found is not None else provider
        vendor = sub.add_parser(provider, help=f"{title} project-based apps")
        vsub = vendor.add_subparsers(dest="action", required=True)
        p = vsub.add_parser(
            "project",
            parents=[remote],
            help=f"write or update a {title} app's project files (webhooks, scopes, redirect"
            " URLs) for the active workflows, keeping what a person added",
        )
        p.add_argument("dir", metavar="DIR", help="the project's root (made when missing)")
        p.add_argument("--app", required=True, metavar="APP_ID", help="the registered app")
        p.add_argument("--name", help="the app's name in a new project")
        p.add_argument("--target-url", metavar="URL", help="the app's webhook URL (default: ops')")
        p.add_argument(
            "--redirect-url", action="append", metavar="URL", help="repeatable (default: ops')"
        )


def _token_parsers(sub: Any, remote: argparse.ArgumentParser) -> None:
    """`tokens` and `bootstrap`, the deployment's first admin token."""
    tokens = sub.add_parser("tokens", help="ops tokens: create (admin token), list, revoke")
    ksub = tokens.add_subparsers(dest="action", required=True)
    p = ksub.add_parser("create", parents=[remote], help="mint a token, printed once")
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument("--tenant", help="the tenant the token is scoped to")
    scope.add_argument("--admin", action="store_true", help="a token that sees every tenant")
    p.add_argument("--label", required=True, help="who or what holds it")
    p.add_argument("--role", action="append", default=[], help="a tenant role (repeatable)")
    p.add_argument("--expires", metavar="WHEN", help="30d, 12h, or a date or time")
    ksub.add_parser("list", parents=[remote], help="tokens you can see (never the token)")
    p = sub.add_parser(
        "bootstrap",
        parents=[remote],
        help="mint the first admin token with the one-time bootstrap secret (read from stdin)",
    )
    p.add_argument("--label", default="bootstrap admin", help="who holds it")
    p = ksub.add_parser("revoke", parents=[remote], help="revoke a token at once")
    p.add_argument("token_id", metavar="TOKEN_ID")


def _explain_parsers(sub: Any, remote: argparse.ArgumentParser) -> None:
    """`explain` (why did it run, `--would-run`: would it now) and `rehearse` (a dry run)."""
    p = sub.add_parser(
        "explain",
        parents=[remote],
        help="why did (or didn't) it run? --would-run: would it run now? (exit 1: no)",
    )
    p.add_argument("record", metavar="RECORD", help="record key, HubSpot URL, object id or email")
    p.add_argument(
        "--would-run",
        metavar="WORKFLOW",
        help="would the record start a run of WORKFLOW (id or name) now? Nothing is written",
    )
    p.add_argument("--event-type", metavar="TYPE", help="with --would-run: the trigger's event")
    p = sub.add_parser(
        "rehearse",
        parents=[remote],
        help="dry-run a workflow for a record: real CRM reads, writes shown, never sent",
    )
    p.add_argument("workflow", metavar="WORKFLOW", help="its id or name")
    p.add_argument("--record", required=True, metavar="RECORD", help="as for explain")
    p.add_argument("--event", type=int, metavar="EVENT_ID", help="a stored event to rehearse")
    p.add_argument("--event-type", metavar="TYPE", help="the trigger's event type")
    p.add_argument("--version", metavar="VERSION_ID", help="default: the active version")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="onceflow", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = top.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="validate workflow definition files (offline)")
    validate.add_argument("files", nargs="+", metavar="FILE")
    test = sub.add_parser("test", help="play scenarios on a virtual clock (local, offline)")
    test.add_argument("files", nargs="+", metavar="SCENARIO")
    test.add_argument(
        "--database-url", help="a migrated database to write to (default: a throwaway cluster)"
    )
    schema = sub.add_parser("schema", help="export the workflow JSON Schema")
    schema.add_argument("--out", help="write here instead of stdout")
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument("--url", help="the ops function's URL (default: $ONCEFLOW_OPS_URL)")
    remote.add_argument("--token", help="onceflow ops token (default: $ONCEFLOW_OPS_TOKEN)")
    remote.add_argument(
        "--id-token", help="Google identity token for IAM (default: $ONCEFLOW_ID_TOKEN)"
    )
    remote.add_argument("--json", action="store_true", help="print the API's JSON")

    _setup_parsers(sub, remote)

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
    p.add_argument("-q", "--quiet", action="store_true", help="only the run ids, newest first")
    p.add_argument("--cursor")
    p = sub.add_parser("show", parents=[remote], help="one run with its steps")
    p.add_argument("run", metavar="RUN")
    _explain_parsers(sub, remote)
    p = sub.add_parser("cancel", parents=[remote], help="cancel a running run")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--reason", required=True, help="why, kept on the run and in the audit log")
    _install_parsers(sub, remote)
    _project_parsers(sub, remote)
    sub.add_parser("approvals", parents=[remote], help="approvals you may decide")
    for decision in ("approve", "reject"):
        p = sub.add_parser(decision, parents=[remote], help=f"{decision} a waiting approval")
        p.add_argument("approval", metavar="APPROVAL", help="the approval's id")
        p.add_argument("--comment", help="why, kept with the decision and audited")
    _bulk_parsers(sub, remote)
    return top


def _bulk_parsers(sub: Any, remote: argparse.ArgumentParser) -> None:
    """`replay` and `retry` (RUN ids one by one, or --failed by filter through a bulk token)
    and `bulk` (any bulk action by filter: preview, then act on its token)."""
    for action, what in (("replay", "as new linked runs"), ("retry", "in place")):
        p = sub.add_parser(action, parents=[remote], help=f"{action} failed runs {what}")
        p.add_argument("runs", nargs="*", metavar="RUN")
        p.add_argument("--failed", action="store_true", help="every failed run matching filters")
        _filters(p, status=False)
        p.add_argument("--yes", action="store_true", help="act (without it --failed previews)")
        p.add_argument("--reason", help="kept in the audit log")
        p.add_argument("--bulk-token", help="act on a bulk preview's token (onceflow bulk)")
        if action == "replay":
            p.add_argument("--from-step", help="replay from this step key (default: first failure)")
            p.add_argument(
                "--on-version",
                choices=("run", "current"),
                default="run",
                help="the run's own version (default) or the workflow's current one",
            )
            p.add_argument(
                "--input",
                type=_json_object,
                help="edited input (a JSON object) for --from-step; audited",
            )
            p.add_argument(
                "--fresh-ai-answers",
                action="store_true",
                help="ai.generate steps run again ask the model instead of reusing its answer",
            )
    p = sub.add_parser(
        "bulk",
        parents=[remote],
        help="preview a bulk replay, retry, cancel or inbox requeue by filter, then act on its"
        " token",
    )
    p.add_argument("action", choices=tuple(BULK_PAST))
    _filters(p, status=False)
    p.add_argument("--connection", metavar="CONNECTION_ID", help="requeue_inbox: one connection")
    p.add_argument("--reason", help="kept in the audit log (required for cancel)")
    p.add_argument("--yes", action="store_true", help="act at once on what the preview lists")
    p.add_argument("--bulk-token", help="act on this earlier preview's token")
    p = sub.add_parser(
        "redecide",
        parents=[remote],
        help="decide refused events again under each workflow's current version (preview,"
        " then act on its token)",
    )
    _filters(p, status=False)  # --since/--until: when the events were refused
    p.add_argument(
        "--refusal",
        action="append",
        choices=REDECIDABLE,
        help="only refusals of this reason (repeatable; default: every re-decidable one)",
    )
    p.add_argument("--reason", help="why; kept in the audit log")
    p.add_argument("--yes", action="store_true", help="act at once on what the preview lists")
    p.add_argument("--bulk-token", help="act on this earlier preview's token")


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--input must be a JSON object")
    return value


LOCAL: dict[str, Callable[[argparse.Namespace], int]] = {
    "validate": lambda a: _validate(a.files, sys.stdout, sys.stderr),
    "schema": lambda a: _schema(a.out),
    "test": _test,
}
REMOTE: dict[str, Callable[[Session, argparse.Namespace], int]] = {
    "workflows": _workflows,
    "budget": _budget,
    "breaker": _breaker,
    "tenants create": _tenants_create,
    "tenants list": _tenants_list,
    "limits": _limits,
    "connections create": _connections_create,
    "connections list": _connections_list,
    "tokens create": _tokens_create,
    "tokens list": _tokens_list,
    "tokens revoke": _tokens_revoke,
    **cli_people.REMOTE,
    "bootstrap": _bootstrap,
    "publish": _publish,
    "activate": _activate,
    "deactivate": _deactivate,
    "runs": _runs,
    "show": _show,
    "explain": _explain,
    "rehearse": _rehearse,
    "cancel": _cancel,
    "confirm-install": _confirm_install,
    "claim-install": _claim_install,
    "approvals": _approvals,
    **{f"{p} project": _project for p in registry.project_providers()},
    "approve": lambda s, a: _decide(s, a, "approve"),
    "reject": lambda s, a: _decide(s, a, "reject"),
    "replay": lambda s, a: _bulk(s, a, "replay"),
    "retry": lambda s, a: _bulk(s, a, "retry"),
    "bulk": lambda s, a: _bulk_by_token(s, a, a.action),
    "redecide": _redecide,
    **cli_outbound.COMMANDS,
}


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    args = parser().parse_args(argv)
    try:
        code = _dispatch(args, out, err)
        out.flush()  # here, where a closed pipe is caught, not at interpreter exit
        return code
    except BrokenPipeError:
        # The reader closed the pipe (`onceflow runs | head`): stop quietly. What is still
        # buffered for stdout would fail again when Python flushes it at exit, so stdout is
        # pointed at /dev/null first (the recipe in Python's `signal` documentation).
        if out is sys.stdout:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_CLOSED_PIPE


def _dispatch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.command in LOCAL:
        return LOCAL[args.command](args)
    command = args.command if args.command in REMOTE else f"{args.command} {args.action}"
    token = args.token
    if command == "bootstrap":  # the secret is the bearer token of this one call
        token = sys.stdin.readline().strip()
        if not token:
            print("onceflow bootstrap: pipe the bootstrap secret into stdin", file=err)
            return EXIT_USAGE
    try:
        creds = Credentials.from_env(args.url, token, args.id_token)
        with OpsClient(creds) as client:
            return REMOTE[command](Session(client, args.json, out, err), args)
    except ApiError as exc:
        print(f"onceflow {command}: {exc}", file=err)
        return exit_code_for(exc)
    except BrokenPipeError:
        raise
    except OSError as exc:  # a FILE that can't be read
        print(f"onceflow {command}: {exc}", file=err)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
