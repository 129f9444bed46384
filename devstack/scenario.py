"""`onceflow test SCENARIO.yaml`: a workflow run through the real admission, step engine and
blocks against a throwaway database and the fake CRM, on a virtual clock (issue 32 item 1).

A scenario names a workflow file, the records as they are in the CRM before it starts, a
timeline of moments (a record created or changed by a person in the CRM, an approval decided,
or only time passing) and what should have happened by the end: admissions (a run started, or
refused with a reason), and per run its status, the steps taken, branch choices, the CRM writes
and http requests its steps asked for, and the approvals it requested.

The path is production's: the fake CRM sends a signed webhook to the real webhook function
(served in-process), the inbox is drained, the event admitted, the steps advanced by the real
engine with the catalog's blocks. Two things are doubles: Pub/Sub (an in-process queue, as the
engine's tests use) and `http.request`, which records what it would send instead of sending it
(a third party must not receive a scenario's test traffic). A workflow with an `ai.generate`
step gets a third: the model, the fake Vertex AI endpoint (devstack/fakevertex) reached over
real HTTP through Google's SDK, answering with the scenario's `model_answers` (the first whose
key occurs in the prompt; else the smallest answer the step's schema allows).

The virtual clock. The engine reads time in two places: SQL `now()`/`statement_timestamp()`
(the sweep's wake of due delays, retries and wait deadlines; a wait's resume-by-event guard)
and Python `datetime.now` (a delay's or wait's due time when the block runs). Passing `now` as
a parameter through every statement would touch most of shared/sql for a test-only need, and
still leave the blocks and the fake reading real time. Instead the clock moves by time travel
in the throwaway database only: moving the clock forward by D is the same as every stored
instant having happened D earlier, so `advance` subtracts D from every timestamptz column of
every table (one transaction). Due times come due, the past moves further into the past
(a wait's lookback sees an event of two virtual days ago as two days old), and order is kept.
The fake CRM keeps real time, which is consistent: what it sends after a jump happens "now".
Timestamps inside JSON values (a delay's `delay_until`, an event's payload) are informational
and not moved. The runner jumps from due wake to due wake (the sweep's own `sweep_next_due`)
until the next moment of the timeline, running the sweep's repairs at each, so a wait of three
days takes milliseconds and the order of a deadline and an event is the timeline's.
"""

from __future__ import annotations

import base64
import dataclasses
import difflib
import hashlib
import hmac
import json
import logging
import os
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from devstack import postgres, seed
from devstack.fakecrm import FakeCrm, FakeCrmConfig
from devstack.serving import serve_in_thread

ROOT = Path(__file__).resolve().parent.parent

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_INVALID = 2

# A person in the CRM (not an integration): what a scenario's record changes are attributed to.
PERSON = ("CRM_UI", "userId:7")
# The connection the scenario's tenant reaches the fake through; an example that names its
# connection (a CRM poll source) names this one (tests/examples_support.py uses it too).
CONNECTION_ID = "0c0ffee0-5a1e-4000-8000-00000000a11c"
# The variable holding the secret of the `standard` connection a scenario's generic webhooks
# are signed with (the runner makes the secret; connections name their secret's variable).
WEBHOOK_SECRET_ENV = "ONCEFLOW_SCENARIO_WEBHOOK_SECRET"  # noqa: S105 - a name
WEBHOOK_KEY = b"onceflow scenario webhook key"
# The Vertex AI project the scenario's tenant calls (only ever the fake).
VERTEX_PROJECT = "onceflow-scenario"
VERTEX_ENV = "ONCEFLOW_VERTEX_BASE_URL"
# How many sweep passes one advance may take before the scenario is said to loop.
MAX_WAKES = 500

