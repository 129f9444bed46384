"""Provider webhook subscriptions, kept equal to what the active workflows need.

Per connection, the desired set is the union over the tenant's active versions of what they
listen to from that connection's provider — trigger events and the events their waits wait
for (shared/workflows/listening.py): `<provider>.<object>.<action>` becomes (object, provider
event kind, property) — one per needed field for property changes, since HubSpot subscribes
to property changes one property at a time. The same listeners feed the shadow records'
watched fields (`shared.accounts.connections.watched_fields` reads them from the same tables),
so what
is subscribed and what is watched cannot drift apart.

Reconcile lists what the provider has, creates what is missing and deletes what is no longer
needed (and duplicates). Every subscription of the connection's app is onceflow's: the app
exists only for onceflow. It is idempotent (a second run has nothing to do) and tolerant of
a concurrent reconcile (a create that finds the subscription already there, or a delete
that finds it already gone, counts as done). The outcome — desired set, what changed, what
failed — is recorded per connection in `subscription_reconciles`.

Subscriptions of a registered provider app (shared/accounts/provider_apps.py) belong to the app:
every portal that installs a HubSpot app gets the same ones
(https://developers.hubspot.com/docs/api/webhooks: "configured for a public app, not
individual accounts"). Reconciling them per connection made two connections of one app delete
what the other needed, so such connections are reconciled once per app (`reconcile_app`): the
desired set is the union over the tenants of the app's ACTIVE connections, applied with the
app's developer credential (the subscriptions API does not take a portal's CRM token). A
private app's webhook settings "can only be edited in the in-app settings for your private
app, and cannot currently be edited through the API": its reconcile calls nothing and records
the subscriptions the operator must create in HubSpot's UI.

A project-based app (`provider_apps.platform = 'project'`, issue 26) declares its
subscriptions in its project files, deployed by a person with the vendor's CLI; the legacy API
"can only be used with legacy public apps" (docs/vendors/hubspot-2026.md section 1). Its
reconcile calls nothing either: it records the desired set and what the project declares
short of it (`missing`, the drift), and succeeds — drift is a warning for health, activation
and validation (`project_drift`), fixed by `onceflow <provider> project` and an upload, not a
failure the hourly sweep can repair.

`reconcile_all(db, port_for_connection, port_for_app)` is what the hourly sweep duty
(`reconcile_subscriptions`) calls to repair drift.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.accounts.provider_apps import ProviderApp, get_app, record_project_declared
from shared.core import queries
from shared.core.db import Database
from shared.core.duty import Duty, SweepConfig
from shared.core.logs import get_logger
from shared.ingest import journal
from shared.port import observed
from shared.port.interface import CrmPort, PortError, Subscription, SubscriptionApi
from shared.providers import registry
from shared.workflows import listening
from shared.workflows.definition import ANY_CRM

SQL = queries.load("workflows")
ACTIVE_DEFINITIONS = SQL["workflows_active_definitions"]
CONNECTIONS = SQL["workflows_reconcile_connections"]
CONNECTION_GET = SQL["workflows_reconcile_connection_get"]
RECORD = SQL["workflows_reconcile_record"]
LAST = SQL["workflows_reconcile_last"]
APPS = SQL["workflows_app_reconcile_apps"]
APP_TENANTS = SQL["workflows_app_active_tenants"]
APP_RECORD = SQL["workflows_app_reconcile_record"]
APP_LAST = SQL["workflows_app_reconcile_last"]
TENANT_TARGETS = SQL["workflows_tenant_reconcile_targets"]

log = get_logger(__name__)

SubscriptionKey = tuple[str, str, str | None]  # (object type, event kind, property)


def _event_kinds(provider: str) -> Mapping[str, str]:
    """onceflow event actions (shared/normalize/event.py naming) -> the provider's subscription
    event kinds; empty for a provider whose subscriptions are not managed through an API."""
    found = registry.get(provider)
    return found.subscription_event_kinds if found is not None else {}


@dataclass(frozen=True)
class DesiredSubscriptions:
    keys: frozenset[SubscriptionKey]
    # Events that cannot be expressed as a subscription, with the reason (shown in the record).
    unsupported: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "subscriptions": [
                {"object_type": o, "event_kind": k, "property_name": p}
                for o, k, p in sorted(self.keys, key=_sort_key)
            ],
            "unsupported": list(self.unsupported),
        }


@dataclass(frozen=True)
class ReconcilePlan:
    create: tuple[Subscription, ...]
    delete: tuple[Subscription, ...]
    kept: int


@dataclass(frozen=True)
class ReconcileResult:
    connection_id: str
    ok: bool
    created: tuple[SubscriptionKey, ...] = ()
    deleted: tuple[SubscriptionKey, ...] = ()
    kept: int = 0
    errors: tuple[str, ...] = ()
    skipped: str | None = None
    desired: DesiredSubscriptions = field(default_factory=lambda: DesiredSubscriptions(frozenset()))
    # A project app's needed subscriptions its project files do not declare (drift).
    missing: tuple[SubscriptionKey, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "created": [list(k) for k in self.created],
            "deleted": [list(k) for k in self.deleted],
            "kept": self.kept,
            "errors": list(self.errors),
            "skipped": self.skipped,
            "missing": [list(k) for k in self.missing],
        }


def _sort_key(key: SubscriptionKey) -> tuple[str, str, str]:
    return (key[0], key[1], key[2] or "")


# ---------------------------------------------------------------- pure logic


def desired_subscriptions(
    provider: str, definitions: Iterable[Mapping[str, Any]]
) -> DesiredSubscriptions:
    """The union of what these stored definitions listen to from `provider` — their triggers
    and their waits (shared/workflows/listening.py). Events of other providers are not this
    connection's business."""
    kinds = _event_kinds(provider)
    keys: set[SubscriptionKey] = set()
    unsupported: list[str] = []
    prefix = f"{provider}."
    for listener in (x for d in definitions for x in listening.listeners(d)):
        if listener.event.startswith(f"{ANY_CRM}."):
            # Any CRM's event: this provider's part of it, when it sends that event at all.
            if not any(t.startswith(prefix) for t in registry.event_types_for(listener.event)):
                continue
        elif not listener.event.startswith(prefix):
            continue
        parsed = listener.object_and_action(provider)
        if parsed is None:
            unsupported.append(f"{listener.event}: not <provider>.<object>.<action>")
            continue
        object_type, action = parsed
        kind = kinds.get(action)
        if kind is None:
            unsupported.append(f"{listener.event}: {provider} has no subscription for {action!r}")
        elif kind == "propertyChange":
            if not listener.fields:
                unsupported.append(
                    f"{listener.event} ({listener.where}): no fields to subscribe to"
                    + (" (`watch`)" if listener.where == "trigger" else " (`watch` or `when`)")
                )
            keys.update((object_type, kind, f) for f in listener.fields)
        else:
            keys.add((object_type, kind, None))
    return DesiredSubscriptions(frozenset(keys), tuple(sorted(set(unsupported))))


