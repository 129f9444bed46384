"""Validation of a workflow definition, with every problem pointing at file, line and column.

Errors make a definition unpublishable: YAML that does not parse, a shape the models refuse,
an unknown block type, a config its block refuses, dangling or unreachable edges, cycles,
expressions that do not compile, and references to steps that cannot have run yet. Warnings
are legal but risky choices; they are printed, never blocking.

Positions come from the YAML node tree (`yaml.compose`), mapped from each value's path in the
document; a problem about a path that does not exist (a missing field) points at the nearest
enclosing node that does. JSON is YAML, so JSON files get positions too.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from shared import triggers
from shared.blocks import registry
from shared.core.errors import PermanentError
from shared.providers import registry as providers
from shared.triggers.events import unknown_event_type
from shared.workflows import listening
from shared.workflows.definition import (
    ANY_CRM,
    DEBOUNCE_MAX_PERIOD_SECONDS,
    DEBOUNCE_MAX_WAIT_SECONDS,
    JUMP_KEYS,
    Step,
    Trigger,
    WorkflowDefinition,
)
from shared.workflows.expressions import (
    TEMPLATE,
    CompiledExpression,
    ExpressionError,
    compile_expression,
)
from shared.workflows.scope import RULE_ROOTS, step_expressions, wait_expressions

PathT = tuple[str | int, ...]
Severity = Literal["error", "warning"]
TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{1,62}$"
# The limits on a definition's text, checked before anything else reads it (README, security).
MAX_SOURCE_CHARS = 65536
MAX_YAML_DEPTH = 32
_TENANT = re.compile(TENANT_PATTERN)


@dataclass(frozen=True)
class Problem:
    severity: Severity
    path: PathT
    message: str
    file: str = "<input>"
    line: int | None = None  # 1-based
    column: int | None = None  # 1-based

    @property
    def where(self) -> str:
        return format_path(self.path)

    def __str__(self) -> str:
        pos = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        where = f" {self.where}:" if self.path else ""
        return f"{pos}: {self.severity}:{where} {self.message}"


@dataclass(frozen=True)
class ValidationReport:
    file: str
    problems: tuple[Problem, ...]
    definition: WorkflowDefinition | None = None

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def ok(self) -> bool:
        return self.definition is not None and not self.errors


class DefinitionInvalid(PermanentError, ValueError):
    """A definition with errors; `report` lists them all. A `PermanentError`, so it leaves a
    `db.transaction()` block as itself (rolled back) instead of being re-wrapped."""

    code = "definition_invalid"

    def __init__(self, report: ValidationReport) -> None:
        first = report.errors[0] if report.errors else None
        super().__init__(
            f"{len(report.errors)} error(s) in {report.file}"
            + (f"; first: {first}" if first else "")
        )
        self.report = report


def format_path(path: Iterable[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# ---------------------------------------------------------------- YAML with positions


class _Loader(yaml.SafeLoader):
    """Safe YAML without implicit timestamps: `2025-01-01` stays a string, so a definition
    is always plain JSON data (it is hashed and stored as jsonb).

    Anchors and aliases are refused where the composer meets them, before anything is built:
    an alias is a reference, so a few hundred bytes of nested aliases ("billion laughs") name
    gigabytes once anything walks the tree, and a definition has no need for them. Nesting is
    refused past `MAX_YAML_DEPTH` at the same place, so the composer's and constructor's
    recursion never reaches Python's limit."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        mark: yaml.error.Mark | None = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{event.anchor}) are not accepted", mark
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise yaml.composer.ComposerError(
                None, None, f"anchors (&{anchor}) are not accepted", mark
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"the document nests deeper than {MAX_YAML_DEPTH} levels",
                    mark,
                )
            node: yaml.Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}

Mark = tuple[int, int]


@dataclass
class _Positions:
    values: dict[PathT, Mark] = field(default_factory=dict)
    keys: dict[PathT, Mark] = field(default_factory=dict)

    def of(self, path: PathT, *, prefer_key: bool = False) -> Mark | None:
        if prefer_key and path in self.keys:
            return self.keys[path]
        for end in range(len(path), -1, -1):
            mark = self.values.get(path[:end])
            if mark is not None:
                return mark
        return None


def _mark(node: yaml.Node) -> Mark:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def _record_positions(
    node: yaml.Node, path: PathT, positions: _Positions, duplicates: list[PathT]
) -> None:
    positions.values[path] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            child = (*path, key)
            if key in seen:
                duplicates.append(child)
            seen.add(key)
            positions.keys[child] = _mark(key_node)
            _record_positions(value_node, child, positions, duplicates)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _record_positions(item, (*path, index), positions, duplicates)


# ---------------------------------------------------------------- entry points


