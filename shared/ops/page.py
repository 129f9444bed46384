"""The page for people: find a record or a run, see what happened and why, replay a failed run.

Server-rendered HTML from the Jinja2 templates of shared/ops/html.py (autoescaped: every value
a tenant or a provider chose is escaped by the template engine, not by hand), CSS inline, no
scripts and no front-end build. The page reads through the API's own handlers (`Call` and
`OpsApi.run_route`), so it shows exactly what the API would answer to the same token, scoped
the same way.

Auth uses the same bearer tokens as the API. A login form posts the token once; it is kept in
an HttpOnly, SameSite=Strict cookie scoped to /ui (Secure whenever the request arrived over
HTTPS, as every Cloud Run request does). A token never travels in a URL, where it would end
up in access logs and browser history; that is why there is no `?token=` bootstrap. Forms
that change something carry a CSRF value derived from the token (HMAC), so a cross-site form
can't replay a run even if a browser ignored SameSite.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from flask import Request, Response
from markupsafe import Markup
from pydantic import BaseModel, ValidationError
from werkzeug.datastructures import MultiDict

from shared.core.errors import TransientError
from shared.core.settings import settings
from shared.ops import auth, bulk, redrive, search
from shared.ops.api.http import Call, EmptyQuery, OpsApi, read_bounded
from shared.ops.api.routes import ROUTE_BY_NAME
from shared.ops.api.runs import run_detail
from shared.ops.approval_links import PATH_PREFIX, Link, record_use, verified
from shared.ops.errors import OpsError
from shared.ops.graph_svg import render_picture
from shared.ops.health import health_report
from shared.ops.html import Notice, Viewer, csrf_value, render
from shared.ops.models import (
    ApprovalList,
    CancelRequest,
    CancelResult,
    DecisionRequest,
    DecisionResult,
    LimitsQuery,
    LimitsReport,
    OutboundDeliveriesQuery,
    OutboundDeliveryList,
    OutboundSubscriptionList,
    RecordExplanation,
    RecordQuery,
    ReplayRequest,
    ReplayResult,
    RunDetail,
    RunPage,
    RunsQuery,
    VersionList,
    WorkflowList,
    WouldRunAnswer,
    WouldRunQuery,
)
from shared.ops.replay import dispatch_committed
from shared.ops.search import record_page
from shared.ops.statements import USER_ROLES, VERSION_DEFINITION
from shared.steps.parks import NotAllowed, decide_approval, park_row
from shared.steps.states import RunStatus
from shared.workflows.definition import WorkflowDefinition

COOKIE = "onceflow_ops"
COOKIE_PATH = "/ui"
COOKIE_MAX_AGE = 8 * 3600
# Forms are small: a bulk confirmation carries its preview's token, csrf value and action.
MAX_FORM_BYTES = 16 * 1024
MAX_FORM_FIELDS = 210
MAX_RUNS_SHOWN = 25
FAILED_ON_HOME = 10
# The home page's limits section: at most this many of each kind (`onceflow limits` for more).
LIMITS_ON_HOME = 20
RUN_STATUSES = tuple(s.value for s in RunStatus)
OUTCOME_WORDS = {
    "admitted": "ran",
    "refused": "did not run",
    "undecided": "not decided yet",
    "undelivered": "never decided",
}


def _redirect(location: str) -> Response:
    return Response("", status=303, headers={"Location": location})


def _form(request: Request) -> MultiDict[str, str]:
    """The page's forms are small url-encoded ones; read boundedly (`shared.core.request_body`) and
    parsed here rather than by `request.form`, which would read a chunked body of any size and
    let the framing errors of a malformed one escape as a 500. A key may repeat (a bulk
    confirmation lists its targets)."""
    raw = read_bounded(request, MAX_FORM_BYTES)
    try:
        pairs = parse_qsl(
            raw.decode("utf-8"),
            keep_blank_values=True,
            strict_parsing=False,
            max_num_fields=MAX_FORM_FIELDS,
        )
    except (UnicodeDecodeError, ValueError):
        raise OpsError(400, "malformed_form", "the form could not be read") from None
    return MultiDict(pairs)


def handle(api: OpsApi, request: Request) -> Response:
    try:
        return _handle(api, request)
    except OpsError as err:
        return render("error.html", "Error", message=err.message, status=err.status)
    except TransientError:
        return render("error.html", "Busy", message="The database is busy; try again.", status=503)


def handle_approval_link(api: OpsApi, request: Request) -> Response:
    """A signed approval link served on its own, by the public `webhook` function
    (functions/webhook.py): the approver's browser carries no Google identity token and no
    ops login, and the `ops` function is IAM-gated in the cloud. The link's signature is the
    whole authentication, exactly as on the ops page; nothing else of the page is reachable
    this way."""
    try:
        path = request.path.rstrip("/")
        if not path.startswith(f"{PATH_PREFIX}/"):
            raise OpsError(404, "not_found", "there is no such page")
        return _decide_by_link(api, request, path.split("/")[3:])
    except OpsError as err:
        return render("error.html", "Error", message=err.message, status=err.status)
    except TransientError:
        return render("error.html", "Busy", message="The database is busy; try again.", status=503)


def _handle(api: OpsApi, request: Request) -> Response:
    path = request.path.rstrip("/") or "/ui"
    if path == "/ui/login":
        return _login(api, request)
    if path.startswith(f"{PATH_PREFIX}/"):
        return _decide_by_link(api, request, path.split("/")[3:])
    token = request.cookies.get(COOKIE)
    principal = auth.authenticate(api.db, token)
    if principal is None or token is None:
        return _redirect("/ui/login")
    viewer = Viewer(principal, token)

    if path == "/ui/logout" and request.method == "POST":
        _check_csrf(request, token)
        response = _redirect("/ui/login")
        response.delete_cookie(COOKIE, path=COOKIE_PATH)
        return response
    parts = path.split("/")
    if request.method == "GET":
        return _get(api, request, viewer, parts)
    if request.method == "POST":
        return _post(api, request, viewer, parts)
    raise OpsError(404, "not_found", "there is no such page")


def _post(api: OpsApi, request: Request, viewer: Viewer, parts: list[str]) -> Response:
    if len(parts) == 5 and parts[2] == "runs" and parts[4] == "replay":
        return _replay(api, request, viewer, parts[3])
    if len(parts) == 5 and parts[2] == "runs" and parts[4] == "cancel":
        return _cancel(api, request, viewer, parts[3])
    if len(parts) == 5 and parts[2] == "approvals" and parts[4] in DECISION_ROUTES:
        return _decide(api, request, viewer, parts[3], parts[4])
    if parts == ["", "ui", "bulk"]:
        return _bulk_confirmed(api, request, viewer)
    if parts == ["", "ui", "redrive"]:
        return _redrive(api, request, viewer, confirmed=True)
    if len(parts) == 5 and parts[2] == "outbound" and parts[4] == "resend":
        return _resend(api, request, viewer, parts[3])
    raise OpsError(404, "not_found", "there is no such page")


def _get(api: OpsApi, request: Request, viewer: Viewer, parts: list[str]) -> Response:
    if len(parts) == 4 and parts[2] == "runs":
        return _run_page(api, request, viewer, parts[3])
    pages: dict[str, Callable[[], Response]] = {
        "/ui": lambda: _home(api, request, viewer),
        "/ui/runs": lambda: _runs_page(api, request, viewer),
        "/ui/bulk": lambda: _bulk_preview(api, request, viewer),
        "/ui/approvals": lambda: _approvals_page(api, viewer, []),
        "/ui/redrive": lambda: _redrive(api, request, viewer, confirmed=False),
        "/ui/outbound": lambda: _outbound_page(api, request, viewer, []),
    }
    page = pages.get("/".join(parts))
    if page is None:
        raise OpsError(404, "not_found", "there is no such page")
    return page()


def _decide_by_link(api: OpsApi, request: Request, parts: list[str]) -> Response:
    """A signed approval link (shared/ops/approval_links.py), no token: GET shows the approval
    and its form (opening a link decides nothing: mail scanners fetch links), POST decides as
    the link's user, once, through the guarded resume."""
    link = verified(parts)
    with api.db.transaction() as tx:
        park = park_row(tx, link.approval_id)
    if park is None or park["kind"] != "approval":
        raise OpsError(404, "not_found", "there is no such approval")
    if request.method == "GET":
        if park["resumed_at"] is not None:
            return _link_page(
                link, park, f"This approval is no longer waiting ({park['resumed_by']})."
            )
        return _link_page(link, park, None, form=True)
    if request.method != "POST":
        raise OpsError(405, "method_not_allowed", "use the form")
    return _link_decision(api, request, link, park)