def plan_reconcile(
    desired: frozenset[SubscriptionKey], existing: Iterable[Subscription]
) -> ReconcilePlan:
    """What to create and delete so the provider holds exactly `desired`, once each."""
    seen: set[SubscriptionKey] = set()
    delete: list[Subscription] = []
    for sub in sorted(existing, key=lambda s: (_sort_key(s.key()), s.id or "")):
        key = sub.key()
        if key in desired and key not in seen:
            seen.add(key)
        elif sub.id is not None:  # unneeded, or a duplicate of one already kept
            delete.append(sub)
    create = [
        Subscription(object_type=o, event_kind=k, property_name=p)
        for o, k, p in sorted(desired - seen, key=_sort_key)
    ]
    return ReconcilePlan(tuple(create), tuple(delete), kept=len(seen))


def apply_plan(
    connection_id: str, port: SubscriptionApi, desired: DesiredSubscriptions
) -> ReconcileResult:
    """List, diff and apply against the provider. Each change is tried on its own: one
    refused create does not stop the deletes, and the result says which failed."""
    if not port.capabilities.subscription_management:
        return ReconcileResult(
            connection_id, True, skipped="provider has no subscription API", desired=desired
        )
    try:
        existing = port.list_subscriptions()
    except PortError as exc:
        return ReconcileResult(
            connection_id, False, errors=(f"list subscriptions: {exc}",), desired=desired
        )
    plan = plan_reconcile(desired.keys, existing)
    created: list[SubscriptionKey] = []
    deleted: list[SubscriptionKey] = []
    errors: list[str] = []
    for sub in plan.create:
        try:
            port.create_subscription(sub)
            created.append(sub.key())
        except PortError as exc:
            if exc.code == "conflict":  # a concurrent reconcile created it first
                continue
            errors.append(f"create {_describe(sub.key())}: {exc}")
    for sub in plan.delete:
        try:
            port.delete_subscription(str(sub.id))
            deleted.append(sub.key())
        except PortError as exc:
            if exc.code == "not_found":  # already gone
                continue
            errors.append(f"delete {_describe(sub.key())}: {exc}")
    return ReconcileResult(
        connection_id,
        ok=not errors,
        created=tuple(created),
        deleted=tuple(deleted),
        kept=plan.kept,
        errors=tuple(errors),
        desired=desired,
    )