def validate_file(path: str | Path) -> ValidationReport:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return ValidationReport(str(p), (Problem("error", (), f"cannot read: {exc}", str(p)),))
    return validate_text(text, str(p))


def validate_text(text: str, filename: str = "<input>") -> ValidationReport:
    if len(text) > MAX_SOURCE_CHARS:
        message = f"the definition is {len(text)} characters; the limit is {MAX_SOURCE_CHARS}"
        return ValidationReport(filename, (Problem("error", (), message, filename),))
    # The reader checks the whole text for characters YAML forbids (e.g. C1 controls such as
    # \x84) as the loader is built, so building it belongs inside the same error handling.
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as exc:
        before = text[: exc.position]
        line, column = before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1
        message = f"not valid YAML: character #x{exc.character:04x} is not allowed"
        return ValidationReport(filename, (Problem("error", (), message, filename, line, column),))
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = f"not valid YAML: {exc.problem or exc.context}"
        return ValidationReport(
            filename,
            (
                Problem(
                    "error",
                    (),
                    message,
                    filename,
                    mark.line + 1 if mark else None,
                    mark.column + 1 if mark else None,
                ),
            ),
        )
    except yaml.YAMLError as exc:
        return ValidationReport(
            filename, (Problem("error", (), f"not valid YAML: {exc}", filename),)
        )
    finally:
        loader.dispose()
    positions = _Positions()
    duplicates: list[PathT] = []
    if node is not None:
        _record_positions(node, (), positions, duplicates)
    return _Validation(filename, positions).run(data, duplicates)


def validate_data(data: Any, filename: str = "<input>") -> ValidationReport:
    """Validate already-parsed data (e.g. a JSON body); problems carry paths, not lines."""
    return _Validation(filename, _Positions()).run(data, [])


def load_definition(
    text: str, filename: str = "<input>"
) -> tuple[WorkflowDefinition, ValidationReport]:
    """The validated definition, or `DefinitionInvalid` listing every error."""
    report = validate_text(text, filename)
    if not report.ok or report.definition is None:
        raise DefinitionInvalid(report)
    return report.definition, report


# ---------------------------------------------------------------- the checks


