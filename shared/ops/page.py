"""The page for people: search a record, see its timeline, replay a failed run.

Server-rendered HTML and CSS, no front-end build. The timeline answers the question sales
teams ask ("why didn't my workflow run for this lead?"): every event received for the
record, what each workflow decided about it in plain words, every run with its steps, and a
replay button for failed runs.

Auth uses the same bearer tokens as the API. A login form posts the token once; it is kept in
an HttpOnly, SameSite=Strict cookie scoped to /ui (Secure whenever the request arrived over
HTTPS, as every Cloud Run request does). A token never travels in a URL, where it would end
up in access logs and browser history; that is why there is no `?token=` bootstrap. Forms
that change something carry a CSRF value derived from the token (HMAC), so a cross-site form
can't replay a run even if a browser ignored SameSite.
"""

from __future__ import annotations

import hashlib
import hmac
from html import escape
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode

from flask import Request, Response
from pydantic import ValidationError

from shared import request_body
from shared.errors import TransientError
from shared.ops import auth
from shared.ops.errors import OpsError
from shared.ops.models import (
    RecordExplanation,
    RecordQuery,
    ReplayRequest,
    ReplayResult,
    RunDetail,
    StepView,
)

if TYPE_CHECKING:
    from shared.ops.api import OpsApi

COOKIE = "onceflow_ops"
COOKIE_PATH = "/ui"
COOKIE_MAX_AGE = 8 * 3600
MAX_FORM_BYTES = 8 * 1024
MAX_RUNS_SHOWN = 25

CSS = """
:root { --ink:#1d2330; --muted:#5b6475; --line:#dde2ea; --ok:#1f7a4d; --bad:#b42318;
        --wait:#8a6100; --bg:#f6f7f9; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, sans-serif; color: var(--ink); background: var(--bg);
       margin: 0; }
header.top { background: #fff; border-bottom: 1px solid var(--line); padding: 12px 24px;
             display: flex; gap: 16px; align-items: center; }
header.top h1 { font-size: 17px; margin: 0; }
main { max-width: 1040px; margin: 0 auto; padding: 24px; }
form.search { display: flex; gap: 8px; margin-bottom: 20px; }
input[type=text], input[type=password] { flex: 1; padding: 8px 10px; border: 1px solid var(--line);
       border-radius: 6px; font: inherit; }
button { padding: 8px 14px; border: 0; border-radius: 6px; background: #2b4acb; color: #fff;
         font: inherit; cursor: pointer; }
button.replay { background: var(--bad); }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 14px 18px;
        margin: 0 0 14px; }
.meta { color: var(--muted); font-size: 13px; }
ol.timeline { list-style: none; padding: 0; margin: 0; border-left: 3px solid var(--line); }
ol.timeline > li { margin: 0 0 14px 16px; }
ul.decisions { list-style: none; padding: 0; margin: 8px 0 0; }
ul.decisions li { padding: 6px 10px; border-radius: 6px; margin: 4px 0; }
.admitted { background: #e8f5ee; } .refused { background: #fdecea; }
.undecided { background: #fff6db; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px;
         font-weight: 600; color: #fff; background: var(--muted); }
.badge.succeeded { background: var(--ok); } .badge.failed { background: var(--bad); }
.badge.running, .badge.pending { background: var(--wait); }
table { border-collapse: collapse; width: 100%; margin-top: 8px; font-size: 13px; }
th, td { text-align: left; border-top: 1px solid var(--line); padding: 5px 6px;
         vertical-align: top; }
.notice { background: #e8f0fe; border: 1px solid #b3c7f7; padding: 10px 14px;
          border-radius: 6px; margin-bottom: 16px; }
.error { background: #fdecea; border-color: #f5b5ae; }
code { font-size: 12px; }
ol.attempts { list-style: none; padding: 0; margin: 2px 0 0; color: var(--muted);
              font-size: 12px; white-space: nowrap; }
"""


def csrf_value(token: str) -> str:
    return hmac.new(token.encode(), b"onceflow-ops-csrf", hashlib.sha256).hexdigest()