def _sorted(keys: Iterable[SubscriptionKey]) -> list[SubscriptionKey]:
    return sorted(keys, key=_sort_key)


def describe(key: SubscriptionKey) -> str:
    """One subscription as people read it: `contact.propertyChange[email]`."""
    return _describe(key)


def _describe(key: SubscriptionKey) -> str:
    return f"{key[0]}.{key[1]}" + (f"[{key[2]}]" if key[2] else "")


# ---------------------------------------------------------------- with the database


def desired_for_connection(
    db: Database, connection_id: str
) -> tuple[dict[str, Any] | None, DesiredSubscriptions]:
    with db.transaction() as tx:
        conn = tx.one(CONNECTION_GET, connection_id=connection_id)
        if conn is None:
            return None, DesiredSubscriptions(frozenset())
        rows = tx.all(ACTIVE_DEFINITIONS, tenant_id=conn["tenant_id"])
    return conn, desired_subscriptions(conn["provider"], [r["definition"] for r in rows])


def reconcile_connection(db: Database, connection_id: str, port: CrmPort) -> ReconcileResult:
    """Bring one connection's provider subscriptions in line and record the outcome. No
    transaction is held open across the provider calls."""
    conn, desired = desired_for_connection(db, connection_id)
    if conn is None:
        return ReconcileResult(connection_id, False, errors=("connection does not exist",))
    if conn["app_registered"]:
        # Never per connection: it would delete what the app's other portals need.
        return ReconcileResult(
            connection_id, True, skipped="reconciled per provider app", desired=desired
        )
    if conn["status"] != "active":
        result = ReconcileResult(
            connection_id, True, skipped=f"connection is {conn['status']}", desired=desired
        )
    else:
        result = apply_plan(connection_id, port, desired)
    record_result(db, result)
    return result


def record_result(db: Database, result: ReconcileResult) -> None:
    with db.transaction() as tx:
        tx.execute(
            RECORD,
            connection_id=result.connection_id,
            desired=json.dumps(result.desired.as_json()),
            result=json.dumps(result.as_json()),
            ok=result.ok,
        )


def last_reconcile(db: Database, connection_id: str) -> dict[str, Any] | None:
    with db.transaction() as tx:
        return tx.one(LAST, connection_id=connection_id)


# ---------------------------------------------------------------- per provider app


def desired_for_app(db: Database, app: ProviderApp) -> DesiredSubscriptions:
    """The union of what the tenants of the app's active connections need."""
    with db.transaction() as tx:
        tenants = [
            r["tenant_id"] for r in tx.all(APP_TENANTS, provider=app.provider, app_id=app.app_id)
        ]
        rows = [row for t in tenants for row in tx.all(ACTIVE_DEFINITIONS, tenant_id=t)]
    return desired_subscriptions(app.provider, [r["definition"] for r in rows])