def _link_page(
    link: Link,
    park: dict[str, Any],
    message: str | None,
    *,
    error: bool = False,
    status: int = 200,
    form: bool = False,
) -> Response:
    return render(
        "decide.html",
        f"Approval for {link.user}",
        user=link.user,
        message=message,
        error=error,
        summary=park["summary"] if form else None,
        expires_at=f"{park['deadline']:%Y-%m-%d %H:%M %Z}",
        status=status,
    )


def _link_decision(api: OpsApi, request: Request, link: Link, park: dict[str, Any]) -> Response:
    """The link's user decides, with the roles their live ops tokens carry now (an approval named
    by role mails its members their links); every outcome, refused ones included, is recorded."""
    tenant = park["tenant_id"]
    form = _form(request)
    decision = {"approve": "approved", "reject": "rejected"}.get(form.get("decision", ""))
    if decision is None:
        raise OpsError(422, "invalid_body", "the decision is approve or reject")
    comment = form.get("comment", "").strip()[:2000] or None
    with api.db.transaction() as tx:
        roles = tx.scalar(USER_ROLES, tenant_id=tenant, user=link.user) or ()
    try:
        outcome = decide_approval(
            api.db,
            link.approval_id,
            decision=decision,
            user=link.user,
            roles=tuple(roles),
            comment=comment,
            tenant_scope=None,
            via="link",
        )
    except NotAllowed as exc:
        record_use(api.db, link, tenant, {"outcome": "refused", "why": str(exc)})
        raise OpsError(403, "not_an_approver", str(exc)) from None
    assert outcome is not None  # the park row exists (read above)
    if outcome.expired is not None:  # by the database's clock, though the link's still held
        record_use(api.db, link, tenant, {"outcome": "refused", "why": outcome.expired})
        message = f"{outcome.expired}; no decision is taken."
        return _link_page(link, park, message, error=True, status=410)
    if outcome.awaiting_quorum:
        record_use(api.db, link, tenant, {"outcome": "voted", "decision": decision})
        said = f"{outcome.approvals} of {outcome.required} approvals so far"
        return _link_page(link, park, f"Thank you: {decision} ({said}).")
    if not outcome.moved:
        record_use(api.db, link, tenant, {"outcome": "refused", "why": outcome.why_not})
        return _link_page(link, park, outcome.why_not, error=True, status=409)
    record_use(api.db, link, tenant, {"outcome": "done", "decision": decision, "comment": comment})
    if outcome.step_id is not None:
        dispatch_committed(api.dispatch, (outcome.step_id,))
    return _link_page(link, park, f"Thank you: {decision}.")