def _page(
    title: str,
    body: str,
    *,
    status: int = 200,
    principal: auth.Principal | None = None,
    token: str | None = None,
) -> Response:
    who = ""
    if principal is not None and token is not None:
        scope = "admin" if principal.is_admin else f"tenant {principal.tenant_id}"
        who = (
            f'<span class="meta">{escape(principal.label)} · {escape(scope)}</span>'
            f'<form method="post" action="/ui/logout" style="margin-left:auto">'
            f'<input type="hidden" name="csrf" value="{csrf_value(token)}">'
            f"<button>Sign out</button></form>"
        )
    html = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · onceflow</title><style>{CSS}</style></head><body>"
        f'<header class="top"><h1><a href="/ui" style="color:inherit;text-decoration:none">'
        f"onceflow ops</a></h1>{who}</header><main>{body}</main></body></html>"
    )
    return Response(
        html,
        status=status,
        mimetype="text/html",
        headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'none'; "
            "style-src 'unsafe-inline'; form-action 'self'; "
            "frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        },
    )


def _redirect(location: str) -> Response:
    return Response("", status=303, headers={"Location": location})


def _login_form(message: str | None = None, status: int = 200) -> Response:
    note = f'<p class="notice error">{escape(message)}</p>' if message else ""
    body = (
        f'<div class="card"><h2>Sign in</h2>{note}'
        "<p>Paste your ops token (mint one with "
        "<code>python -m shared.ops.tokens create --tenant &lt;tenant&gt;</code>).</p>"
        '<form class="search" method="post" action="/ui/login">'
        '<input type="password" name="token" aria-label="ops token" autocomplete="off" '
        'required><button type="submit">Sign in</button></form></div>'
    )
    return _page("Sign in", body, status=status)


def _form(request: Request) -> dict[str, str]:
    """The page's forms are small url-encoded ones; read boundedly (`shared.request_body`) and
    parsed here rather than by `request.form`, which would read a chunked body of any size and
    let the framing errors of a malformed one escape as a 500."""
    try:
        raw = request_body.read_body(
            request.stream.read,
            declared_length=request.content_length,
            cap=MAX_FORM_BYTES,
            environ=request.environ,
        )
    except request_body.BodyRefused as refused:
        raise OpsError(refused.status, refused.code, refused.message) from None
    try:
        pairs = parse_qsl(
            raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False, max_num_fields=16
        )
    except (UnicodeDecodeError, ValueError):
        raise OpsError(400, "malformed_form", "the form could not be read") from None
    return dict(pairs)


def handle(api: OpsApi, request: Request) -> Response:
    try:
        return _handle(api, request)
    except OpsError as err:
        return _page(
            "Error", f'<p class="notice error">{escape(err.message)}</p>', status=err.status
        )
    except TransientError:
        return _page(
            "Busy", '<p class="notice error">The database is busy; try again.</p>', status=503
        )


def _handle(api: OpsApi, request: Request) -> Response:
    path = request.path.rstrip("/") or "/ui"
    if path == "/ui/login":
        return _login(api, request)
    token = request.cookies.get(COOKIE)
    principal = auth.authenticate(api.db, token)
    if principal is None or token is None:
        return _redirect("/ui/login")

    if path == "/ui/logout" and request.method == "POST":
        _check_csrf(request, token)
        response = _redirect("/ui/login")
        response.delete_cookie(COOKIE, path=COOKIE_PATH)
        return response
    if path == "/ui" and request.method == "GET":
        return _record_page(api, request, principal, token)
    parts = path.split("/")
    if len(parts) == 5 and parts[2] == "runs" and parts[4] == "replay" and request.method == "POST":
        return _replay(api, request, principal, token, parts[3])
    raise OpsError(404, "not_found", "there is no such page")


def _login(api: OpsApi, request: Request) -> Response:
    if request.method == "GET":
        return _login_form()
    if request.method != "POST":
        raise OpsError(405, "method_not_allowed", "use the form")
    token = _form(request).get("token", "").strip()
    if auth.authenticate(api.db, token) is None:
        return _login_form("That token is not valid.", status=401)
    response = _redirect("/ui")
    response.set_cookie(
        COOKIE,
        token,
        max_age=COOKIE_MAX_AGE,
        path=COOKIE_PATH,
        httponly=True,
        samesite="Strict",
        secure=_is_https(request),
    )
    return response