def app_key(app: ProviderApp) -> str:
    """How an app's reconcile is named where a connection id would be."""
    return f"{app.provider}-app:{app.app_id}"


def reconcile_app(db: Database, app: ProviderApp, port: CrmPort | None) -> ReconcileResult:
    """Bring one app's subscriptions in line with the union and record the outcome. `port`
    acts with the app's developer credential; None (no credential, or a private app) records
    what the operator has to create by hand instead."""
    desired = desired_for_app(db, app)
    if app.platform == "project":
        found = registry.get(app.provider)
        hint = found.project.deploy_hint if found and found.project else "deploy the project"
        result = ReconcileResult(
            app_key(app),
            True,
            skipped="project app: its subscriptions are declared in its project files; "
            f"`onceflow {app.provider} project DIR --app {app.app_id}`, then `{hint}`",
            desired=desired,
            missing=tuple(_sorted(desired.keys - declared_of(app))),
        )
    elif app.kind == "private":
        result = ReconcileResult(
            app_key(app),
            True,
            skipped="private app: HubSpot manages its webhook subscriptions only in its UI; "
            "create the desired subscriptions there",
            desired=desired,
        )
    elif port is None:
        result = ReconcileResult(
            app_key(app),
            False,
            errors=("the app names no developer credential (developer_credential_env)",),
            desired=desired,
        )
    else:
        result = apply_plan(app_key(app), port, desired)
    record_app_result(db, app, result)
    return result


def record_app_result(db: Database, app: ProviderApp, result: ReconcileResult) -> None:
    with db.transaction() as tx:
        tx.execute(
            APP_RECORD,
            provider=app.provider,
            app_id=app.app_id,
            desired=json.dumps(result.desired.as_json()),
            result=json.dumps(result.as_json()),
            ok=result.ok,
        )


def last_app_reconcile(db: Database, provider: str, app_id: str) -> dict[str, Any] | None:
    """Ops: the app's last reconcile, with the desired set (for a private app, the list the
    operator must create in HubSpot's UI)."""
    with db.transaction() as tx:
        return tx.one(APP_LAST, provider=provider, app_id=app_id)


PortForConnection = Callable[[str], CrmPort]
PortForApp = Callable[[ProviderApp], CrmPort | None]


def reconcile_journal_app(
    db: Database, app: ProviderApp, accounts: tuple[str, ...]
) -> ReconcileResult:
    """An app whose events come from its provider's journal (shared/ingest/journal.py): the
    same desired set and plan, applied through the journal's own subscription API, per account
    that installed the app (journal subscriptions are per install). The legacy per-app webhook
    subscriptions API is not called: HubSpot says it "can only be used with legacy public
    apps" (issue 26)."""
    desired = desired_for_app(db, app)
    found = registry.get(app.provider)
    make = found.journal.subscriptions if found is not None and found.journal else None
    if make is None:
        result = ReconcileResult(
            app_key(app), True, skipped="the journal's subscriptions have no API", desired=desired
        )
    else:
        try:
            result = apply_plan(app_key(app), make(app, accounts), desired)
        except Exception as exc:  # a token or secret that can't be had: recorded, not raised
            result = ReconcileResult(app_key(app), False, errors=(f"{exc}",), desired=desired)
    record_app_result(db, app, result)
    return result


