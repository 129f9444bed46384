"""The health view: "is the machinery running?", in one call.

For an admin: every scheduled job's last attempt and its status (read from Cloud Scheduler),
the age of the oldest unfinished work per queue, dead-letter counts and the sweep's duties.
For everyone, scoped to their tenant: each connection's credentials and its last call to the
provider. Machinery details are admin-only because they describe every tenant's traffic.

The Cloud Scheduler client is created lazily and only when the deployment configures it
(`GOOGLE_CLOUD_PROJECT` and `SCHEDULER_LOCATION`, set by infra/functions.tf): its constructor
looks for Google credentials, which local and test runs don't have, so there the scheduler part
says "scheduler status unavailable locally" and the rest is answered from Postgres as usual.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from shared.core.db import Database
from shared.core.deployables import DEPLOYABLES
from shared.core.logs import get_logger
from shared.core.settings import named_secret, settings_from
from shared.ingest import journal
from shared.ops.auth import Principal
from shared.ops.models import (
    BacklogHealth,
    ConnectionHealth,
    DeadLetterHealth,
    HealthReport,
    MachineryHealth,
    ScheduledJobHealth,
    SchedulerHealth,
    SweepDutyHealth,
    WaitingClaim,
)
from shared.ops.statements import CONNECTION_HEALTH, SWEEP_DUTIES
from shared.providers.install import waiting_claims
from shared.publishing.subscriptions import project_drift
from shared.sweep.backlog import read_backlog, read_dead_letters

if TYPE_CHECKING:
    from google.cloud.scheduler_v1 import CloudSchedulerClient, Job


# Cloud Scheduler job names: one per scheduled function, named as infra/scheduler.tf names them.
SCHEDULED_JOBS = tuple(d.name.replace("_", "-") for d in DEPLOYABLES if d.trigger == "schedule")
UNAVAILABLE_LOCALLY = "scheduler status unavailable locally"
SCHEDULER_TIMEOUT_SECONDS = 5.0

# A scheduled function runs every minute: no attempt for this long means its job is not firing.
STALE_ATTEMPT_SECONDS = 300.0
# Beyond these, "problems" says the queue looks stuck (the alerts have their own thresholds).
BACKLOG_PROBLEM_SECONDS = 300.0

log = get_logger(__name__)

SchedulerRead = Callable[[], SchedulerHealth]

_client: CloudSchedulerClient | None = None
_client_lock = threading.Lock()


def _scheduler_client() -> CloudSchedulerClient:
    global _client  # noqa: PLW0603 - one client per instance, created on first use
    with _client_lock:
        if _client is None:
            from google.cloud.scheduler_v1 import CloudSchedulerClient

            _client = CloudSchedulerClient()
        return _client


def job_health(name: str, job: Job) -> ScheduledJobHealth:
    """One job as the health view shows it (pure: a Job in, a model out)."""
    status: str | None = None
    if job.last_attempt_time is not None:
        status = "ok" if job.status.code == 0 else f"error {job.status.code}: {job.status.message}"
    return ScheduledJobHealth(
        name=name,
        state=job.state.name if job.state else None,
        last_attempt_at=job.last_attempt_time,
        next_attempt_at=job.schedule_time,
        last_status=status,
    )


def read_scheduler(env: Mapping[str, str] | None = None) -> SchedulerHealth:
    """Every onceflow job's last attempt, or why it can't be known."""
    s = settings_from(env)
    project, location = s.google_cloud_project, s.scheduler_location
    if not project or not location:
        return SchedulerHealth(available=False, detail=UNAVAILABLE_LOCALLY, jobs=[])
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError

    try:
        client = _scheduler_client()
    except GoogleAuthError as exc:
        return SchedulerHealth(available=False, detail=f"no credentials: {exc}", jobs=[])
    jobs = []
    for name in SCHEDULED_JOBS:
        path = f"projects/{project}/locations/{location}/jobs/{name}"
        try:
            job = client.get_job(name=path, timeout=SCHEDULER_TIMEOUT_SECONDS)
        except (GoogleAPIError, GoogleAuthError) as exc:
            log.warning("health: cannot read scheduler job %s: %s", name, exc)
            jobs.append(
                ScheduledJobHealth(
                    name=name,
                    state=None,
                    last_attempt_at=None,
                    next_attempt_at=None,
                    last_status=None,
                    error=str(exc)[:500],
                )
            )
            continue
        jobs.append(job_health(name, job))
    return SchedulerHealth(available=True, detail=None, jobs=jobs)


def _connection(row: Mapping[str, Any]) -> ConnectionHealth:
    errors = row["last_reconcile_errors"]
    oauth = row["credential_kind"] == "oauth"
    variable = row["oauth_kek_env"] if oauth else row["api_credentials_env"]
    return ConnectionHealth(
        connection_id=row["connection_id"],
        tenant_id=row["tenant_id"],
        provider=row["provider"],
        status=row["status"],
        credentials=row["credential_kind"],
        credentials_configured=bool(variable and named_secret(variable)),
        oauth_refreshed_at=row["oauth_refreshed_at"],
        last_call_at=row["last_call_at"],
        last_call_ok=row["last_call_ok"],
        last_call_error=row["last_call_error"],
        last_reconcile_ok=row["last_reconcile_ok"],
        last_reconciled_at=row["last_reconciled_at"],
        last_reconcile_errors=[str(e) for e in errors or []],
    )


def _scheduler_problems(scheduler: SchedulerHealth) -> list[str]:
    found: list[str] = []
    now = datetime.now(UTC)
    for job in scheduler.jobs:
        if job.error:
            found.append(f"scheduler job {job.name} cannot be read: {job.error}")
        elif job.state not in (None, "ENABLED"):
            found.append(f"scheduler job {job.name} is {job.state}")
        elif job.last_attempt_at is None or (
            (now - job.last_attempt_at).total_seconds() > STALE_ATTEMPT_SECONDS
        ):
            found.append(f"scheduler job {job.name} has not run in the last 5 minutes")
        elif job.last_status != "ok":
            found.append(f"scheduler job {job.name} last failed: {job.last_status}")
    return found


def _problems(machinery: MachineryHealth | None, connections: list[ConnectionHealth]) -> list[str]:
    found: list[str] = []
    if machinery is not None:
        found.extend(_scheduler_problems(machinery.scheduler))
        b = machinery.backlog
        for what, age in (
            ("inbox row waiting to be drained", b.inbox_oldest_seconds),
            ("outbox row waiting to be published", b.outbox_oldest_seconds),
            ("pending step waiting to be claimed", b.steps_oldest_pending_seconds),
        ):
            if age > BACKLOG_PROBLEM_SECONDS:
                found.append(f"the oldest {what} is {age:.0f} s old")
        d = machinery.dead_letters
        if d.dead_inbox_rows:
            found.append(f"{d.dead_inbox_rows} inbox rows are dead")
        if d.undelivered_events:
            found.append(f"{d.undelivered_events} trigger events were given up as undelivered")
        if d.poisoned_messages_24h:
            found.append(f"{d.poisoned_messages_24h} poisoned messages in the last 24 hours")
        found.extend(
            f"sweep duty {s.name} failed: {s.last_error}"
            for s in machinery.sweep_duties
            if s.last_ok is False
        )
    for c in connections:
        if c.status != "active":
            continue
        if not c.credentials_configured:
            found.append(
                f"connection {c.connection_id}: the key that seals its OAuth grant is not set"
                if c.credentials == "oauth"
                else f"connection {c.connection_id} has no credentials configured"
            )
        if c.last_call_ok is False:
            found.append(
                f"connection {c.connection_id}: its last call to the provider failed"
                f" ({c.last_call_error})"
            )
        elif c.last_reconcile_ok is False:
            found.append(f"connection {c.connection_id}: the last call to its provider failed")
    return found


def health_report(
    db: Database,
    principal: Principal,
    *,
    scheduler: SchedulerRead = read_scheduler,
) -> HealthReport:
    machinery: MachineryHealth | None = None
    gaps: list[dict[str, Any]] = []
    with db.transaction() as tx:
        rows = tx.all(CONNECTION_HEALTH, tenant_id=principal.tenant_id)
        if principal.is_admin:
            backlog = read_backlog(tx)
            dead = read_dead_letters(tx)
            duties = tx.all(SWEEP_DUTIES)
            gaps = journal.recent_gaps(tx)
            waiting = waiting_claims(tx)
    connections = [_connection(r) for r in rows]
    if principal.is_admin:
        machinery = MachineryHealth(
            scheduler=scheduler(),
            backlog=BacklogHealth.model_validate(backlog, from_attributes=True),
            dead_letters=DeadLetterHealth.model_validate(dead, from_attributes=True),
            sweep_duties=[SweepDutyHealth.model_validate(d) for d in duties],
        )
    problems = _problems(machinery, connections)
    if principal.is_admin:
        # A provider journal the reader was away from longer than it keeps entries
        # (shared/ingest/journal.py): events may be lost there; support looks at the gap rows.
        problems.extend(
            f"{g['provider']} app {g['app_id']} journal {g['journal']}: gap detected at"
            f" {g['detected_at']:%Y-%m-%d %H:%M} UTC — {g['detail']}"
            for g in gaps
        )
    return HealthReport(
        checked_at=datetime.now(UTC),
        problems=[
            *problems,
            # Drift is a person's to fix (write the project files, upload them): a problem
            # to show, where the hourly reconcile of a legacy app would have repaired it.
            *(d.message() for d in project_drift(db, principal.tenant_id)),
        ],
        machinery=machinery,
        connections=connections,
        waiting_claims=(
            [WaitingClaim.model_validate(w) for w in waiting] if principal.is_admin else []
        ),
    )