def _login(api: OpsApi, request: Request) -> Response:
    if request.method == "GET":
        return render("login.html", "Sign in", message=None)
    if request.method != "POST":
        raise OpsError(405, "method_not_allowed", "use the form")
    token = _form(request).get("token", "").strip()
    if auth.authenticate(api.db, token) is None:
        return render("login.html", "Sign in", message="That token is not valid.", status=401)
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


def _check_csrf(request: Request, token: str) -> MultiDict[str, str]:
    form = _form(request)
    if not hmac.compare_digest(form.get("csrf", ""), csrf_value(token)):
        raise OpsError(403, "csrf", "the form is stale or came from another site; reload")
    return form


def _call(
    api: OpsApi,
    viewer: Viewer,
    route_name: str,
    *,
    path: dict[str, str] | None = None,
    query: BaseModel | None = None,
    body: BaseModel | None = None,
) -> BaseModel:
    """A route of the API, answered for the signed-in token (scoped and audited the same)."""
    call = Call(
        db=api.db,
        principal=viewer.principal,
        path=path or {},
        query=query if query is not None else EmptyQuery(),
        body=body,
        dispatch=api.dispatch,
    )
    return api.run_route(ROUTE_BY_NAME[route_name], call)


def _replay(api: OpsApi, request: Request, viewer: Viewer, run_id: str) -> Response:
    form = _check_csrf(request, viewer.token)
    record_key = form.get("record_key", "")
    try:
        result = _call(
            api,
            viewer,
            "runs.replay",
            path={"run_id": run_id},
            body=ReplayRequest(reason="replayed from the ops page"),
        )
        assert isinstance(result, ReplayResult)
    except OpsError as err:
        if record_key:
            return _redirect("/ui?" + urlencode({"record_key": record_key, "problem": err.message}))
        return _redirect(f"/ui/runs/{quote(run_id)}?" + urlencode({"problem": err.message}))
    if record_key:
        return _redirect("/ui?" + urlencode({"record_key": record_key, "replayed": result.run.id}))
    return _redirect(f"/ui/runs/{result.run.id}?" + urlencode({"replayed": result.run.id}))