def reconcile_app_with(db: Database, app: ProviderApp, port_for_app: PortForApp) -> ReconcileResult:
    """One app, building its port first; a port that cannot be built is a recorded failure.
    An app that reads a journal is reconciled through the journal's API instead."""
    with db.transaction() as tx:
        accounts = journal.journal_accounts(tx, app)
    if accounts is not None:
        result = reconcile_journal_app(db, app, accounts)
        if not result.ok:
            log.warning(
                "journal subscription reconcile failed: %s",
                "; ".join(result.errors),
                extra={"labels": {"app": app.app_id}},
            )
        return result
    try:
        port = None if app.kind == "private" or app.platform == "project" else port_for_app(app)
    except PortError as exc:
        result = ReconcileResult(
            app_key(app), False, errors=(f"no port: {exc}",), desired=desired_for_app(db, app)
        )
        record_app_result(db, app, result)
    else:
        result = reconcile_app(db, app, port)
    if not result.ok:
        log.warning(
            "app subscription reconcile failed: %s",
            "; ".join(result.errors),
            extra={"labels": {"app": app.app_id}},
        )
    return result


def reconcile_connection_with(
    db: Database, connection_id: str, port_for_connection: PortForConnection
) -> ReconcileResult:
    """One connection, building its port first; a port that cannot be built is a recorded
    failure."""
    try:
        port = port_for_connection(connection_id)
    except PortError as exc:
        _, desired = desired_for_connection(db, connection_id)
        result = ReconcileResult(connection_id, False, errors=(f"no port: {exc}",), desired=desired)
        record_result(db, result)
    else:
        result = reconcile_connection(db, connection_id, port)
    observed.flush(db)  # what the port's calls observed (shared/port/observed.py)
    if not result.ok:
        log.warning(
            "subscription reconcile failed: %s",
            "; ".join(result.errors),
            extra={"labels": {"connection_id": connection_id}},
        )
    return result


def reconcile_apps(db: Database, port_for_app: PortForApp) -> list[ReconcileResult]:
    with db.transaction() as tx:
        apps = [get_app(tx, r["provider"], r["app_id"]) for r in tx.all(APPS)]
    return [reconcile_app_with(db, app, port_for_app) for app in apps if app is not None]


def reconcile_all(
    db: Database,
    port_for_connection: PortForConnection,
    port_for_app: PortForApp | None = None,
) -> list[ReconcileResult]:
    """Reconcile every registered app, then every active connection not of one (the hourly
    sweep). A connection or app whose port cannot be built (missing secret, unknown provider)
    is recorded as failed; the others go on."""
    results: list[ReconcileResult] = []
    if port_for_app is not None:
        results.extend(reconcile_apps(db, port_for_app))
    with db.transaction() as tx:
        connections = tx.all(CONNECTIONS)
    results.extend(
        reconcile_connection_with(db, conn["id"], port_for_connection) for conn in connections
    )
    return results


def reconcile_subscriptions(db: Database) -> dict[str, int]:
    """The hourly sweep duty: `reconcile_all` with the ports the deployment builds."""
    from shared.providers.connect import port_for, port_for_app

    results = reconcile_all(db, lambda connection_id: port_for(db, connection_id), port_for_app)
    return {"connections": len(results), "failed": sum(1 for r in results if not r.ok)}


def sweep_duties(config: SweepConfig) -> tuple[Duty, ...]:
    return (Duty("reconcile_subscriptions", 3600.0, reconcile_subscriptions),)


def reconcile_tenant(
    db: Database,
    tenant_id: str,
    port_for_connection: PortForConnection,
    port_for_app: PortForApp,
) -> list[ReconcileResult]:
    """What activating or deactivating one of the tenant's workflows changes, reconciled at
    once: each of the tenant's connections, or the app it belongs to (whose union includes
    the other tenants of the app). The hourly sweep repairs whatever this misses."""
    with db.transaction() as tx:
        targets = tx.all(TENANT_TARGETS, tenant_id=tenant_id)
        apps = {
            (r["provider"], r["app_id"]): get_app(tx, r["provider"], r["app_id"])
            for r in targets
            if r["app_id"] is not None
        }
    results = [reconcile_app_with(db, app, port_for_app) for app in apps.values() if app]
    results.extend(
        reconcile_connection_with(db, r["id"], port_for_connection)
        for r in targets
        if r["app_id"] is None
    )
    return results


# ---------------------------------------------------------------- project apps: drift