class _Validation:
    def __init__(self, filename: str, positions: _Positions) -> None:
        self.filename = filename
        self.positions = positions
        self.problems: list[Problem] = []

    def add(self, severity: Severity, path: PathT, message: str, *, at_key: bool = False) -> None:
        mark = self.positions.of(path, prefer_key=at_key)
        self.problems.append(
            Problem(
                severity,
                path,
                message,
                self.filename,
                mark[0] if mark else None,
                mark[1] if mark else None,
            )
        )

    def report(self, definition: WorkflowDefinition | None) -> ValidationReport:
        ordered = sorted(
            self.problems,
            key=lambda p: (p.severity != "error", p.line or 0, p.column or 0, p.message),
        )
        return ValidationReport(self.filename, tuple(ordered), definition)

    def run(self, data: Any, duplicates: list[PathT]) -> ValidationReport:
        for path in duplicates:
            self.add("error", path, f"duplicate key {path[-1]!r}", at_key=True)
        if not isinstance(data, Mapping):
            found = "an empty document" if data is None else f"a {type(data).__name__}"
            self.add(
                "error",
                (),
                f"expected a mapping with name, tenant, trigger and steps; found {found}",
            )
            return self.report(None)
        try:
            definition = WorkflowDefinition.model_validate(data)
        except ValidationError as exc:
            self.model_errors(exc, ())
            self.check_parts(data)
            return self.report(None)
        if duplicates:
            return self.report(None)
        self.check(definition)
        return self.report(definition)

    def model_errors(self, exc: ValidationError, prefix: PathT, skip_templates: Any = None) -> None:
        for err in exc.errors(include_url=False):
            loc = tuple(err["loc"])
            path = (*prefix, *loc)
            if skip_templates is not None and _holds_template(skip_templates, loc):
                continue  # a `${{ … }}` value is only known at run time
            kind = err["type"]
            if kind == "missing":
                self.add("error", path, f"missing required field {loc[-1]!r}" if loc else "missing")
            elif kind == "extra_forbidden":
                self.add("error", path, f"unknown field {loc[-1]!r}", at_key=True)
            else:
                found = _short(err.get("input"))
                message = err["msg"]
                if message.startswith("Value error, "):
                    message = message[len("Value error, ") :]
                self.add("error", path, f"{message}; found {found}")

    def check_parts(self, data: Mapping[str, Any]) -> None:
        """The document as a whole is refused; still judge the steps that are well formed on
        their own, so one run of the validator reports as much as it can."""
        # A malformed trigger was already reported through the whole-document errors.
        with contextlib.suppress(ValidationError):
            self.check_trigger(Trigger.model_validate(data.get("trigger")))
        steps = data.get("steps")
        if not isinstance(steps, list):
            return
        for i, raw in enumerate(steps):
            try:
                step = Step.model_validate(raw)
            except ValidationError:
                continue  # already reported through the whole-document errors
            self.check_step_config(i, step)

    # ------------------------------------------------------------ definition-level checks

    def check(self, d: WorkflowDefinition) -> None:
        if not _TENANT.match(d.tenant):
            self.add(
                "error", ("tenant",), f"a tenant id matches {TENANT_PATTERN}; found {d.tenant!r}"
            )
        self.check_trigger(d.trigger)
        triggers.check_trigger_tenant(d.trigger, d.tenant, self.add)
        ids = self.check_ids(d)
        edges_ok = self.check_edges(d, ids)
        graph = _Graph(d) if edges_ok else None
        if graph is not None:
            self.check_shape(d, graph)
        for index, step in enumerate(d.steps):
            self.check_step(d, index, step, graph)
        self.check_finally(d, ids)
        self.check_object_kinds(d)
        self.check_stops(d)
        if d.concurrency is not None:
            self.check_concurrency(d)
        if d.priority is not None:
            self.check_before_the_run(
                ("priority",),
                d.priority,
                "a priority is evaluated at admission, before the run exists: it cannot read",
                "it reads event, trigger and record",
            )
        self.check_risks(d)

    def check_object_kinds(self, d: WorkflowDefinition) -> None:
        """A step's `object_type` names a kind on the CRM the trigger's events come from.
        The block's own config check accepts a neutral kind or any CRM's name for one
        (shared/blocks/crm.py); a trigger on one CRM's events (`hubspot.…` only) runs its
        steps on that CRM, whose names alone are then right (`person` is Pipedrive's)."""
        vendors = {e.split(".", 1)[0] for e in d.trigger.events} - {ANY_CRM}
        found = providers.get(vendors.pop()) if len(vendors) == 1 else None
        if found is None or not found.object_kinds:
            return
        for i, step in enumerate(d.steps):
            named: list[tuple[PathT, Any]] = [
                (("config", "object_type"), step.config.get("object_type"))
            ]
            associations = step.config.get("associations")
            for j, a in enumerate(associations if isinstance(associations, list) else []):
                if isinstance(a, Mapping):
                    named.append(
                        (("config", "associations", j, "object_type"), a.get("object_type"))
                    )
            for where, name in named:
                if not isinstance(name, str) or "${{" in name or not step.type.startswith("crm."):
                    continue
                if providers.object_kind(name) is not None and found.object_kind(name) is None:
                    self.add(
                        "error",
                        ("steps", i, *where),
                        f"{name!r} is no object kind on {found.title}, whose events start "
                        f"this workflow: use contact, company, deal, task or note",
                    )

    def check_trigger(self, t: Trigger) -> None:
        triggers.check_trigger(t, self.add)
        if t.rule is not None:
            self.check_before_the_run(
                ("trigger", "rule"),
                t.rule,
                "a trigger rule runs before the run exists: it cannot read",
                "a rule reads event, trigger and record",
            )
        if t.record != "event":
            self.check_before_the_run(
                ("trigger", "record"),
                t.record,
                "the record identity cannot read",
                "it reads event, trigger and record",
            )
        if t.debounce is not None:
            self.check_debounce(t)
        if t.throttle is not None:
            self.check_throttle(t)
        if t.batch is not None:
            self.check_batch(t)

    def check_throttle(self, t: Trigger) -> None:
        """`throttle`: a window of at most a day, a key that reads only what a rule reads; not
        with debounce (a burst's run starts when its quiet time ends, not in a window's turn)."""
        th = t.throttle
        assert th is not None
        where = ("trigger", "throttle")
        if th.window_seconds > DEBOUNCE_MAX_WAIT_SECONDS:
            self.add("error", (*where, "period"), f"period is at most 1d; found {th.period!r}")
        if t.debounce is not None:
            self.add(
                "error",
                where,
                "throttle and debounce can't be combined yet: a debounced burst starts its run "
                "when its quiet time ends",
                at_key=True,
            )
        if th.key is not None:
            self.check_before_the_run(
                (*where, "key"),
                th.key,
                "a throttle key is read at admission, before the run exists: it cannot read",
                "it reads event, trigger and record",
            )

    def check_batch(self, t: Trigger) -> None:
        """`batch`: events of CRM or application triggers; max_wait at most a day; one run for
        many records, so `dedup: every_time` (a record's dedup would judge the batch by its last
        event's record); not with debounce or throttle (a batch's run starts when it is full or
        its max_wait ends, in neither a quiet time's nor a window's turn); a key that reads only
        what a rule reads."""
        b = t.batch
        assert b is not None
        where = ("trigger", "batch")
        if t.cron is not None or t.poll is not None:
            self.add(
                "error",
                where,
                "batch gathers events; a cron or poll trigger makes one occurrence per tick or row",
                at_key=True,
            )
        if b.max_wait_seconds > DEBOUNCE_MAX_WAIT_SECONDS:
            self.add("error", (*where, "max_wait"), f"max_wait is at most 1d; found {b.max_wait!r}")
        if t.dedup != "every_time":
            self.add(
                "error",
                where,
                f"a batch starts one run for many records: it needs `dedup: every_time` (found "
                f"{t.dedup})",
                at_key=True,
            )
        for other in ("debounce", "throttle"):
            if getattr(t, other) is not None:
                self.add(
                    "error",
                    where,
                    f"batch and {other} can't be combined: a batch's run starts when it is "
                    "full or its max_wait ends",
                    at_key=True,
                )
        if b.key is not None:
            self.check_before_the_run(
                (*where, "key"),
                b.key,
                "a batch key is read at admission, before the run exists: it cannot read",
                "it reads event, trigger and record",
            )

    def check_debounce(self, t: Trigger) -> None:
        """`debounce`: bounded durations, max_wait no shorter than period, a key that reads
        only what a rule reads; and a trigger whose events are CRM or application events (a
        cron tick or a poll hit is one occurrence per key by construction: nothing to fold)."""
        d = t.debounce
        assert d is not None
        where = ("trigger", "debounce")
        if t.cron is not None or t.poll is not None:
            self.add(
                "error",
                where,
                "debounce folds bursts of events for one record; a cron or poll trigger makes "
                "one occurrence per tick or row",
                at_key=True,
            )
        if d.period_seconds > DEBOUNCE_MAX_PERIOD_SECONDS:
            self.add("error", (*where, "period"), f"period is at most 1h; found {d.period!r}")
        if d.max_wait is not None:
            if d.max_wait_seconds < d.period_seconds:
                self.add(
                    "error",
                    (*where, "max_wait"),
                    f"max_wait ({d.max_wait}) is shorter than period ({d.period}): a burst "
                    "would always fire before its quiet time",
                )
            elif d.max_wait_seconds > DEBOUNCE_MAX_WAIT_SECONDS:
                self.add(
                    "error", (*where, "max_wait"), f"max_wait is at most 1d; found {d.max_wait!r}"
                )
        if d.key is not None:
            self.check_before_the_run(
                (*where, "key"),
                d.key,
                "a debounce key is read at admission, before the run exists: it cannot read",
                "it reads event, trigger and record",
            )

    def check_concurrency(self, d: WorkflowDefinition) -> None:
        """`concurrency`: a key that reads only what a rule reads (it is judged at admission);
        not with a trigger's debounce, batch or throttle (those start their held runs
        themselves, later, outside the slot count: not combined yet)."""
        c = d.concurrency
        assert c is not None
        self.check_before_the_run(
            ("concurrency", "key"),
            c.key,
            "a concurrency key is read at admission, before the run exists: it cannot read",
            "it reads event, trigger and record",
        )
        if d.trigger.cron is not None or d.trigger.poll is not None:
            self.add(
                "error",
                ("concurrency",),
                "concurrency holds runs admitted from events; a cron or poll trigger starts its "
                "runs on its own",
                at_key=True,
            )
        for other in ("debounce", "batch", "throttle"):
            if getattr(d.trigger, other) is not None:
                self.add(
                    "error",
                    ("concurrency",),
                    f"concurrency and the trigger's {other} can't be combined yet: a held "
                    "start would bypass the slot count",
                    at_key=True,
                )

    def check_stops(self, d: WorkflowDefinition) -> None:
        """`cancel_on` and `goal` are judged on an admitted event, as a trigger rule is: they
        read event, trigger and record, nothing of the run (shared/admission/stops.py)."""
        for j, entry in enumerate(d.cancel_on or []):
            unknown = unknown_event_type(entry.event)
            if unknown is not None:
                self.add("error", ("cancel_on", j, "event"), unknown)
            self.check_before_the_run(
                ("cancel_on", j, "when"),
                entry.when,
                "cancel_on is judged on the incoming event: it cannot read",
                "it reads event, trigger and record",
            )
        if d.goal is not None:
            self.check_before_the_run(
                ("goal",),
                d.goal,
                "a goal is judged on an admitted event about the run's record: it cannot read",
                "it reads event, trigger and record",
            )

    def check_before_the_run(self, path: PathT, text: str, cannot: str, reads: str) -> None:
        """An expression evaluated before the run exists reads only RULE_ROOTS: the first other
        variable it reads is an error, "<cannot> `<variable>` (<reads>)"."""
        compiled = self.expression(path, text)
        step_only = sorted(compiled.variables - RULE_ROOTS) if compiled is not None else []
        if step_only:
            self.add("error", path, f"{cannot} `{step_only[0]}` ({reads})")

    def check_ids(self, d: WorkflowDefinition) -> set[str]:
        ids: set[str] = set()
        for i, step in enumerate(d.steps):
            if step.id in ids:
                self.add("error", ("steps", i, "id"), f"duplicate step id {step.id!r}")
            ids.add(step.id)
        return ids

    def check_edges(self, d: WorkflowDefinition, ids: set[str]) -> bool:
        ok = True
        for i, step in enumerate(d.steps):
            for path, target in _edges(i, step):
                if target not in ids:
                    ok = False
                    self.add(
                        "error",
                        path,
                        f"edge to {target!r}, which is not a step id "
                        f"(steps: {', '.join(sorted(ids))})",
                    )
                elif target == step.id:
                    ok = False
                    self.add("error", path, f"step {step.id!r} leads to itself (a cycle)")
            if step.type == "branch":
                if not step.branches:
                    self.add(
                        "error",
                        ("steps", i, "branches"),
                        "a branch step needs at least one entry in `branches`",
                    )
                if step.next:
                    self.add(
                        "error",
                        ("steps", i, "next"),
                        "a branch step takes `branches` and `otherwise`, not `next`",
                        at_key=True,
                    )
            else:
                if step.branches:
                    self.add(
                        "error",
                        ("steps", i, "branches"),
                        f"only branch steps have `branches` (this is {step.type})",
                        at_key=True,
                    )
                if step.otherwise:
                    self.add(
                        "error",
                        ("steps", i, "otherwise"),
                        f"only branch steps have `otherwise` (this is {step.type})",
                        at_key=True,
                    )
            if step.type == "end" and step.next:
                self.add("error", ("steps", i, "next"), "an end step has no `next`", at_key=True)
        self.check_loop_bodies(d)
        return ok

    def check_loop_bodies(self, d: WorkflowDefinition) -> None:
        """A foreach body is one step, reached from its foreach only: its iterations end where
        it ends, and the foreach's `next` follows once all of them succeeded."""
        bodies = {
            s.config["do"]: i
            for i, s in enumerate(d.steps)
            if s.type == "foreach" and isinstance(s.config.get("do"), str)
        }
        for i, step in enumerate(d.steps):
            if step.id in bodies and step.successors():
                self.add(
                    "error",
                    ("steps", i),
                    f"step {step.id!r} is a foreach body: it is one step, with no `next` or "
                    "branches (the foreach's own `next` follows the loop)",
                )
            for target in step.successors():
                if target in bodies and not (
                    step.type == "foreach" and step.config.get("do") == target
                ):
                    self.add(
                        "error",
                        ("steps", i),
                        f"step {step.id!r} leads to {target!r}, a foreach body: only its "
                        "foreach may run it",
                    )

    def check_shape(self, d: WorkflowDefinition, graph: _Graph) -> None:
        cycle = graph.find_cycle()
        if cycle:
            first = cycle[0]
            self.add(
                "error",
                ("steps", graph.index[first]),
                "the steps form a cycle: " + " -> ".join([*cycle, first]) + "; a workflow is "
                "a graph without loops",
            )
            graph.acyclic = False
        reachable = graph.reachable_from(d.entry.id)
        for i, step in enumerate(d.steps):
            if step.id not in reachable:
                self.add(
                    "error",
                    ("steps", i),
                    f"step {step.id!r} is unreachable: no edge leads to it from the entry step "
                    f"{d.entry.id!r} (the first step listed)",
                )

    def check_step(self, d: WorkflowDefinition, i: int, step: Step, graph: _Graph | None) -> None:
        for path, compiled in self.check_step_config(i, step):
            for ref in sorted(compiled.step_refs):
                self.check_reference(d, step, path, ref, graph)
        self.check_compensation(d, i, step, graph)

    def check_finally(self, d: WorkflowDefinition, main_ids: set[str]) -> None:
        """The `finally:` list (shared/steps/finale.py): steps like the main ones, with ids of
        their own, leading only to one another (no cycle), no foreach (one step per row) and
        no `compensate:` (the run has ended its main phase); their expressions read the main
        steps' outputs and those of the finally steps that come before them."""
        final = d.finally_ or []
        ids: set[str] = set()
        for i, step in enumerate(final):
            if step.id in ids or step.id in main_ids:
                self.add(
                    "error",
                    ("finally", i, "id"),
                    f"duplicate step id {step.id!r} (a finally step's id is its own, "
                    "distinct from the main steps')",
                )
            ids.add(step.id)
        follows: dict[str, list[str]] = {}
        for i, step in enumerate(final):
            for path, target in _edges(i, step, section="finally"):
                if target not in ids or target == step.id:
                    self.add(
                        "error",
                        path,
                        f"edge to {target!r}: a finally step leads to another finally step "
                        f"(finally: {', '.join(sorted(ids))})",
                    )
                follows.setdefault(step.id, []).append(target)
            if step.type == "foreach":
                self.add("error", ("finally", i, "type"), "a finally step cannot be a foreach")
            if step.compensate is not None:
                self.add(
                    "error",
                    ("finally", i, "compensate"),
                    "a finally step has no `compensate:` (it runs after the run's main phase)",
                    at_key=True,
                )
        for i, step in enumerate(final):
            before = {s for s in ids if s != step.id and step.id in _reachable(s, follows)}
            for path, compiled in self.check_step_config(i, step, base=("finally", i)):
                for ref in sorted(compiled.step_refs):
                    if ref not in main_ids and ref not in before:
                        self.add(
                            "error",
                            path,
                            f"refers to step {ref!r}: a finally step reads the main steps' "
                            "outputs (missing when the step did not run: guard with has()) "
                            "and those of the finally steps that can come before it",
                        )
        if final and _cycles(final[0].id, follows):
            self.add("error", ("finally", 0, "id"), "the finally steps lead in a cycle")

    def check_compensation(
        self, d: WorkflowDefinition, i: int, step: Step, graph: _Graph | None
    ) -> None:
        """A step's `compensate:` (shared/steps/saga.py): a known action block with a config it
        accepts, reading the output of the step it undoes or of steps before it."""
        undo = step.compensation()
        if undo is None:
            return
        base: PathT = ("steps", i, "compensate")
        if registry.is_registered(undo.type) and registry.get(undo.type).kind == "flow":
            self.add(
                "error",
                (*base, "type"),
                f"{undo.type} is flow control: a compensation undoes a side effect with an "
                "action block (crm.update, http.request, …)",
            )
        for path, compiled in self.check_step_config(i, undo, base=base):
            for ref in sorted(compiled.step_refs):
                if ref != step.id:  # the undo reads what the step it undoes returned
                    self.check_reference(d, step, path, ref, graph)

    def check_step_config(
        self, i: int, step: Step, *, base: PathT | None = None
    ) -> list[tuple[PathT, CompiledExpression]]:
        """Block type, config and expressions of one step (or, under `base`, of a step's
        compensation); its compiled expressions."""
        base = ("steps", i) if base is None else base
        if not registry.is_registered(step.type):
            known = ", ".join(s.type_name for s in registry.all_specs())
            self.add("error", (*base, "type"), f"unknown block type {step.type!r} (known: {known})")
        else:
            spec = registry.get(step.type)
            try:
                spec.config_model.model_validate(step.config)
            except ValidationError as exc:
                self.model_errors(exc, (*base, "config"), skip_templates=step.config)
            if spec.config_warnings is not None:
                for where, message in spec.config_warnings(step.config):
                    self.add("warning", (*base, "config", *where), message)
        # A compensation's expressions are its config's only (it has no edges or branches).
        expressions: list[tuple[PathT, str]] = [
            ((*base, *where), src) for where, src in step_expressions(step)
        ]
        compiled_all: list[tuple[PathT, CompiledExpression]] = []
        for path, src in expressions:
            compiled = self.expression(path, src)
            if compiled is not None:
                compiled_all.append((path, compiled))
        return compiled_all

    def check_reference(
        self, d: WorkflowDefinition, step: Step, path: PathT, ref: str, graph: _Graph | None
    ) -> None:
        if ref not in {s.id for s in d.steps}:
            self.add("error", path, f"refers to step {ref!r}, which does not exist")
        elif ref == step.id:
            self.add("error", path, f"step {step.id!r} cannot read its own output")
        elif graph is not None and graph.acyclic:
            if ref not in graph.ancestors(step.id):
                self.add(
                    "error",
                    path,
                    f"refers to step {ref!r}, which cannot have run before {step.id!r} "
                    "(it is not on any path leading here)",
                )
            elif ref not in graph.dominators(step.id):
                self.add(
                    "warning",
                    path,
                    f"step {ref!r} runs on only some paths to {step.id!r}; on the others "
                    f"`steps.{ref}` is missing — guard with has(steps.{ref})",
                )

    def check_risks(self, d: WorkflowDefinition) -> None:
        for i, step in enumerate(d.steps):
            spec = registry.get(step.type) if registry.is_registered(step.type) else None
            if spec is not None and spec.creates and d.trigger.dedup == "every_time":
                self.add(
                    "warning",
                    ("steps", i, "type"),
                    f"{step.type} with dedup every_time creates a record for every event about "
                    "the same record; once_per_record or not_while_running prevent duplicates",
                )
            if step.type == "branch" and step.branches and not step.otherwise:
                self.add(
                    "warning",
                    ("steps", i),
                    "when no condition holds this path ends silently; "
                    "add `otherwise` to make it explicit",
                )
            if step.type == "approval" and step.config.get("on_timeout") == "proceed":
                self.add(
                    "warning",
                    ("steps", i, "config", "on_timeout"),
                    "on_timeout: proceed goes on as if approved when nobody decides before it "
                    "expires; the default, reject, is the safe one",
                )
            if step.type == "crm.create":
                self.check_task_create(i, step)
            if step.type == "wait_for":
                self.check_wait_listens(i, step)
            properties = step.config.get("properties")
            if step.type == "crm.update" and isinstance(properties, Mapping):
                looping = sorted(set(properties) & set(d.trigger.watch))
                if looping:
                    self.add(
                        "warning",
                        ("steps", i, "config", "properties", looping[0]),
                        f"updates watched field {looping[0]!r}: onceflow suppresses the echo of "
                        "its own write, but another workflow writing it back can loop",
                    )

    def check_task_create(self, i: int, step: Step) -> None:
        """HubSpot refuses a task without `hs_timestamp` ("Required. This field marks the
        task's due date") and shows a task on a record only through an association
        (https://developers.hubspot.com/docs/api/crm/tasks): legal here, refused or invisible
        there."""
        if str(step.config.get("object_type", "")).lower() not in ("task", "tasks"):
            return
        properties = step.config.get("properties")
        if isinstance(properties, Mapping) and "hs_timestamp" not in properties:
            self.add(
                "warning",
                ("steps", i, "config", "properties"),
                "HubSpot refuses a task without `hs_timestamp` (its due date, ISO 8601 UTC "
                'or epoch milliseconds): add e.g. hs_timestamp: "${{ event.occurred_at }}"',
            )
        if not step.config.get("associations"):
            self.add(
                "warning",
                ("steps", i, "config"),
                "a task with no `associations` shows on no record in HubSpot: associate it "
                "with the record it is about (associations: [{object_type: contacts, id: …}])",
            )

    def check_wait_listens(self, i: int, step: Step) -> None:
        """A wait hears a property change only for the fields it listens to: they are
        subscribed at the provider and watched (shared/workflows/listening.py)."""
        self.check_wait_sides(i, step)
        events = step.config.get("events")
        for j, awaited in enumerate(events if isinstance(events, list) else []):
            if isinstance(awaited, Mapping):
                self.check_awaited_event(("steps", i, "config", "events", j), awaited)
        self.check_awaited_event(("steps", i, "config"), step.config)

    def check_wait_sides(self, i: int, step: Step) -> None:
        """A correlation's `event` side is evaluated on the incoming event, before any run
        reads it: it reads what a trigger rule reads, nothing of the waiting run."""
        for path, source in wait_expressions(step.config):
            if path[-1] != "event" or path[-2] != "correlate":
                continue
            try:  # a syntax error is reported with the step's expressions
                run_only = sorted(compile_expression(source).variables - RULE_ROOTS)
            except ExpressionError:
                continue
            if run_only:
                self.add(
                    "error",
                    ("steps", i, *path),
                    f"correlate.event is evaluated on the incoming event: it cannot read "
                    f"`{run_only[0]}` (it reads event, trigger and record; the run's side is "
                    "correlate.run)",
                )

    def check_awaited_event(self, at: PathT, config: Mapping[str, Any]) -> None:
        event = config.get("event")
        if not isinstance(event, str):
            return
        unknown = unknown_event_type(event)
        if unknown is not None:
            self.add("error", (*at, "event"), unknown)
        elif event.endswith(".property_changed") and not listening.wait_fields(config):
            self.add(
                "warning",
                (*at, "when"),
                f"this wait can't tell which field of {event} it waits for: `when` reads no "
                "record field (record.<f>, event.changed_fields.<f>) and there is no `watch` "
                "list, so no provider subscription is made for it and it hears only the fields "
                "other workflows listen to; list them in `watch`",
            )

    def expression(self, path: PathT, src: str) -> CompiledExpression | None:
        try:
            return compile_expression(src)
        except ExpressionError as exc:
            self.add("error", path, str(exc))
            return None