def _action_notices(request: Request) -> list[Notice]:
    notices = []
    if request.args.get("replayed"):
        notices.append(Notice(f"Replay started: run {request.args['replayed']}."))
    if request.args.get("problem"):
        notices.append(Notice(f"Replay refused: {request.args['problem']}", error=True))
    return notices


# ---- search and the record timeline --------------------------------------------------------


def _home(api: OpsApi, request: Request, viewer: Viewer) -> Response:
    notices = _action_notices(request)
    q = (request.args.get("q") or request.args.get("record_key") or "").strip()
    matches = None
    if q:
        try:
            with api.db.transaction() as tx:
                found = search.find_records(tx, q, tenant_scope=viewer.principal.tenant_id)
        except OpsError as err:
            notices.append(Notice(err.message, error=True))
            found = None
        if found is not None and len(found) == 1:
            key = found[0].record_key
            would_run = _would_run(api, viewer, key, request.args.get("would_run"), notices)
            return _record_page(api, viewer, key, q, notices, would_run=would_run)
        matches = found
    failed = _call(api, viewer, "runs.list", query=RunsQuery(status="failed", limit=FAILED_ON_HOME))
    assert isinstance(failed, RunPage)
    limits = _call(api, viewer, "limits.get", query=LimitsQuery(limit=LIMITS_ON_HOME))
    assert isinstance(limits, LimitsReport)
    return render(
        "home.html",
        "Search",
        viewer=viewer,
        notices=notices,
        q=q,
        matches=matches,
        health=health_report(api.db, viewer.principal),
        failed=failed.items,
        limits=limits,
    )


def _would_run(
    api: OpsApi, viewer: Viewer, record_key: str, workflow_id: str | None, notices: list[Notice]
) -> WouldRunAnswer | None:
    """The record page's "would it run now?" form, answered by the API's route (None when
    not asked, or when the question can't be asked: then a notice says why)."""
    if not workflow_id:
        return None
    try:
        query = WouldRunQuery.model_validate({"workflow_id": workflow_id, "record_key": record_key})
        answer = _call(api, viewer, "records.would_run", query=query)
    except ValidationError:
        notices.append(Notice("Choose one of the workflows.", error=True))
        return None
    except OpsError as err:
        notices.append(Notice(err.message, error=True))
        return None
    assert isinstance(answer, WouldRunAnswer)
    return answer


def _record_page(
    api: OpsApi,
    viewer: Viewer,
    record_key: str,
    q: str,
    notices: list[Notice],
    *,
    would_run: WouldRunAnswer | None = None,
) -> Response:
    try:
        query = RecordQuery(record_key=record_key)
    except ValidationError:
        raise OpsError(422, "invalid_record_key", "That is not a record key.") from None
    story = _call(api, viewer, "records.explain", query=query)
    assert isinstance(story, RecordExplanation)
    details = [
        run_detail(api.db, str(r.id), viewer.principal.tenant_id)
        for r in story.runs[-MAX_RUNS_SHOWN:]
    ]
    with api.db.transaction() as tx:
        page = record_page(tx, record_key)
    workflows = _call(api, viewer, "workflows.list")
    assert isinstance(workflows, WorkflowList)
    return render(
        "record.html",
        f"Record {record_key}",
        viewer=viewer,
        notices=notices,
        q=q,
        story=story,
        details=list(reversed(details)),
        outcome_words=OUTCOME_WORDS,
        record_page=page,
        workflows=[w for w in workflows.items if w.active_version_id is not None],
        would_run=would_run,
    )