_DURATION = re.compile(r"^\+?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_offset(text: str) -> timedelta:
    """`+0`, `+2d`, `+2d3h`, `+90m`, `+30s` (the plus is optional): time since the start."""
    text = str(text).strip()
    if text in ("0", "+0"):
        return timedelta(0)
    m = _DURATION.match(text)
    if not m or not any(m.groups()):
        raise ValueError(f"{text!r} is not an offset like +0, +2d, +2d3h, +45m, +30s")
    d, h, mi, s = (int(g or 0) for g in m.groups())
    return timedelta(days=d, hours=h, minutes=mi, seconds=s)


def _show_offset(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    parts = [f"{v}{u}" for v, u in ((d, "d"), (h, "h"), (m, "m"), (s, "s")) if v]
    return "+" + ("".join(parts) or "0")


# ---- the file format ------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Link(_Strict):
    """An association to another record of the scenario (HubSpot association type id)."""

    to: str
    type_id: int


class RecordSpec(_Strict):
    type: str = Field(description="the CRM object type: contacts, companies, deals, …")
    properties: dict[str, Any] = {}
    links: list[Link] = []


class Change(_Strict):
    record: str
    properties: dict[str, Any]


class Decision(_Strict):
    step: str
    by: str
    role: str | None = None
    comment: str | None = None


class WebhookPost(_Strict):
    """A POST to the workflow's generic webhook, signed as Standard Webhooks are; `$alias`
    in the body stands for a record's id. A sender's retry reuses its message id."""

    id: str
    body: Any


class Moment(_Strict):
    """One point of the timeline: at most one thing happens; none means only time passes."""

    at: str
    create: str | None = Field(None, description="a record of `records` now created")
    update: Change | None = None
    approve: Decision | None = None
    reject: Decision | None = None
    webhook: WebhookPost | None = None
    note: str | None = None

    @field_validator("at", mode="before")
    @classmethod
    def _offset(cls, v: Any) -> str:
        parse_offset(str(v))
        return str(v)

    def offset(self) -> timedelta:
        return parse_offset(self.at)

    def actions(self) -> list[str]:
        return [k for k in ("create", "update", "approve", "reject", "webhook") if getattr(self, k)]


class CrmWrite(_Strict):
    step: str
    type: str | None = None  # crm.create, crm.update, …
    object_type: str | None = None
    object_id: str | None = None
    properties: dict[str, Any] | None = None


class HttpCall(_Strict):
    step: str
    method: str | None = None
    url: str | None = None
    body: Any = None


class RunExpect(_Strict):
    status: str | None = None
    steps: list[str] | None = None
    branches: dict[str, str] | None = None
    # step id -> the model's answer an `ai.generate` step received.
    answers: dict[str, Any] | None = None
    crm_writes: list[CrmWrite] | None = None
    http: list[HttpCall] | None = None
    approvals: list[str] | None = None


class Expect(_Strict):
    admissions: list[str] | None = Field(
        None, description="per event bound to the workflow: `started` or `refused: REASON`"
    )
    runs: list[RunExpect] | None = None


class Scenario(_Strict):
    workflow: str
    description: str | None = None
    records: dict[str, RecordSpec] = {}
    model_answers: dict[str, Any] = Field(
        {},
        description="for `ai.generate` steps: prompt substring -> the JSON answer the model"
        " gives (the first whose key occurs in the prompt); unmatched prompts get the smallest"
        " answer the step's schema allows",
    )
    timeline: list[Moment]
    expect: Expect


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


class ScenarioInvalid(Exception):
    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = list(problems)


@dataclass
class Loaded:
    path: Path
    scenario: Scenario
    workflow_path: Path
    workflow_name: str


def _plain(node: yaml.Node, path: tuple[Any, ...], marks: dict[tuple[Any, ...], Any]) -> Any:
    """The node as plain data, remembering where each path starts (for errors' line/column)."""
    marks[path] = node.start_mark
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = yaml.safe_load(yaml.serialize(key_node))
            marks[("key", *path, key)] = key_node.start_mark  # where a misspelt key is
            out[key] = _plain(value_node, (*path, key), marks)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_plain(n, (*path, i), marks) for i, n in enumerate(node.value)]
    return yaml.safe_load(yaml.serialize(node))


def _where(marks: Mapping[tuple[Any, ...], Any], loc: Sequence[Any]) -> tuple[int, int]:
    path = tuple(loc)
    while path not in marks and path:
        path = path[:-1]
    mark = marks.get(path)
    return (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)


def load(path: str | Path) -> Loaded:
    """The scenario at `path`, checked; raises `ScenarioInvalid` with each problem's place."""
    from shared.publishing.validate import validate_file

    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
        node = yaml.compose(text)
    except OSError as exc:
        raise ScenarioInvalid([Problem(name, 1, 1, f"can't read: {exc}")]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise ScenarioInvalid([Problem(name, line, col, f"not YAML: {exc.problem}")]) from None
    if node is None:
        raise ScenarioInvalid([Problem(name, 1, 1, "empty file")])
    marks: dict[tuple[Any, ...], Any] = {}
    data = _plain(node, (), marks)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            at_key = err["type"] == "extra_forbidden" and ("key", *err["loc"]) in marks
            line, col = _where(marks, ("key", *err["loc"]) if at_key else err["loc"])
            where = ".".join(str(p) for p in err["loc"])
            problems.append(Problem(name, line, col, f"{where}: {err['msg']}"))
        raise ScenarioInvalid(problems) from None
    problems = []

    def problem(loc: tuple[Any, ...], message: str) -> None:
        line, col = _where(marks, loc)
        problems.append(Problem(name, line, col, message))

    workflow_path = (path.parent / scenario.workflow).resolve()
    workflow_name = ""
    step_ids: set[str] | None = None
    if not workflow_path.is_file():
        problem(("workflow",), f"no workflow file {scenario.workflow!r} (relative to the scenario)")
    else:
        report = validate_file(workflow_path)
        for p in report.problems:
            if p.severity == "error":
                problem(("workflow",), f"the workflow does not validate: {p}")
        definition = yaml.safe_load(workflow_path.read_text()) or {}
        workflow_name = str(definition.get("name", ""))
        step_ids = {
            str(st.get("id")) for st in definition.get("steps") or [] if isinstance(st, dict)
        } | {
            # A `finally:` step's row is journaled as `finally:<id>` (shared/steps/finale.py).
            "finally:" + str(st.get("id"))
            for st in definition.get("finally") or []
            if isinstance(st, dict)
        }
    for alias, rec in scenario.records.items():
        for j, link in enumerate(rec.links):
            if link.to not in scenario.records:
                problem(("records", alias, "links", j, "to"), f"no record {link.to!r} in records")
    last = timedelta(0)
    for i, moment in enumerate(scenario.timeline):
        if moment.offset() < last:
            problem(("timeline", i, "at"), f"{moment.at} is before the moment above it")
        last = max(last, moment.offset())
        if len(moment.actions()) > 1:
            problem(("timeline", i), f"one thing per moment, not {', '.join(moment.actions())}")
        named = moment.create or (moment.update.record if moment.update else None)
        if named is not None and named not in scenario.records:
            key = "create" if moment.create else "update"
            problem(("timeline", i, key), f"no record {named!r} in records")
    if step_ids is not None:
        _check_steps(scenario, step_ids, problem)
    for i, expected in enumerate(scenario.expect.admissions or []):
        if expected != "started" and not expected.startswith("refused: "):
            problem(("expect", "admissions", i), "an admission is `started` or `refused: REASON`")
    if problems:
        raise ScenarioInvalid(problems)
    return Loaded(path, scenario, workflow_path, workflow_name)


def _check_steps(
    scenario: Scenario, ids: set[str], problem: Callable[[tuple[Any, ...], str], None]
) -> None:
    """Every step a scenario names is one of the workflow's (`node[i]` names node's i-th
    repetition): a misspelt step would otherwise only show as a failed expectation."""

    def check(loc: tuple[Any, ...], key: str) -> None:
        if key.split("[", 1)[0] not in ids:
            problem(loc, f"the workflow has no step {key!r}")

    for i, moment in enumerate(scenario.timeline):
        for verb in ("approve", "reject"):
            decision = getattr(moment, verb)
            if decision is not None:
                check(("timeline", i, verb, "step"), decision.step)
    for n, run in enumerate(scenario.expect.runs or []):
        where = ("expect", "runs", n)
        for j, key in enumerate(run.steps or []):
            check((*where, "steps", j), key)
        for key in run.branches or {}:
            check((*where, "branches", key), key)
        for j, key in enumerate(run.approvals or []):
            check((*where, "approvals", j), key)
        for name in ("crm_writes", "http"):
            for j, call in enumerate(getattr(run, name) or []):
                check((*where, name, j, "step"), call.step)


# ---- the world a scenario runs in -----------------------------------------------------------


class _Queue:
    """Pub/Sub's step-ready topic, in-process: the ids dispatched, in order."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def __call__(self, ids: Iterable[str]) -> None:
        self.ids.extend(ids)


@dataclass
class Observed:
    """What happened, per run id (the blocks' calls as the engine rendered them)."""

    calls: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    admissions: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, run_id: str, call: dict[str, Any]) -> None:
        with self.lock:
            self.calls.setdefault(run_id, []).append(call)


def _observing_lookup(observed: Observed) -> Callable[[str], Any]:
    """The catalog's blocks, each call remembered with its rendered config; `http.request`
    answers 200 without sending (the third party is the one double)."""
    from shared.blocks.base import BlockResult
    from shared.steps.advance import registry_lookup

    cache: dict[str, Any] = {}

    def lookup(type_name: str) -> Any:
        if type_name in cache:
            return cache[type_name]
        spec = registry_lookup(type_name)
        real = spec.execute

        def execute(ctx: Any, config: BaseModel) -> Any:
            observed.add(
                ctx.run_id,
                {"step": ctx.step_key, "type": type_name, "config": config.model_dump(mode="json")},
            )
            if type_name == "http.request":
                return BlockResult(output={"status": 200, "body": None})
            return real(ctx, config)

        if type_name == "http.request":
            # Nothing leaves, so the gates that guard the third party (its host's limits,
            # resolved from its address) have nothing to guard.
            spec = dataclasses.replace(spec, gates=frozenset(), target=None, landed_query=None)
        cache[type_name] = dataclasses.replace(spec, execute=execute)
        return cache[type_name]

    return lookup


class Driver:
    """One scenario's tenant, connection and workflow on `db`, and the moves of the timeline."""

    def __init__(self, db: Any, fake: FakeCrm, loaded: Loaded, tenant: str) -> None:
        from shared.steps.claim import LeaseConfig

        self.db = db
        self.fake = fake
        self.loaded = loaded
        self.tenant = tenant
        self.queue = _Queue()
        self.observed = Observed()
        self.lookup = _observing_lookup(self.observed)
        self.lease = LeaseConfig(lease_seconds=60, heartbeat_seconds=30)
        self.admitted: set[int] = set()
        self.ids: dict[str, str] = {}  # record alias -> id at the fake
        self.clock = timedelta(0)
        self.workflow_id = ""
        self.webhook_url = ""
        self.standard_connection: str | None = None

    # -- setting up
    def seed(self, webhook_url: str, *, model: bool = False) -> None:
        with self.db.transaction() as tx:
            seed.tenant(tx, self.tenant, credits=100_000, existing="update")
            if model:
                seed.vertex(tx, self.tenant, project=VERTEX_PROJECT)
            seed.connection(
                tx,
                self.tenant,
                webhook_secret_env="FAKECRM_APP_SECRET",  # noqa: S106 - a variable's name
                api_credentials_env="FAKECRM_TOKEN",
                api_base_url=self.fake.url,
                provider_app_id="424242",
                connection_id=CONNECTION_ID,
            )
        self.fake.config.webhook_url = f"{webhook_url}/hubspot/{CONNECTION_ID}"
        self.webhook_url = webhook_url

    def create(self, alias: str) -> None:
        spec = self.loaded.scenario.records[alias]
        body = None
        if spec.links:
            body = {
                "associations": [
                    {"to": {"id": self.ids[k.to]}, "types": [{"associationTypeId": k.type_id}]}
                    for k in spec.links
                ]
            }
        self.ids[alias] = self.fake.create_record(spec.type, spec.properties, PERSON, body=body).id

    def activate(self) -> None:
        """Publish and activate the workflow, then reconcile the provider subscriptions, as
        activation through the ops API does."""
        from shared.providers import connect
        from shared.publishing import subscriptions, versions

        path = self.loaded.workflow_path
        with self.db.transaction() as tx:
            published = versions.publish(tx, path.read_text(), filename=str(path))
            versions.activate(
                tx,
                tenant_id=self.tenant,
                workflow_id=published.workflow_id,
                version_id=published.version_id,
            )
        self.workflow_id = str(published.workflow_id)
        result = subscriptions.reconcile_connection(
            self.db, CONNECTION_ID, connect.port_for(self.db, CONNECTION_ID)
        )
        if not result.ok:
            raise RuntimeError(f"subscriptions could not be reconciled: {result.errors}")

    # -- the engine, in-process
    def drain(self) -> None:
        from shared.steps.advance import advance_step

        for _ in range(10_000):
            if not self.queue.ids:
                return
            advance_step(
                self.db,
                self.queue.ids.pop(0),
                lookup=self.lookup,
                dispatch=self.queue,
                config=self.lease,
            )
        raise RuntimeError("more than 10000 steps: does the workflow loop?")

    def pump(self) -> None:
        """Deliver the fake's webhooks, drain the inbox, admit new events, run the steps;
        again while the steps' own writes cause webhooks (each delivered before the clock
        moves on, as the CRM sends them within seconds: held back, two changes of one
        property would reach the inbox in one delivery)."""
        from shared.admission import admit as admission
        from shared.ingest.inbox import drain_inbox

        for _ in range(100):
            if not self.fake.webhooks.wait_idle():
                raise RuntimeError("the fake CRM's webhooks were not delivered")
            drain_inbox(self.db, budget_seconds=10, until_empty=True)
            with self.db.transaction() as tx:
                ids = [int(r["id"]) for r in tx.all("SELECT id FROM workflow_trigger_events")]
            new = sorted(set(ids) - self.admitted)
            for event_id in new:
                self.admitted.add(event_id)
                result = admission.admit_event(self.db, event_id, publish=self.queue)
                for o in result.outcomes:
                    if o.workflow_id == self.workflow_id:
                        started = o.outcome == "admitted"
                        self.observed.admissions.append(
                            "started" if started else f"refused: {o.reason}"
                        )
            writes = len(self.fake.store.writes)
            self.drain()
            if not new and len(self.fake.store.writes) == writes:
                return
        raise RuntimeError("the workflow keeps causing events: does it trigger itself?")

    def sweep(self) -> None:
        """One pass of the sweep's repairs (wakes due steps, redispatches lost ones)."""
        from shared.core.duty import SweepConfig, SweepReport
        from shared.sweep.loop import sweep_once

        sweep_once(
            self.db, config=SweepConfig(), dispatch=self.queue, duties=(), report=SweepReport()
        )
        self.pump()

    # -- the clock
    def _travel(self, delta: timedelta) -> None:
        """Every stored instant moves `delta` into the past (see the module's docstring).
        Tables with triggers (workflow_versions refuses updates) are left alone; their
        instants are records of publication, never compared with a due time."""
        if delta <= timedelta(0):
            return
        with self.db.transaction() as tx:
            rows = tx.all(
                "SELECT c.relname AS t, array_agg(a.attname ORDER BY a.attnum) AS cols"
                " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')"
                " AND NOT c.relispartition AND a.attnum > 0 AND NOT a.attisdropped"
                " AND a.attgenerated = '' AND a.atttypid = 'timestamptz'::regtype"
                " AND NOT EXISTS (SELECT 1 FROM pg_trigger g"
                "                 WHERE g.tgrelid = c.oid AND NOT g.tgisinternal)"
                " GROUP BY c.relname ORDER BY c.relname"
            )
            # Two moves: far into the past (where no row is), then back to the target. One
            # move of D would check a unique index row by row mid-statement, and a row moved
            # onto the instant another row still holds (two budget windows one day apart, a
            # jump of exactly a day) would collide with it.
            far = "1000 years"
            for shift in (f"{delta.total_seconds()} seconds {far}", f"-{far}"):
                for row in rows:
                    sets = ", ".join(
                        f'"{col}" = "{col}" - CAST(:d AS interval)' for col in row["cols"]
                    )
                    tx.execute(f'UPDATE "{row["t"]}" SET {sets}', d=shift)
        self.clock += delta

    def advance_to(self, target: timedelta) -> None:
        """Jump from due wake to due wake until `target`, the sweep running at each."""
        from shared.core.duty import SweepConfig
        from shared.sweep.loop import next_due_seconds

        for _ in range(MAX_WAKES):
            self.sweep()
            due = next_due_seconds(self.db, SweepConfig())
            if due is None:
                break
            # One second past the due instant, so `due <= now()` holds when the sweep runs.
            wake = self.clock + timedelta(seconds=max(due, 0.0) + 1)
            if wake > target:
                break
            self._travel(wake - self.clock)
        else:
            raise RuntimeError(f"more than {MAX_WAKES} wakes before {_show_offset(target)}")
        self._travel(target - self.clock)
        self.sweep()

    def post(self, post: WebhookPost) -> None:
        """Sign and POST to the webhook function, as a sender would (Standard Webhooks:
        base64 HMAC-SHA256 of `id.timestamp.body`, the key given as `whsec_` + base64)."""
        if self.standard_connection is None:
            os.environ[WEBHOOK_SECRET_ENV] = "whsec_" + base64.b64encode(WEBHOOK_KEY).decode()
            with self.db.transaction() as tx:
                self.standard_connection = seed.connection(
                    tx, self.tenant, provider="standard", webhook_secret_env=WEBHOOK_SECRET_ENV
                )
        raw = json.dumps(_resolve(post.body, self.ids)).encode()
        stamp = str(int(time.time()))
        mac = hmac.new(WEBHOOK_KEY, f"{post.id}.{stamp}.".encode() + raw, hashlib.sha256)
        request = urllib.request.Request(  # noqa: S310 - our own webhook function, http://
            f"{self.webhook_url}/standard/{self.standard_connection}/{self.loaded.workflow_name}",
            data=raw,
            headers={
                "Content-Type": "application/json",
                "webhook-id": post.id,
                "webhook-timestamp": stamp,
                "webhook-signature": "v1," + base64.b64encode(mac.digest()).decode(),
            },
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - as above
            answer.read()

    def decide(self, decision: Decision, verdict: str) -> None:
        from shared.steps.parks import decide_approval

        with self.db.transaction() as tx:
            park_id = tx.scalar(
                "SELECT p.id FROM step_parks p JOIN workflow_runs r ON r.id = p.run_id"
                " JOIN workflow_steps s ON s.id = p.step_id"
                " WHERE r.workflow_id = CAST(:w AS uuid) AND s.step_key = :k"
                " AND p.kind = 'approval' AND p.resumed_at IS NULL ORDER BY p.id DESC LIMIT 1",
                w=self.workflow_id,
                k=decision.step,
            )
        if park_id is None:
            raise RuntimeError(f"no approval is waiting at step {decision.step!r}")
        resumed = decide_approval(
            self.db,
            int(park_id),
            decision=verdict,
            user=decision.by,
            roles=[decision.role] if decision.role else [],
            comment=decision.comment,
            tenant_scope=None,
        )
        if resumed is not None and resumed.step_id is not None:
            self.queue([resumed.step_id])

    def play(self) -> None:
        for moment in self.loaded.scenario.timeline:
            self.advance_to(moment.offset())
            if moment.create:
                self.create(moment.create)
            elif moment.update:
                spec = self.loaded.scenario.records[moment.update.record]
                self.fake.update_record(
                    spec.type, self.ids[moment.update.record], moment.update.properties, PERSON
                )
            elif moment.approve:
                self.decide(moment.approve, "approved")
            elif moment.reject:
                self.decide(moment.reject, "rejected")
            elif moment.webhook:
                self.post(moment.webhook)
            self.pump()

    # -- what happened
    def actual(self) -> dict[str, Any]:
        with self.db.transaction() as tx:
            runs = tx.all(
                "SELECT id::text AS id, status FROM workflow_runs"
                " WHERE workflow_id = CAST(:w AS uuid) ORDER BY created_at, id",
                w=self.workflow_id,
            )
            out = []
            for run in runs:
                steps = tx.all(
                    "SELECT step_key, block_type, status, branch_choice, output"
                    " FROM workflow_steps"
                    " WHERE run_id = CAST(:r AS uuid) AND status <> 'skipped'"
                    " ORDER BY created_at, started_at NULLS LAST, step_key",
                    r=run["id"],
                )
                approvals = tx.all(
                    "SELECT s.step_key FROM step_parks p JOIN workflow_steps s ON s.id = p.step_id"
                    " WHERE p.run_id = CAST(:r AS uuid) AND p.kind = 'approval' ORDER BY p.id",
                    r=run["id"],
                )
                out.append(
                    {
                        "status": run["status"],
                        "steps": [s["step_key"] for s in steps],
                        "branches": {
                            s["step_key"]: s["branch_choice"]
                            for s in steps
                            if s["block_type"] == "branch" and s["branch_choice"]
                        },
                        "crm_writes": _crm_writes(self.observed.calls.get(run["id"], [])),
                        "http": [
                            {"step": c["step"], **_http_view(c["config"])}
                            for c in _last_per_step(self.observed.calls.get(run["id"], []))
                            if c["type"] == "http.request"
                        ],
                        "approvals": [a["step_key"] for a in approvals],
                        "answers": {
                            s["step_key"]: (s["output"] or {}).get("answer")
                            for s in steps
                            if s["block_type"] == "ai.generate" and s["status"] == "succeeded"
                        },
                    }
                )
        return {"admissions": list(self.observed.admissions), "runs": out}


def _last_per_step(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A retried step's last attempt stands for it, in the order steps first ran."""
    last: dict[str, dict[str, Any]] = {}
    for c in calls:
        last[c["step"]] = c
    return list(last.values())


def _crm_writes(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from shared.steps.advance import registry_lookup

    out = []
    for c in _last_per_step(calls):
        if not c["type"].startswith("crm."):
            continue
        if registry_lookup(c["type"]).side_effect == "none":
            continue  # a read
        config = c["config"]
        view = {"step": c["step"], "type": c["type"], "object_type": config.get("object_type")}
        if config.get("object_id") is not None:
            view["object_id"] = config["object_id"]
        view["properties"] = config.get("properties") or {}
        out.append(view)
    return out


def _http_view(config: Mapping[str, Any]) -> dict[str, Any]:
    return {"method": config.get("method"), "url": config.get("url"), "body": config.get("body")}


# ---- comparing ------------------------------------------------------------------------------


def _resolve(value: Any, ids: Mapping[str, str]) -> Any:
    """`$alias` (a whole string) stands for the id the fake gave that record."""
    if isinstance(value, str) and value.startswith("$") and value[1:] in ids:
        return ids[value[1:]]
    if isinstance(value, dict):
        return {k: _resolve(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, ids) for v in value]
    return value


def _matches(expected: Any, actual: Any) -> bool:
    """Expected mappings name only the keys that matter; lists and scalars compare whole
    (numbers and their text alike: the CRM keeps properties as text)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _matches(v, actual[k]) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(_matches(e, a) for e, a in zip(expected, actual, strict=True))
        )
    if expected == actual:
        return True
    return not isinstance(expected, bool) and str(expected) == str(actual)


def _lines(items: Sequence[Any]) -> list[str]:
    return [
        item if isinstance(item, str) else json.dumps(item, sort_keys=True, default=str)
        for item in items
    ]


def _diff(what: str, expected: Sequence[Any], actual: Sequence[Any]) -> list[str]:
    out = [f"  {what}:", "    expected:"]
    out += [f"      {line}" for line in _lines(expected)] or ["      (none)"]
    out += ["    actual:"]
    out += [f"      {line}" for line in _lines(actual)] or ["      (none)"]
    diff = list(
        difflib.unified_diff(_lines(expected), _lines(actual), "expected", "actual", lineterm="")
    )
    if diff:
        out += ["    diff:"] + [f"      {line}" for line in diff]
    return out


def compare(loaded: Loaded, actual: Mapping[str, Any], ids: Mapping[str, str]) -> list[str]:
    """The failed expectations, readable; empty when every expectation holds."""
    expect = loaded.scenario.expect
    failures: list[str] = []
    if expect.admissions is not None and expect.admissions != actual["admissions"]:
        failures += _diff("admissions", expect.admissions, actual["admissions"])
    if expect.runs is None:
        return failures
    runs = actual["runs"]
    if len(expect.runs) != len(runs):
        failures += _diff(
            "runs (status of each)",
            [r.status or "?" for r in expect.runs],
            [r["status"] for r in runs],
        )
    for n, (want, got) in enumerate(zip(expect.runs, runs, strict=False), start=1):
        if want.status is not None and want.status != got["status"]:
            failures += [f"  run {n} status: expected {want.status}, actual {got['status']}"]
        if want.steps is not None and want.steps != got["steps"]:
            failures += _diff(f"run {n} steps", want.steps, got["steps"])
        if want.branches is not None and want.branches != {
            k: got["branches"].get(k) for k in want.branches
        }:
            failures += _diff(
                f"run {n} branches",
                [f"{k} -> {v}" for k, v in want.branches.items()],
                [f"{k} -> {v}" for k, v in got["branches"].items()],
            )
        if want.answers is not None and not _matches(
            want.answers, {k: got["answers"].get(k) for k in want.answers}
        ):
            failures += _diff(
                f"run {n} answers",
                [f"{k}: {json.dumps(v, sort_keys=True)}" for k, v in want.answers.items()],
                [f"{k}: {json.dumps(v, sort_keys=True)}" for k, v in got["answers"].items()],
            )
        if want.approvals is not None and want.approvals != got["approvals"]:
            failures += _diff(f"run {n} approvals", want.approvals, got["approvals"])
        for name in ("crm_writes", "http"):
            wanted = getattr(want, name)
            if wanted is None:
                continue
            expected = [_resolve(w.model_dump(exclude_none=True, mode="json"), ids) for w in wanted]
            if not _matches(expected, got[name]):
                failures += _diff(f"run {n} {name}", expected, got[name])
    return failures


# ---- running --------------------------------------------------------------------------------


def run_loaded(loaded: Loaded, db: Any, fake: FakeCrm, webhook_url: str, out: TextIO) -> int:
    """Play one checked scenario on a fresh database; print the result; its exit code."""
    workflow = yaml.safe_load(loaded.workflow_path.read_text()) or {}
    tenant = str(workflow.get("tenant", "acme"))
    asks_model = any(
        isinstance(step, Mapping) and step.get("type") == "ai.generate"
        for step in workflow.get("steps") or []
    )
    with _model_double(loaded.scenario.model_answers, enabled=asks_model):
        return _play(loaded, db, fake, webhook_url, out, tenant=tenant, model=asks_model)


@contextmanager
def _model_double(answers: Mapping[str, Any], *, enabled: bool) -> Iterator[None]:
    """The fake Vertex AI endpoint for a workflow that asks a model, with the scenario's
    answers; the block is pointed at it (`ONCEFLOW_VERTEX_BASE_URL`, put back afterwards), so
    nothing reaches Google."""
    if not enabled:
        yield
        return
    from devstack.fakevertex.server import FakeVertex
    from shared.core.settings import settings

    model = FakeVertex(fixtures=dict(answers)).start()
    before = os.environ.get(VERTEX_ENV)
    os.environ[VERTEX_ENV] = model.base_url
    settings.cache_clear()
    try:
        yield
    finally:
        model.stop()
        if before is None:
            os.environ.pop(VERTEX_ENV, None)
        else:
            os.environ[VERTEX_ENV] = before
        settings.cache_clear()


def _play(
    loaded: Loaded,
    db: Any,
    fake: FakeCrm,
    webhook_url: str,
    out: TextIO,
    *,
    tenant: str,
    model: bool,
) -> int:
    from shared.providers import connect

    connect.forget_ports()
    driver = Driver(db, fake, loaded, tenant)
    driver.seed(webhook_url, model=model)
    for alias in loaded.scenario.records:
        if alias not in {m.create for m in loaded.scenario.timeline}:
            driver.create(alias)  # as the CRM holds it before the workflow is active
    driver.activate()
    driver.pump()
    try:
        driver.play()
    except RuntimeError as exc:  # the timeline asked for what could not happen
        print(f"{loaded.path}: FAILED at {_show_offset(driver.clock)}: {exc}", file=out)
        return EXIT_FAILED
    failures = compare(loaded, driver.actual(), driver.ids)
    end = _show_offset(driver.clock)
    if failures:
        print(f"{loaded.path}: FAILED (virtual time {end})", file=out)
        for line in failures:
            print(line, file=out)
        return EXIT_FAILED
    print(f"{loaded.path}: ok (virtual time {end})", file=out)
    return EXIT_PASSED


@contextmanager
def local_world(database_url: str | None = None) -> Iterator[Callable[[Loaded, TextIO], int]]:
    """For the command line: a throwaway PostgreSQL cluster (or the migrated database at
    `database_url`, written to), the fake CRM and the webhook function; yields `run(loaded,
    out)`. The process's environment is set the way the functions read it (this process is
    the scenario's whole deployment)."""
    import functions_framework
    from werkzeug.serving import make_server

    from shared.core import db as dbmod
    from shared.core.settings import settings

    # The engine's info lines (one JSON object per step) would bury the verdicts; warnings
    # (a run failed, a step gave up) still show.
    for name in ("", "werkzeug"):  # werkzeug sets its own level (a line per request)
        logging.getLogger(name).setLevel(logging.WARNING)
    with contextmanager(_databases)(database_url) as fresh:
        os.environ.update({"WEBHOOK_NUDGE": "off", "FAKECRM_TOKEN": "tok", "NO_GCE_CHECK": "true"})
        app = functions_framework.create_app(  # type: ignore[no-untyped-call]
            target="webhook", source=str(ROOT / "main.py")
        )
        server = make_server("127.0.0.1", 0, app, threaded=True)
        serve_in_thread(server, "scenario-ops")

        def run(loaded: Loaded, out: TextIO) -> int:
            with fresh() as url:
                os.environ["DATABASE_URL"] = url
                os.environ.pop("INSTANCE_CONNECTION_NAME", None)
                fake = FakeCrm(FakeCrmConfig(require_subscriptions=True)).start()
                os.environ["FAKECRM_APP_SECRET"] = fake.config.app_secret
                settings.cache_clear()
                dbmod.reset_database()
                try:
                    return run_loaded(
                        loaded,
                        dbmod.get_database(),
                        fake,
                        f"http://127.0.0.1:{server.server_port}",
                        out,
                    )
                finally:
                    fake.stop()
                    dbmod.reset_database()

        try:
            yield run
        finally:
            server.shutdown()


def _databases(database_url: str | None) -> Iterator[Callable[[], Any]]:
    """A factory of fresh migrated databases: copies of a migrated template on a throwaway
    cluster, or the one database given (used as it is)."""
    if database_url is not None:

        @contextmanager
        def given() -> Iterator[str]:
            yield database_url

        yield given
        return
    with postgres.throwaway("onceflow-scenario-pg-", fast=True) as cluster:
        postgres.create_migrated_database(cluster, "scenario_template")

        @contextmanager
        def fresh() -> Iterator[str]:
            name = f"s_{uuid.uuid4().hex[:12]}"
            postgres.create_database(cluster.port, name, template="scenario_template")
            yield cluster.url(name)

        yield fresh


def main(files: Sequence[str], out: TextIO, err: TextIO, database_url: str | None = None) -> int:
    """`onceflow test`: 2 when a scenario is invalid (nothing runs), else 1 when one failed."""
    loaded: list[Loaded] = []
    invalid = False
    for name in files:
        try:
            loaded.append(load(name))
        except ScenarioInvalid as exc:
            invalid = True
            for p in exc.problems:
                print(p, file=err)
    if invalid:
        return EXIT_INVALID
    if database_url is not None and len(loaded) > 1:
        # Each scenario starts from an empty database: the one given can serve only one.
        print("onceflow test: --database-url takes one scenario at a time", file=err)
        return EXIT_INVALID
    code = EXIT_PASSED
    with local_world(database_url) as run:
        for one in loaded:
            code = max(code, run(one, out))
    return code