def _is_https(request: Request) -> bool:
    return request.is_secure or request.headers.get("X-Forwarded-Proto", "") == "https"


def _check_csrf(request: Request, token: str) -> dict[str, str]:
    form = _form(request)
    if not hmac.compare_digest(form.get("csrf", ""), csrf_value(token)):
        raise OpsError(403, "csrf", "the form is stale or came from another site; reload")
    return form


def _replay(
    api: OpsApi, request: Request, principal: auth.Principal, token: str, run_id: str
) -> Response:
    from shared.ops.api import ROUTE_BY_NAME, Call

    form = _check_csrf(request, token)
    record_key = form.get("record_key", "")
    try:
        body = ReplayRequest(reason="replayed from the ops page")
    except ValidationError as exc:  # pragma: no cover - a constant
        raise OpsError(422, "invalid_body", str(exc)) from None
    call = Call(
        db=api.db,
        principal=principal,
        path={"run_id": run_id},
        query=None,
        body=body,
        dispatch=api.dispatch,
    )
    try:
        result = api.run_route(ROUTE_BY_NAME["runs.replay"], call)
        assert isinstance(result, ReplayResult)
        params = {"record_key": record_key, "replayed": str(result.run.id)}
    except OpsError as err:
        params = {"record_key": record_key, "problem": err.message}
    return _redirect("/ui?" + urlencode(params))


def _record_page(api: OpsApi, request: Request, principal: auth.Principal, token: str) -> Response:
    from shared.ops.api import run_detail
    from shared.ops.explain import explain_record

    record_key = request.args.get("record_key", "").strip()
    notices = ""
    if request.args.get("replayed"):
        notices += (
            f'<p class="notice">Replay started: run '
            f"<code>{escape(request.args['replayed'])}</code>.</p>"
        )
    if request.args.get("problem"):
        notices += f'<p class="notice error">Replay refused: {escape(request.args["problem"])}</p>'
    search = (
        '<form class="search" method="get" action="/ui">'
        f'<input type="text" name="record_key" value="{escape(record_key)}" '
        'placeholder="connection-id:contacts:123" aria-label="record key">'
        "<button type=submit>Search record</button></form>"
    )
    if not record_key:
        return _page(
            "Records",
            notices + search + '<p class="meta">Search a record by its key '
            "(<code>&lt;connection id&gt;:&lt;object type&gt;:&lt;object id&gt;</code>)"
            " to see every event, what each workflow decided, and why.</p>"
            + _health(api, principal)
            + _dead_letters(api, principal),
            principal=principal,
            token=token,
        )
    try:
        query = RecordQuery(record_key=record_key)
        with api.db.transaction() as tx:
            story = explain_record(
                tx, record_key=query.record_key, tenant_scope=principal.tenant_id
            )
    except (OpsError, ValidationError) as exc:
        message = exc.message if isinstance(exc, OpsError) else "That is not a record key."
        return _page(
            "Records",
            notices + search + f'<p class="notice error">{escape(message)}</p>',
            principal=principal,
            token=token,
        )
    details = [
        run_detail(api.db, str(r.id), principal.tenant_id) for r in story.runs[-MAX_RUNS_SHOWN:]
    ]
    body = (
        notices
        + search
        + f"<h2>Record <code>{escape(record_key)}</code></h2>"
        + _timeline(story)
        + "<h2>Runs</h2>"
        + "".join(_run_card(d, story, record_key, token) for d in reversed(details))
    )
    if not details:
        body += '<p class="meta">No run was started for this record.</p>'
    return _page(f"Record {record_key}", body, principal=principal, token=token)