# ---- runs ----------------------------------------------------------------------------------

RUN_FILTERS = (
    "workflow_id",
    "status",
    "record_key",
    "event_type",
    "created_after",
    "created_before",
    "limit",
)


def _aware(value: str) -> str:
    """`datetime-local` inputs carry no zone; the page says they are UTC."""
    if value and len(value) <= 19 and "+" not in value and not value.endswith("Z"):
        return value + ("+00:00" if len(value) > 16 else ":00+00:00")
    return value


def _run_filters(request: Request) -> tuple[dict[str, str], RunsQuery, list[Notice]]:
    """The runs filters of a page's query string: as typed (to show them back), as a query,
    and a notice naming any that is not valid (then no filter applies, never a 500)."""
    form = {k: request.args.get(k, "").strip() for k in RUN_FILTERS}
    form["limit"] = form["limit"] or str(MAX_RUNS_SHOWN)
    raw = {k: v for k, v in form.items() if v}
    for k in ("created_after", "created_before"):
        if k in raw:
            raw[k] = _aware(raw[k])
    if request.args.get("cursor"):
        raw["cursor"] = request.args["cursor"]
    try:
        return form, RunsQuery.model_validate(raw), []
    except ValidationError as exc:
        wrong = ", ".join(str(e["loc"][0]) for e in exc.errors())
        notice = Notice(f"These filters are not valid: {wrong}.", error=True)
        return form, RunsQuery(limit=MAX_RUNS_SHOWN), [notice]


def _runs_page(api: OpsApi, request: Request, viewer: Viewer) -> Response:
    form, query, notices = _run_filters(request)
    page = _call(api, viewer, "runs.list", query=query)
    assert isinstance(page, RunPage)
    workflows = _call(api, viewer, "workflows.list")
    assert isinstance(workflows, WorkflowList)
    versions, versions_of = [], ""
    if query.workflow_id is not None and any(w.id == query.workflow_id for w in workflows.items):
        listed = _call(
            api, viewer, "workflows.versions", path={"workflow_id": str(query.workflow_id)}
        )
        assert isinstance(listed, VersionList)
        versions = listed.items
        versions_of = next(w.name for w in workflows.items if w.id == query.workflow_id)
    kept = {k: v for k, v in form.items() if v}
    return render(
        "runs.html",
        "Runs",
        viewer=viewer,
        notices=notices,
        form=form,
        statuses=RUN_STATUSES,
        workflows=workflows.items,
        versions=versions,
        versions_of=versions_of,
        page=page,
        next_page_url="/ui/runs?" + urlencode({**kept, "cursor": page.next_cursor})
        if page.next_cursor
        else None,
        first_page_url="/ui/runs?" + urlencode(kept) if request.args.get("cursor") else None,
        bulk_filters={k: v for k, v in kept.items() if k not in ("status", "limit")},
    )


def _bulk_preview(api: OpsApi, request: Request, viewer: Viewer) -> Response:
    action = request.args.get("action", "")
    spec = bulk.action_named(action)
    _, query, notices = _run_filters(request)
    if notices:
        raise OpsError(400, "invalid_query", notices[0].text)
    listed = bulk.preview(_caller(api, viewer), action, query)
    targets = listed.inbox_rows if action == "requeue_inbox" else listed.runs
    return _bulk_page(
        viewer,
        action,
        spec,
        "preview",
        targets=targets,
        more=listed.more,
        token=str(listed.token),
        results=None,
    )


def _bulk_confirmed(api: OpsApi, request: Request, viewer: Viewer) -> Response:
    form = _check_csrf(request, viewer.token)
    action = form.get("action", "")
    spec = bulk.action_named(action)
    results = bulk.perform(_caller(api, viewer), form.get("token", ""))
    return _bulk_page(viewer, action, spec, "done", targets=[], more=False, results=results)