def keys_as_json(keys: Iterable[SubscriptionKey]) -> dict[str, Any]:
    """A set of subscriptions as `provider_apps.project_declared` stores it."""
    return DesiredSubscriptions(frozenset(keys)).as_json()


def keys_of_json(document: Mapping[str, Any] | None) -> frozenset[SubscriptionKey]:
    """The inverse of `keys_as_json` (entries it can't read are skipped)."""
    found: set[SubscriptionKey] = set()
    entries = document.get("subscriptions") if isinstance(document, Mapping) else None
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, Mapping) and isinstance(e.get("object_type"), str):
            prop = e.get("property_name")
            found.add(
                (
                    e["object_type"],
                    str(e.get("event_kind")),
                    prop if isinstance(prop, str) else None,
                )
            )
    return frozenset(found)


def declared_of(app: ProviderApp) -> frozenset[SubscriptionKey]:
    """What the app's project files declared when `onceflow <provider> project` last wrote
    them (nothing when never written)."""
    return keys_of_json(app.project_declared)


def record_project_declaration(
    db: Database, provider: str, app_id: str, keys: Iterable[SubscriptionKey]
) -> bool:
    """Keep what the project files declare, as read back after writing them; False when the
    app is not a registered project app (nothing kept)."""
    with db.transaction() as tx:
        return record_project_declared(tx, provider, app_id, keys_as_json(keys))


@dataclass(frozen=True)
class Drift:
    """An active workflow needs subscriptions the project app's deployed files don't declare."""

    provider: str
    app_id: str
    missing: tuple[SubscriptionKey, ...]
    never_written: bool  # no declaration recorded at all

    def message(self) -> str:
        found = registry.get(self.provider)
        hint = found.project.deploy_hint if found and found.project else "deploy the project"
        shown = ", ".join(_describe(k) for k in self.missing[:10])
        more = f" and {len(self.missing) - 10} more" if len(self.missing) > 10 else ""
        why = (
            "no project files were written for it yet"
            if self.never_written
            else "its project files do not declare"
        )
        return (
            f"{self.provider} app {self.app_id}: active workflows need subscriptions the"
            f" deployed project lacks ({why}): {shown}{more}; run `onceflow {self.provider}"
            f" project DIR --app {self.app_id}` and `{hint}`"
        )


def project_drift(
    db: Database,
    tenant_id: str | None,
    extra_definitions: Iterable[Mapping[str, Any]] = (),
) -> list[Drift]:
    """Per project app: what active workflows need that its project does not declare. For a
    tenant, only what the tenant's own workflows need (plus `extra_definitions`, one being
    validated or activated) from the project apps it has active connections of — another
    tenant's needs are not its business; for an operator (None), the app's whole union."""
    extra = list(extra_definitions)
    drifts: list[Drift] = []
    with db.transaction() as tx:
        if tenant_id is None:
            rows = tx.all(APPS)
        else:
            rows = [r for r in tx.all(TENANT_TARGETS, tenant_id=tenant_id) if r["app_id"]]
        apps = {(r["provider"], r["app_id"]): get_app(tx, r["provider"], r["app_id"]) for r in rows}
        # An app that reads a journal declares no webhook components: its subscriptions are
        # made per install through the journal's API ("don't work with the feature component
        # functionality", docs/vendors/hubspot-2026.md 2.1) by `reconcile_journal_app`.
        apps = {
            key: app
            for key, app in apps.items()
            if app is not None and journal.journal_accounts(tx, app) is None
        }
        definitions = (
            [r["definition"] for r in tx.all(ACTIVE_DEFINITIONS, tenant_id=tenant_id)]
            if tenant_id is not None
            else []
        )
    for app in apps.values():
        if app is None or app.platform != "project":
            continue
        union = desired_for_app(db, app).keys if tenant_id is None else frozenset()
        needed = union | desired_subscriptions(app.provider, [*definitions, *extra]).keys
        missing = needed - declared_of(app)
        if missing:
            drifts.append(
                Drift(
                    app.provider, app.app_id, tuple(_sorted(missing)), app.project_declared is None
                )
            )
    return drifts