def _health(api: OpsApi, principal: auth.Principal) -> str:
    """Is the machinery running? The same report as GET /v1/health."""
    from shared.ops.health import health_report

    report = health_report(api.db, principal)
    if report.problems:
        verdict = '<ul class="problems">' + "".join(
            f'<li class="notice error">{escape(p)}</li>' for p in report.problems
        )
        verdict += "</ul>"
    else:
        verdict = '<p class="notice ok">Nothing looks stuck.</p>'
    body = verdict
    m = report.machinery
    if m is not None:
        if m.scheduler.available:
            rows = "".join(
                f"<tr><td>{escape(j.name)}</td><td>{escape(j.state or '')}</td>"
                f"<td>{j.last_attempt_at or 'never'}</td>"
                f"<td>{escape(j.error or j.last_status or '')}</td></tr>"
                for j in m.scheduler.jobs
            )
            body += (
                '<table class="scheduler"><thead><tr><th>scheduled job</th><th>state</th>'
                f"<th>last attempt</th><th>status</th></tr></thead><tbody>{rows}</tbody></table>"
            )
        else:
            body += f'<p class="meta scheduler">{escape(m.scheduler.detail or "")}</p>'
        b, d = m.backlog, m.dead_letters
        body += (
            '<table class="backlog"><thead><tr><th>queue</th><th>waiting</th>'
            "<th>oldest (s)</th></tr></thead><tbody>"
            f"<tr><td>inbox</td><td>{b.inbox_pending}</td><td>{b.inbox_oldest_seconds:.0f}</td></tr>"
            f"<tr><td>outbox</td><td>{b.outbox_unpublished}</td>"
            f"<td>{b.outbox_oldest_seconds:.0f}</td></tr>"
            f"<tr><td>steps</td><td>{b.steps_pending}</td>"
            f"<td>{b.steps_oldest_pending_seconds:.0f}</td></tr></tbody></table>"
            f'<p class="meta dead-counts">Dead inbox rows: {d.dead_inbox_rows}; poisoned '
            f"messages: {d.poisoned_messages} ({d.poisoned_messages_24h} in 24 h); undelivered "
            f"trigger events: {d.undelivered_events}.</p>"
        )
    if report.connections:
        rows = "".join(
            f"<tr><td><code>{c.connection_id}</code></td><td>{escape(c.provider)}</td>"
            f"<td>{escape(c.status)}</td><td>{'yes' if c.credentials_configured else 'NO'}</td>"
            f"<td>{_reconcile_words(c.last_reconcile_ok)}</td></tr>"
            for c in report.connections
        )
        body += (
            '<table class="connections"><thead><tr><th>connection</th><th>provider</th>'
            "<th>status</th><th>credentials</th><th>last provider call</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
        )
    return f'<h2>Health</h2><div class="card health">{body}</div>'


def _reconcile_words(ok: bool | None) -> str:
    return {None: "not yet", True: "ok", False: "failed"}[ok]


def _dead_letters(api: OpsApi, principal: auth.Principal) -> str:
    """The newest failed runs (the dead-letter list), each linking to its record."""
    from shared.ops.api import RUNS_LIST

    with api.db.transaction() as tx:
        rows = tx.all(
            RUNS_LIST,
            tenant_id=principal.tenant_id,
            workflow_id=None,
            status="failed",
            record_key=None,
            created_after=None,
            created_before=None,
            cursor_at=None,
            cursor_id=None,
            limit=MAX_RUNS_SHOWN,
        )
    if not rows:
        return '<h2>Failed runs</h2><p class="meta">No failed run.</p>'
    items = "".join(
        f"<tr><td>{escape(r['workflow_name'])}</td><td><code>{r['id']}</code></td>"
        f"<td>{r['created_at']:%Y-%m-%d %H:%M}</td><td>{escape(r['error'] or '')}</td><td>"
        + (
            f'<a href="/ui?{urlencode({"record_key": r["record_key"]})}#run-{r["id"]}">'
            "open record</a>"
            if r["record_key"]
            else ""
        )
        + "</td></tr>"
        for r in rows
    )
    return (
        '<h2>Failed runs</h2><div class="card"><table class="dead-letters"><thead><tr>'
        "<th>workflow</th><th>run</th><th>started</th><th>error</th><th></th></tr></thead>"
        f"<tbody>{items}</tbody></table></div>"
    )