def _bulk_page(
    viewer: Viewer, action: str, spec: bulk.BulkAction, stage: str, **shown: Any
) -> Response:
    """The bulk page: what an action will touch (preview), or how each target went (done)."""
    results = shown["results"]
    return render(
        "bulk.html",
        f"{spec.verb.capitalize()}: {stage}",
        viewer=viewer,
        action=action,
        verb=spec.verb,
        past=spec.past,
        what=spec.what,
        consequence=spec.consequence,
        done=sum(1 for r in results if r.ok) if results is not None else 0,
        **shown,
    )


def _redrive(api: OpsApi, request: Request, viewer: Viewer, *, confirmed: bool) -> Response:
    """Pub/Sub dead letters through the bulk routes (shared/ops/api/bulk.py, action `redrive`):
    the preview's token names the held messages it lists, and the confirmation redrives those
    only. Machinery, so admins only; a tenant token is told there is no such page."""
    if not viewer.principal.is_admin:
        raise OpsError(404, "not_found", "there is no such page")
    call = _caller(api, viewer)
    token = ""
    if confirmed:
        form = _check_csrf(request, viewer.token)
        result = bulk.perform_raw(call, form.get("token", ""))
        listed = [o.target for o in result.outcomes if o.ok]
    else:
        preview = bulk.preview_redrive(call)
        listed, token = preview.targets, str(preview.token)
    holds = [
        redrive.HoldCount(hold, topic, len(ids), ids)
        for hold, topic in redrive.DEAD_LETTER_HOLDS.items()
        for ids in [[t.split(":", 1)[1] for t in listed if t.split(":", 1)[0] == hold]]
    ]
    return render(
        "redrive.html",
        "Pub/Sub dead letters",
        viewer=viewer,
        holds=holds,
        total=len(listed),
        done=confirmed,
        token=token,
    )


def _caller(api: OpsApi, viewer: Viewer) -> Callable[..., BaseModel]:
    def call(route_name: str, **kwargs: Any) -> BaseModel:
        return _call(api, viewer, route_name, **kwargs)

    return call


def logs_url(run_id: str) -> str | None:
    """The run's log lines in Cloud Logging (every line carries the `run_id` label)."""
    project = settings().project
    if not project:
        return None
    query = quote(f'labels.run_id="{run_id}"', safe="")
    return f"https://console.cloud.google.com/logs/query;query={query}?project={quote(project)}"


def _cancel(api: OpsApi, request: Request, viewer: Viewer, run_id: str) -> Response:
    """Cancel through `runs.cancel`, then the run page with the answer as a notice (rendered,
    not redirected: a notice's text never comes from a URL someone else could craft). A run
    that is not the viewer's is a 404 like any other page of it."""
    form = _check_csrf(request, viewer.token)
    try:
        body = CancelRequest(reason=form.get("reason", "").strip())
    except ValidationError:
        notice = Notice("Cancel refused: say why (1 to 500 characters).", error=True)
        return _run_page(api, request, viewer, run_id, notices=[notice], status=422)
    try:
        result = _call(api, viewer, "runs.cancel", path={"run_id": run_id}, body=body)
        assert isinstance(result, CancelResult)
    except OpsError as err:
        if err.status == 404:
            raise
        notice = Notice(f"Cancel refused: {err.message}", error=True)
        return _run_page(api, request, viewer, run_id, notices=[notice], status=err.status)
    text = f"Run cancelled; skipped: {', '.join(result.skipped_steps) or 'nothing'}."
    if result.running_steps:
        text += f" Finishing their attempt: {', '.join(result.running_steps)}."
    return _run_page(api, request, viewer, run_id, notices=[Notice(text)])


def _run_page(
    api: OpsApi,
    request: Request,
    viewer: Viewer,
    run_id: str,
    *,
    notices: list[Notice] | None = None,
    status: int = 200,
) -> Response:
    detail = _call(api, viewer, "runs.get", path={"run_id": run_id})
    assert isinstance(detail, RunDetail)
    r = detail.run
    page = None
    if r.record_key:
        with api.db.transaction() as tx:
            page = record_page(tx, r.record_key)
    replayable = r.status == "failed" and not any(x.replay_of == r.id for x in detail.lineage)
    with api.db.transaction() as tx:
        definition = tx.scalar(VERSION_DEFINITION, version_id=str(r.version_id))
    return render(
        "run.html",
        f"Run {r.workflow_name}",
        viewer=viewer,
        notices=(notices or []) + _action_notices(request),
        status=status,
        d=detail,
        record_page=page,
        logs_url=logs_url(str(r.id)),
        replayable=replayable,
        picture=_picture(definition, detail),
    )