# ---------------------------------------------------------------- graph


def _edges(i: int, step: Step, section: str = "steps") -> list[tuple[PathT, str]]:
    """A step's edges with their paths; `section`: the list it is in (`steps`, `finally`)."""
    out: list[tuple[PathT, str]] = []
    if step.next:
        out.append(((section, i, "next"), step.next))
    for j, b in enumerate(step.branches):
        out.append(((section, i, "branches", j, "next"), b.next))
    if step.otherwise:
        out.append(((section, i, "otherwise"), step.otherwise))
    for key in JUMP_KEYS:
        value = step.config.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("goto"), str):
            out.append(((section, i, "config", key, "goto"), value["goto"]))
    if step.type == "foreach" and isinstance(step.config.get("do"), str):
        out.append(((section, i, "config", "do"), step.config["do"]))
    return out


def _reachable(start: str, follows: Mapping[str, list[str]]) -> set[str]:
    """The steps reachable from `start` by its edges, `start` excluded unless on a cycle."""
    seen: set[str] = set()
    todo = list(follows.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo += follows.get(node, ())
    return seen


def _cycles(start: str, follows: Mapping[str, list[str]]) -> bool:
    """Whether the steps reachable from `start` lead back to one on the way (depth first)."""
    on_path: set[str] = set()
    done: set[str] = set()

    def visit(node: str) -> bool:
        if node in on_path:
            return True
        if node in done:
            return False
        on_path.add(node)
        found = any(visit(n) for n in follows.get(node, ()))
        on_path.discard(node)
        done.add(node)
        return found

    return visit(start)


class _Graph:
    """The step graph; only built when every edge names an existing step."""

    def __init__(self, d: WorkflowDefinition) -> None:
        self.order = [s.id for s in d.steps]
        self.index = {s.id: i for i, s in enumerate(d.steps)}
        self.succ = {s.id: list(dict.fromkeys(s.successors())) for s in d.steps}
        self.pred: dict[str, list[str]] = {s: [] for s in self.order}
        for src, targets in self.succ.items():
            for t in targets:
                self.pred[t].append(src)
        self.entry = self.order[0]
        self.acyclic = True
        self._dom: dict[str, frozenset[str]] | None = None

    def find_cycle(self) -> list[str] | None:
        state: dict[str, int] = {}  # 1 = on the stack, 2 = done
        for root in self.order:
            if root in state:
                continue
            stack: list[tuple[str, int]] = [(root, 0)]
            path: list[str] = []
            while stack:
                node, k = stack.pop()
                if k == 0:
                    state[node] = 1
                    path.append(node)
                targets = self.succ[node]
                if k < len(targets):
                    stack.append((node, k + 1))
                    nxt = targets[k]
                    if state.get(nxt) == 1:
                        return path[path.index(nxt) :]
                    if nxt not in state:
                        stack.append((nxt, 0))
                else:
                    state[node] = 2
                    path.pop()
        return None

    def reachable_from(self, start: str) -> set[str]:
        seen = {start}
        todo = [start]
        while todo:
            for t in self.succ[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return seen

    def ancestors(self, node: str) -> set[str]:
        seen: set[str] = set()
        todo = list(self.pred[node])
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(self.pred[n])
        return seen

    def dominators(self, node: str) -> frozenset[str]:
        """Steps on every path from the entry to `node` (excluding it): on an acyclic graph,
        the intersection of the predecessors' dominator sets, in topological order."""
        if self._dom is None:
            dom: dict[str, frozenset[str]] = {}
            for n in self._topological():
                preds = [p for p in self.pred[n] if p in dom]
                if n == self.entry or not preds:
                    dom[n] = frozenset({n})
                else:
                    common = frozenset.intersection(*(dom[p] for p in preds))
                    dom[n] = common | {n}
            self._dom = dom
        return self._dom.get(node, frozenset()) - {node}

    def _topological(self) -> list[str]:
        indegree = {n: len(self.pred[n]) for n in self.order}
        ready = [n for n in self.order if indegree[n] == 0]
        out: list[str] = []
        while ready:
            n = ready.pop(0)
            out.append(n)
            for t in self.succ[n]:
                indegree[t] -= 1
                if indegree[t] == 0:
                    ready.append(t)
        return out


# ---------------------------------------------------------------- small pieces


def _holds_template(config: Any, loc: tuple[Any, ...]) -> bool:
    """True when the value at `loc` (or an ancestor of it) is a `${{ … }}` string."""
    value = config
    for part in loc:
        if isinstance(value, str):
            break
        in_mapping = isinstance(value, Mapping) and part in value
        in_list = isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value)
        if not (in_mapping or in_list):
            return False
        value = value[part]
    return isinstance(value, str) and TEMPLATE.search(value) is not None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
