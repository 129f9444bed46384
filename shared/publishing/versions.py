"""Immutable workflow versions and the trigger bindings of the active one.

publish: validate, then store the definition keyed by the SHA-256 of its canonical JSON (the
  validated model with defaults filled in, keys sorted): identical content — even written with
  other formatting, comments or key order — returns the version already stored. Nothing
  invalid is ever stored; the database also refuses any UPDATE of a version.
activate: in one transaction, point the workflow at a version and replace its bindings with one
  row per event type that version listens to (its trigger kind says which: shared/triggers/),
  so matching an event is one index lookup.
  Runs already started keep the version they started with (`workflow_runs.version_id`); only
  admissions after the commit see the new bindings.
deactivate: remove the activation and the bindings; in-flight runs continue on their version.

Every function takes the caller's `Tx`, so the ops API can write its audit row in the same
transaction.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime

from shared import triggers
from shared.core import queries
from shared.core.db import Tx
from shared.core.errors import PermanentError
from shared.publishing.validate import (
    DefinitionInvalid,
    Problem,
    ValidationReport,
    validate_text,
)
from shared.workflows.definition import WorkflowDefinition

SQL = queries.load("workflows")
TENANT_EXISTS = SQL["workflows_tenant_exists"]
UPSERT_LOCKED = SQL["workflows_upsert_locked"]
LOCK_FOR_TENANT = SQL["workflows_lock_for_tenant"]
VERSION_BY_HASH = SQL["workflows_version_by_hash"]
VERSION_INSERT = SQL["workflows_version_insert"]
VERSION_GET = SQL["workflows_version_get"]
VERSIONS_LIST = SQL["workflows_versions_list"]
ACTIVATION_UPSERT = SQL["workflows_activation_upsert"]
ACTIVATION_DELETE = SQL["workflows_activation_delete"]
ACTIVE_VERSION = SQL["workflows_active_version"]
BINDINGS_DELETE = SQL["workflows_bindings_delete"]
BINDINGS_INSERT = SQL["workflows_bindings_insert"]
BINDINGS_FOR_EVENT = SQL["workflows_bindings_for_event"]


class WorkflowNotFound(PermanentError, LookupError):
    """No such workflow for this tenant (another tenant's workflow is not found either)."""

    code = "workflow_not_found"


class VersionNotFound(PermanentError, LookupError):
    """No such version of this workflow."""

    code = "version_not_found"


@dataclass(frozen=True)
class PublishedVersion:
    workflow_id: str
    version_id: str
    number: int
    content_hash: str
    created: bool  # False when identical content was already published
    report: ValidationReport  # warnings worth showing the author


@dataclass(frozen=True)
class VersionInfo:
    id: str
    number: int
    content_hash: str
    created_at: datetime
    active: bool


@dataclass(frozen=True)
class Activation:
    workflow_id: str
    version_id: str
    event_types: tuple[str, ...]
    previous_version_id: str | None


@dataclass(frozen=True)
class Binding:
    workflow_id: str
    version_id: str
    dedup_mode: str


def canonical_json(definition: WorkflowDefinition) -> str:
    return json.dumps(
        definition.model_dump(mode="json"),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def content_hash(definition: WorkflowDefinition) -> str:
    return hashlib.sha256(canonical_json(definition).encode("utf-8")).hexdigest()


def publish(
    tx: Tx, source_text: str, *, tenant_id: str | None = None, filename: str = "<input>"
) -> PublishedVersion:
    """Validate and store a version; raises `DefinitionInvalid` (nothing stored) on errors.

    `tenant_id`, when given, is the caller's tenant: a definition naming another is refused.
    """
    report = validate_text(source_text, filename)
    if not report.ok or report.definition is None:
        raise DefinitionInvalid(report)
    definition = report.definition
    if tenant_id is not None and definition.tenant != tenant_id:
        raise _refused(report, f"this definition is for tenant {definition.tenant!r}, not yours")
    if not tx.scalar(TENANT_EXISTS, tenant_id=definition.tenant):
        raise _refused(report, f"tenant {definition.tenant!r} does not exist")
    digest = content_hash(definition)
    workflow_id = str(tx.scalar(UPSERT_LOCKED, tenant_id=definition.tenant, name=definition.name))
    existing = tx.one(VERSION_BY_HASH, workflow_id=workflow_id, content_hash=digest)
    if existing is not None:
        return PublishedVersion(
            workflow_id, existing["id"], int(existing["number"]), digest, False, report
        )
    row = tx.one(
        VERSION_INSERT,
        workflow_id=workflow_id,
        content_hash=digest,
        definition=canonical_json(definition),
        source_text=source_text,
    )
    assert row is not None
    return PublishedVersion(workflow_id, row["id"], int(row["number"]), digest, True, report)


def _refused(report: ValidationReport, message: str) -> DefinitionInvalid:
    problem = Problem("error", ("tenant",), message, report.file)
    return DefinitionInvalid(
        ValidationReport(report.file, (problem, *report.problems), definition=None)
    )


def load_version(tx: Tx, version_id: str) -> WorkflowDefinition:
    """The definition a run pinned to `version_id` executes."""
    row = tx.one(VERSION_GET, version_id=version_id)
    if row is None:
        raise VersionNotFound(version_id)
    return WorkflowDefinition.model_validate(row["definition"])


def active_definition(tx: Tx, workflow_id: str) -> WorkflowDefinition | None:
    """The definition of the workflow's active version, or None when it is not active."""
    version_id = tx.scalar(ACTIVE_VERSION, workflow_id=workflow_id)
    return None if version_id is None else load_version(tx, str(version_id))


def list_versions(tx: Tx, workflow_id: str) -> list[VersionInfo]:
    return [
        VersionInfo(r["id"], int(r["number"]), r["content_hash"], r["created_at"], r["active"])
        for r in tx.all(VERSIONS_LIST, workflow_id=workflow_id)
    ]


def activate(tx: Tx, *, tenant_id: str, workflow_id: str, version_id: str) -> Activation:
    """Make `version_id` the active version and rebind its triggers (one transaction: the
    caller's). The workflow row lock serializes concurrent activations of one workflow."""
    if tx.one(LOCK_FOR_TENANT, workflow_id=workflow_id, tenant_id=tenant_id) is None:
        raise WorkflowNotFound(workflow_id)
    row = tx.one(VERSION_GET, version_id=version_id)
    if row is None or row["workflow_id"] != workflow_id:
        raise VersionNotFound(version_id)
    definition = WorkflowDefinition.model_validate(row["definition"])
    kind = triggers.kind_of(definition.trigger)
    problems = kind.check_activation(tx, definition.trigger, tenant_id)
    if problems:
        raise DefinitionInvalid(
            ValidationReport(
                "<activation>",
                tuple(
                    Problem("error", path, message, "<activation>") for path, message in problems
                ),
            )
        )
    previous = tx.scalar(ACTIVE_VERSION, workflow_id=workflow_id)
    event_types = triggers.binding_event_types(definition.trigger, workflow_id)
    tx.execute(ACTIVATION_UPSERT, workflow_id=workflow_id, version_id=version_id)
    tx.execute(BINDINGS_DELETE, workflow_id=workflow_id)
    tx.execute(
        BINDINGS_INSERT,
        tenant_id=tenant_id,
        workflow_id=workflow_id,
        version_id=version_id,
        dedup_mode=definition.trigger.dedup,
        event_types=list(event_types),
    )
    return Activation(workflow_id, version_id, event_types, previous)


def deactivate(tx: Tx, *, tenant_id: str, workflow_id: str) -> str | None:
    """Remove the activation and bindings; the version that was active, or None."""
    if tx.one(LOCK_FOR_TENANT, workflow_id=workflow_id, tenant_id=tenant_id) is None:
        raise WorkflowNotFound(workflow_id)
    previous = tx.scalar(ACTIVE_VERSION, workflow_id=workflow_id)
    tx.execute(BINDINGS_DELETE, workflow_id=workflow_id)
    tx.execute(ACTIVATION_DELETE, workflow_id=workflow_id)
    return None if previous is None else str(previous)


def bindings_for_event(tx: Tx, *, tenant_id: str, event_type: str) -> list[Binding]:
    """Which workflows (and which versions) listen to this event: one index range scan."""
    return [
        Binding(r["workflow_id"], r["version_id"], r["dedup_mode"])
        for r in tx.all(BINDINGS_FOR_EVENT, tenant_id=tenant_id, event_type=event_type)
    ]