# ---- approvals ----------------------------------------------------------------------------

DECISION_ROUTES = {"approve": "approvals.approve", "reject": "approvals.reject"}


def _approvals_page(
    api: OpsApi, viewer: Viewer, notices: list[Notice], status: int = 200
) -> Response:
    listed = _call(api, viewer, "approvals.list")
    assert isinstance(listed, ApprovalList)
    return render(
        "approvals.html",
        "Pending approvals",
        viewer=viewer,
        notices=notices,
        status=status,
        approvals=listed.items,
    )


def _decide(api: OpsApi, request: Request, viewer: Viewer, approval_id: str, verb: str) -> Response:
    """Approve or reject through the API's route; the answer, "already decided by X at T"
    included, is a notice on the list. An approval that is not the viewer's tenant's is a 404."""
    form = _check_csrf(request, viewer.token)
    comment = form.get("comment", "").strip()
    try:
        body = DecisionRequest(comment=comment or None)
    except ValidationError:
        notice = Notice("Decision refused: the comment is too long.", error=True)
        return _approvals_page(api, viewer, [notice], status=422)
    try:
        result = _call(
            api, viewer, DECISION_ROUTES[verb], path={"approval_id": approval_id}, body=body
        )
        assert isinstance(result, DecisionResult)
    except OpsError as err:
        if err.status == 404:
            raise
        notice = Notice(f"Decision refused: {err.message}", error=True)
        return _approvals_page(api, viewer, [notice], status=err.status)
    notice = Notice(f"{result.decision.capitalize()}: run {result.run_id}, step {result.step_key}.")
    return _approvals_page(api, viewer, [notice])


# ---- outbound events ------------------------------------------------------------------------


def _outbound_page(
    api: OpsApi, request: Request, viewer: Viewer, notices: list[Notice], status: int = 200
) -> Response:
    """The tenant's outbound subscriptions and their latest deliveries (`?status=` pending,
    delivered or given_up), through the API's routes, each delivery re-sendable."""
    try:
        query = OutboundDeliveriesQuery(status=request.args.get("status") or None)
    except ValidationError:
        notices = [*notices, Notice("Unknown status: showing every delivery.", error=True)]
        query = OutboundDeliveriesQuery()
    subscriptions = _call(api, viewer, "outbound.subscriptions.list")
    deliveries = _call(api, viewer, "outbound.deliveries.list", query=query)
    assert isinstance(subscriptions, OutboundSubscriptionList)
    assert isinstance(deliveries, OutboundDeliveryList)
    return render(
        "outbound.html",
        "Outbound events",
        viewer=viewer,
        notices=notices,
        status=status,
        subscriptions=subscriptions.items,
        deliveries=deliveries.items,
        shown=query.status,
    )


def _resend(api: OpsApi, request: Request, viewer: Viewer, delivery_id: str) -> Response:
    """Resend through `outbound.deliveries.resend` (same `webhook-id`, a new round of attempts
    at the sweep's next pass); the answer is a notice on the list. A delivery that is not the
    viewer's tenant's, or one being attempted right now, is refused as the API refuses it."""
    _check_csrf(request, viewer.token)
    try:
        _call(api, viewer, "outbound.deliveries.resend", path={"delivery_id": delivery_id})
    except OpsError as err:
        notice = Notice(f"Resend refused: {err.message}", error=True)
        return _outbound_page(api, request, viewer, [notice], status=err.status)
    notice = Notice(f"Delivery {delivery_id} queued again: the next sweep sends it.")
    return _outbound_page(api, request, viewer, [notice])


def _picture(definition: Any, detail: RunDetail) -> Markup | None:
    try:
        parsed = WorkflowDefinition.model_validate(definition)
    except ValidationError:
        return None  # a definition this code can no longer read: the tables still tell all
    return render_picture(parsed, detail.steps, datetime.now(UTC))