def _timeline(story: RecordExplanation) -> str:
    if not story.events:
        return '<p class="meta">No event was received for this record.</p>'
    items = []
    for e in story.events:
        decisions = (
            "".join(
                f'<li class="{d.outcome}"><b>{escape(d.workflow_name)}</b>: '
                f"{_outcome_words(d.outcome)} — {escape(d.explanation)}"
                + (
                    f' <span class="meta">({escape(d.reason or "")}: '
                    f"{escape(d.detail or '')})</span>"
                    if d.outcome == "refused"
                    else ""
                )
                + (f' <a href="#run-{d.run_id}">run</a>' if d.run_id else "")
                + "</li>"
                for d in e.decisions
            )
            or '<li class="undecided">No workflow listens to this kind of event.</li>'
        )
        items.append(
            f'<li class="card event" data-event-id="{e.event_id}"><div><b>'
            f"{escape(e.event_type)}</b> "
            f'<span class="meta">event #{e.event_id} · {e.occurred_at:%Y-%m-%d %H:%M:%S %Z}'
            f"{' · payload truncated' if e.payload_truncated else ''}</span></div>"
            f'<ul class="decisions">{decisions}</ul></li>'
        )
    return f'<ol class="timeline">{"".join(items)}</ol>'


def _outcome_words(outcome: str) -> str:
    return {"admitted": "admitted", "refused": "did not run", "undecided": "not decided yet"}[
        outcome
    ]


def _run_card(d: RunDetail, story: RecordExplanation, record_key: str, token: str) -> str:
    r = d.run
    replayed = any(x.replay_of == r.id for x in d.lineage)
    button = ""
    if r.status == "failed" and not replayed:
        button = (
            f'<form method="post" action="/ui/runs/{r.id}/replay">'
            f'<input type="hidden" name="csrf" value="{csrf_value(token)}">'
            f'<input type="hidden" name="record_key" value="{escape(record_key)}">'
            f'<button class="replay" type="submit">Replay this run</button></form>'
        )
    rows = "".join(
        f"<tr><td><code>{escape(s.step_key)}</code></td><td>{escape(s.block_type)}</td>"
        f'<td><span class="badge {s.status}">{s.status}</span>'
        f"{' (copied)' if s.copied_from else ''}</td><td>{_attempts(s)}</td>"
        f"<td>{escape(s.outcome_code or '')}</td><td>{escape(s.error or '')}</td></tr>"
        for s in d.steps
    )
    lineage = ""
    if r.replay_of:
        lineage = f' · replay of <a href="#run-{r.replay_of}"><code>{r.replay_of}</code></a>'
    return (
        f'<section class="card run" id="run-{r.id}" data-run-id="{r.id}">'
        f"<div><b>{escape(r.workflow_name)}</b> "
        f'<span class="badge {r.status}">{r.status}</span> '
        f'<span class="meta">run <code>{r.id}</code> · {r.created_at:%Y-%m-%d %H:%M:%S %Z}'
        f"{lineage}</span></div>"
        + (f'<p class="meta">{escape(r.error)}</p>' if r.error else "")
        + "<table><thead><tr><th>step</th><th>block</th><th>status</th><th>attempts</th>"
        f"<th>outcome</th><th>error</th></tr></thead><tbody>{rows}</tbody></table>"
        f"{button}</section>"
    )


def _attempts(s: StepView) -> str:
    """The attempt count, then one short line per kept lease saying how it ended (when it was
    claimed and ended on hover): a retried or reclaimed step shows every try, not the last."""
    items = []
    for lease in s.leases:
        if lease.end_kind is None:
            how = "running"
        elif lease.end_kind == "reclaimed":
            how = f"reclaimed → {lease.end_status}"
        else:
            how = str(lease.end_status)
        if lease.outcome_code:
            how += f" ({lease.outcome_code})"
        when = f"claimed {lease.claimed_at:%Y-%m-%d %H:%M:%S %Z}"
        if lease.ended_at is not None:
            when += f", ended {lease.ended_at:%Y-%m-%d %H:%M:%S %Z}"
        items.append(f'<li title="{escape(when)}">#{lease.attempt} {escape(how)}</li>')
    listed = f'<ol class="attempts">{"".join(items)}</ol>' if items else ""
    return f"{s.attempt}{listed}"
