"""Every environment setting the deployed code reads, in one typed object read once per process.

`settings()` parses `os.environ` on first use and returns the same frozen `Settings` after that:
Cloud Run fixes a revision's environment when an instance starts, so there is nothing to re-read,
and a bad value fails at the first use with the variable's name (`SettingError`) instead of deep
inside the request that happened to read it. Each field carries its variable's name, its default
and the line the README's configuration reference shows (`make config-reference` writes that
table from here; tests/test_settings.py fails when the README differs).

The environment is read only here: tests/test_settings.py fails when another module of
`shared/` or `functions/` touches `os.environ`. Two kinds of variable can't be fields:
- variables whose *names* are data (a connection row names its webhook secret's variable, a
  provider app its client secret's, a grant the key it was sealed with): `named_secret(name)`
  reads them at the moment of use, because the set of names is open and a deployment adds one by
  adding a secret and a row, never a line of code;
- variables read by libraries, not by onceflow (`LIBRARY_VARIABLES`, documented only).

Tests: `settings.cache_clear()` forgets the parsed object, so the next `settings()` reads the
environment again. tests/conftest.py does it at the start of every test and after every
MonkeyPatch `setenv`, `delenv` and `undo`, so a test sets a variable the ordinary way; a
subprocess (a crash test's functions-framework process) reads the environment it was started
with.
`Settings.from_env(mapping)` parses a given mapping instead (the `from_env(env)` helpers of
`SweepConfig`, `SessionLimits` and friends take one).

Naming: there is no one scheme, and the names can't change (infra/*.tf, the local stack,
cloudbuild.yaml and users' deployments set them). What holds: libpq's own names for libpq's
settings (`PG*`, `DATABASE_URL`), Google's for Google's (`GOOGLE_CLOUD_PROJECT`, `GCP_PROJECT`),
`DB_*` for the pool and Cloud SQL, `<FUNCTION>_BUDGET_SECONDS` for a scheduled function's time
budget, `WEBHOOK_*` for the webhook's request handling, and `ONCEFLOW_*` for everything added
since (steps, sweep, retention, ops, links, OAuth). Durations end in their unit (`_SECONDS`,
`_MS`, `_DAYS`).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from shared.core.errors import PermanentError


class SettingError(PermanentError, ValueError):
    """An environment variable holds a value onceflow can't use; the message names it."""


@dataclass(frozen=True)
class Form:
    """How a variable's text becomes its value (`parse(name, raw)`, raw never empty), and what
    the README says it accepts."""

    says: str
    parse: Callable[[str, str], Any]


@dataclass(frozen=True)
class Setting:
    """What the README says about one field: its variable, what it does, what it accepts."""

    env: str
    description: str
    form: Form
    secret: bool = False


TEXT = Form("", lambda name, raw: raw)


def _whole(minimum: int, unit: str = "") -> Form:
    what = f"a whole number of at least {minimum}{f' ({unit})' if unit else ''}"

    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise SettingError(f"{name} must be {what}, not {raw!r}")
        return value

    return Form(f"A whole number ≥ {minimum}.", parse)


def _seconds(*, positive: bool = False) -> Form:
    bound = "above 0" if positive else "at least 0"

    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if value < 0 or (positive and value == 0) or math.isnan(value):
            raise SettingError(f"{name} must be a number of seconds {bound}, not {raw!r}")
        return value

    return Form(f"Seconds, {bound}.", parse)


def _flag(name: str, raw: str) -> bool:
    # Only "1" arms these (test switches, a loosened SSRF guard): "true" or "yes" meaning on in
    # one place and off in another is how a switch gets set by mistake.
    if raw not in ("0", "1"):
        raise SettingError(f"{name} must be 1 or 0, not {raw!r}")
    return raw == "1"


FLAG = Form("`1` or `0`.", _flag)
_OFF = ("off", "0", "false", "no")
_ON = ("thread", "on", "1", "true", "yes")


def _switch(name: str, raw: str) -> bool:
    if raw.lower() in _OFF:
        return False
    if raw.lower() in _ON:
        return True
    raise SettingError(f"{name} must be one of {', '.join(_ON + _OFF)}, not {raw!r}")


SWITCH = Form(
    f"On: {', '.join(f'`{w}`' for w in _ON)}; off: {', '.join(f'`{w}`' for w in _OFF)}.", _switch
)
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(name: str, raw: str) -> str:
    level = raw.upper()
    if level not in logging.getLevelNamesMapping():
        raise SettingError(f"{name} must be a logging level ({', '.join(_LEVELS)}), not {raw!r}")
    return level


LOG_LEVEL = Form(f"{', '.join(f'`{n}`' for n in _LEVELS)} (any case).", _log_level)
_IP_TYPES = ("private", "public", "psc")


def _ip_type(name: str, raw: str) -> str:
    if raw.lower() not in _IP_TYPES:
        raise SettingError(f"{name} must be private, public or psc, not {raw!r}")
    return raw.lower()


IP_TYPE = Form("`private`, `public` or `psc`.", _ip_type)


def _absolute_url(name: str, raw: str) -> str:
    if not raw.startswith(("http://", "https://")):
        raise SettingError(f"{name} must be an absolute http(s) URL, not {raw!r}")
    return raw


ABSOLUTE_URL = Form("An absolute `http(s)://` URL.", _absolute_url)
_TRACING = ("off", "gcp", "console")


def _tracing(name: str, raw: str) -> str:
    if raw.lower() not in _TRACING:
        raise SettingError(f"{name} must be one of {', '.join(_TRACING)}, not {raw!r}")
    return raw.lower()


TRACING = Form("`off`, `gcp` or `console`.", _tracing)


def _fraction(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise SettingError(f"{name} must be a number from 0 to 1, not {raw!r}")
    return value


FRACTION = Form("A number from 0 to 1.", _fraction)


def _setting(
    env: str, default: Any, description: str, form: Form = TEXT, *, secret: bool = False
) -> Any:
    return field(
        default=default,
        repr=not secret,
        metadata={"setting": Setting(env, description, form, secret)},
    )


@dataclass(frozen=True)
class Settings:
    """One deployment's settings. An unset or empty variable leaves the default."""

    # --- the database --------------------------------------------------------------------
    database_url: str | None = _setting(
        "DATABASE_URL",
        None,
        "`postgresql://user:pass@host:port/db` (a `?host=/dir` query selects a unix socket)."
        " Used locally and in tests.",
        secret=True,
    )
    pg_host: str = _setting("PGHOST", "127.0.0.1", "Used when `DATABASE_URL` is not set.")
    pg_port: int = _setting("PGPORT", 5432, "Used when `DATABASE_URL` is not set.", _whole(1))
    pg_user: str = _setting("PGUSER", "postgres", "Used when `DATABASE_URL` is not set.")
    pg_password: str | None = _setting(
        "PGPASSWORD", None, "Used when `DATABASE_URL` is not set.", secret=True
    )
    pg_database: str = _setting("PGDATABASE", "onceflow", "Used when `DATABASE_URL` is not set.")
    instance_connection_name: str | None = _setting(
        "INSTANCE_CONNECTION_NAME",
        None,
        "`project:region:instance`. When set, connections go through"
        " cloud-sql-python-connector (IAM auth, lazy refresh) instead of `DATABASE_URL`.",
    )
    db_iam_user: str | None = _setting(
        "DB_IAM_USER",
        None,
        "The IAM database user (service account email without `.gserviceaccount.com`)."
        " Cloud SQL only; required with `INSTANCE_CONNECTION_NAME`.",
    )
    db_name: str = _setting("DB_NAME", "onceflow", "Database name. Cloud SQL only.")
    db_ip_type: str = _setting("DB_IP_TYPE", "private", "Cloud SQL IP type.", IP_TYPE)
    # shared.core.db.pool_size_for(1); tests/test_settings.py holds the two equal.
    db_pool_size: int = _setting(
        "DB_POOL_SIZE",
        2,
        "Connections per instance (`infra/` and the local stack set the function's request"
        " concurrency + 1); `infra/` checks instances x pool stays under the server's"
        " limit. Every request takes one connection at a time, never two (the pool refuses a"
        " thread's second checkout: hold-and-wait would deadlock it), so any size is safe; a"
        " size below the process's concurrent requests only makes them queue for up to 30 s.",
        _whole(1),
    )
    db_statement_timeout_ms: int = _setting(
        "DB_STATEMENT_TIMEOUT_MS",
        30_000,
        "`statement_timeout` of every pooled connection; 0 turns it off. An expired statement"
        " is a transient error (retried, or the message redelivered).",
        _whole(0, "milliseconds"),
    )
    db_lock_timeout_ms: int = _setting(
        "DB_LOCK_TIMEOUT_MS",
        10_000,
        "`lock_timeout` (row, table and advisory locks); transient when it fires.",
        _whole(0, "milliseconds"),
    )
    db_idle_in_transaction_timeout_ms: int = _setting(
        "DB_IDLE_IN_TRANSACTION_TIMEOUT_MS",
        60_000,
        "`idle_in_transaction_session_timeout`: a process frozen inside a transaction (a"
        " throttled instance, a debugger) loses its session and its locks instead of holding"
        " them.",
        _whole(0, "milliseconds"),
    )

    # --- Google Cloud and logs -----------------------------------------------------------
    google_cloud_project: str | None = _setting(
        "GOOGLE_CLOUD_PROJECT",
        None,
        "Project for Pub/Sub topics (`onceflow-local` when unset), Cloud Scheduler health, log"
        " trace ids, the ops page's links to Cloud Logging, and the Vertex AI project of a"
        " tenant that names none (`ai.generate`).",
    )
    gcp_project: str | None = _setting(
        "GCP_PROJECT",
        None,
        "Read for trace ids and log links when `GOOGLE_CLOUD_PROJECT` is not set (older runtimes"
        " set this one).",
    )
    scheduler_location: str | None = _setting(
        "SCHEDULER_LOCATION",
        None,
        "The region of the Cloud Scheduler jobs, for the ops health report (with"
        " `GOOGLE_CLOUD_PROJECT`); unset, the report says the schedule can't be read.",
    )
    log_level: str = _setting("LOG_LEVEL", "INFO", "Level of the JSON logs.", LOG_LEVEL)
    tracing: str = _setting(
        "ONCEFLOW_TRACING",
        "off",
        "OpenTelemetry spans and metrics (shared/core/tracing.py): `gcp` exports to Cloud Trace"
        " and Cloud Monitoring, `console` prints them to stdout; `off` loads no SDK at all.",
        TRACING,
    )
    tracing_sample_ratio: float = _setting(
        "ONCEFLOW_TRACING_SAMPLE_RATIO",
        1.0,
        "Share of events traced when tracing is on, decided once at the webhook (or wherever the"
        " trace starts) and kept by every later hop through the stored `traceparent`.",
        FRACTION,
    )

    # --- the webhook and the fast path ---------------------------------------------------
    public_base_url: str | None = _setting(
        "PUBLIC_BASE_URL",
        None,
        "The public URL prefix of the webhook function (e.g."
        " `https://hooks.example.com/webhook`), used to rebuild the URI HubSpot signed. Without"
        " it, `X-Forwarded-Proto` and `Host` are used.",
        ABSOLUTE_URL,
    )
    webhook_max_body_bytes: int = _setting(
        "WEBHOOK_MAX_BODY_BYTES",
        1024 * 1024,
        "Webhook body size cap (413 above it). The other request limits, but the deadline below,"
        " are fixed; see the security section.",
        _whole(1),
    )
    request_deadline_seconds: float = _setting(
        "REQUEST_DEADLINE_SECONDS",
        10.0,
        "How long a request's head (locally, `HeadDeadlineWorker`) and then its whole body may"
        " take to arrive before the connection is cut (408 for a body): a stalled client holds"
        " a thread at most this long.",
        _seconds(positive=True),
    )
    webhook_nudge: bool = _setting(
        "WEBHOOK_NUDGE",
        True,
        "On, a drain+publish pass runs in a thread after each stored webhook (the fast path);"
        " off leaves that to the schedule.",
        SWITCH,
    )
    nudge_budget_seconds: float = _setting(
        "NUDGE_BUDGET_SECONDS", 5.0, "Time budget of one fast-path pass.", _seconds()
    )
    drain_budget_seconds: float = _setting(
        "DRAIN_BUDGET_SECONDS",
        50.0,
        "Upper bound of one scheduled `drain_inbox` invocation: it drains until nothing is"
        " claimable and ends (an idle tick takes one query), or stops here with a backlog.",
        _seconds(),
    )
    publish_budget_seconds: float = _setting(
        "PUBLISH_BUDGET_SECONDS",
        50.0,
        "Upper bound of one scheduled `publish_outbox` invocation: it publishes until nothing"
        " is claimable and ends (an idle tick takes one query), or stops here with a backlog.",
        _seconds(),
    )
    sweep_budget_seconds: float = _setting(
        "SWEEP_BUDGET_SECONDS",
        50.0,
        "Upper bound of one `sweep` invocation: it passes while work is due and ends when"
        " nothing comes due before this (an idle tick is one pass).",
        _seconds(),
    )

    # --- steps ---------------------------------------------------------------------------
    step_lease_seconds: float = _setting(
        "ONCEFLOW_STEP_LEASE_SECONDS",
        600.0,
        "How long a claimed step is held. Longer than `advance_step`'s 300 s timeout, so a"
        " healthy attempt never loses its step; a crashed one is reclaimed by the sweep after"
        " it.",
        _seconds(positive=True),
    )
    step_heartbeat_seconds: float = _setting(
        "ONCEFLOW_STEP_HEARTBEAT_SECONDS",
        60.0,
        "How often a running block renews its lease (fenced on the lease id); below the lease.",
        _seconds(positive=True),
    )
    enable_crash_points: bool = _setting(
        "ONCEFLOW_ENABLE_CRASH_POINTS",
        False,
        "Test-only: `1`, with `ONCEFLOW_CRASH_POINTS`, arms the crash points. Never set in"
        " `infra/`.",
        FLAG,
    )
    crash_points: str = _setting(
        "ONCEFLOW_CRASH_POINTS",
        "",
        "Test-only: where to kill the process on the step path (`after_claim,"
        "before_settle_commit`, `name:N`; `shared/core/crashpoints.py`). Never set in"
        " `infra/`.",
    )

    # --- the sweep -----------------------------------------------------------------------
    sweep_batch: int = _setting(
        "ONCEFLOW_SWEEP_BATCH",
        500,
        "Rows per sweep job per pass (reclaims, wake-ups, re-dispatches).",
        _whole(1),
    )
    redispatch_after_seconds: float = _setting(
        "ONCEFLOW_REDISPATCH_AFTER_SECONDS",
        120.0,
        "A pending step dispatched longer ago than this is published again (its message was"
        " evidently lost; the claim is conditional, so a duplicate is harmless).",
        _seconds(),
    )
    redeliver_events_after_seconds: float = _setting(
        "ONCEFLOW_REDELIVER_EVENTS_AFTER_SECONDS",
        120.0,
        "A published trigger event that admission has not decided this long after its publish"
        " goes back into the outbox and is published again.",
        _seconds(),
    )
    max_event_redeliveries: int = _setting(
        "ONCEFLOW_MAX_EVENT_REDELIVERIES",
        5,
        "After this many re-publishes an undecided event is given up as undelivered (explained"
        " by ops, re-queued with `POST /v1/events/{id}/requeue`).",
        _whole(1),
    )
    sweep_poll_seconds: float = _setting(
        "ONCEFLOW_SWEEP_POLL_SECONDS",
        2.0,
        "Shortest pause between two sweep passes without a backlog (the sweep sleeps until"
        " the next due row, at least this).",
        _seconds(),
    )
    lease_history_days: int = _setting(
        "ONCEFLOW_LEASE_HISTORY_DAYS",
        30,
        "How long the per-attempt lease history of a step (`leases` in the ops run detail) is"
        " kept after its run finished; an hourly sweep duty deletes older history. Runs and"
        " their step journals are kept longer (`ONCEFLOW_RUN_RETENTION_DAYS`).",
        _whole(1, "days"),
    )
    drop_retention_days: int = _setting(
        "ONCEFLOW_DROP_RETENTION_DAYS",
        14,
        "How long a property change the drain turned into no event (not watched, unchanged,"
        " out of order, re-announced) is kept per record, with its field values, for the"
        " record's timeline (\"why didn't it run?\"); an hourly sweep duty deletes older rows.",
        _whole(1, "days"),
    )
    run_retention_days: int = _setting(
        "ONCEFLOW_RUN_RETENTION_DAYS",
        90,
        "Days a live run is kept after it finished (with its steps, parks and lease history);"
        " a lineage goes only when every run of it is this old. Below 60, replays of old"
        " lineages may find them gone.",
        _whole(1, "days"),
    )
    decision_retention_days: int = _setting(
        "ONCEFLOW_DECISION_RETENTION_DAYS",
        90,
        "Days a trigger event is kept after admission decided it, with its delivery claims and"
        " refusals, once no run, park, live webhook-trigger key, poll record or newest cron"
        " tick names it.",
        _whole(1, "days"),
    )
    inbox_retention_days: int = _setting(
        "ONCEFLOW_INBOX_RETENTION_DAYS",
        30,
        "Days a processed inbox row (the raw webhook delivery) is kept; its events keep their"
        " payload. Keep it well above a provider's retry window.",
        _whole(1, "days"),
    )
    rehearsal_retention_days: int = _setting(
        "ONCEFLOW_REHEARSAL_RETENTION_DAYS",
        7,
        "Days a rehearsal run is kept after it finished, with everything it wrote.",
        _whole(1, "days"),
    )
    retention_batch: int = _setting(
        "ONCEFLOW_RETENTION_BATCH",
        500,
        "Runs (or events, or inbox rows) per retention batch, one transaction each.",
        _whole(1),
    )
    cron_grace_seconds: float = _setting(
        "ONCEFLOW_CRON_GRACE_SECONDS",
        300.0,
        "How late a cron tick may still fire without `catch_up`; a tick later than this (the"
        " sweep was not running) is recorded as missed instead.",
        _seconds(),
    )

    # --- ops, links, installs, outbound calls --------------------------------------------
    ops_bootstrap_secret: str | None = _setting(
        "ONCEFLOW_OPS_BOOTSTRAP_SECRET",
        None,
        "The secret (at least 32 characters; Secret Manager in the cloud) that `onceflow"
        " bootstrap` sends to mint a deployment's first admin token, once ever. Unset: no"
        " bootstrap.",
        secret=True,
    )
    approval_link_secret: str | None = _setting(
        "ONCEFLOW_APPROVAL_LINK_SECRET",
        None,
        "The HMAC key (at least 16 characters; Secret Manager in the cloud) that signs approval"
        " links (`POST /v1/approvals/{id}/links`): a link lets one user an approval names decide"
        " it at `/ui/decide/…` without an ops token, until the approval expires. Unset: no link"
        " can be made or used.",
        secret=True,
    )
    public_url: str | None = _setting(
        "ONCEFLOW_PUBLIC_URL",
        None,
        "The public URL of the `webhook` function, where approval links are opened (`infra/`"
        " sets it to the webhook's base, the local stack to its webhook process). Unset: a link"
        " is answered as a path to append to the ops URL.",
    )
    slack_api_url: str = _setting(
        "ONCEFLOW_SLACK_API_URL",
        "https://slack.com/api",
        "The Slack Web API base the approval messages are posted to (`chat.postMessage`,"
        " `chat.update`); the local stack and the tests point it at devstack/fakeslack.",
    )
    oauth_redirect_url: str | None = _setting(
        "ONCEFLOW_OAUTH_REDIRECT_URL",
        None,
        "The redirect URI an app install sends HubSpot, the public URL of the `webhook`"
        " function plus `/oauth/hubspot/callback` (where that function serves the callback)."
        " Not a secret; `infra/` sets it to `hubspot_oauth_redirect_url`, the local stack to its"
        " webhook process. Unset (or not an absolute URL ending in the callback path): installs"
        " are refused with `409 not_configured`. An app's own callback, where installs that"
        " start at HubSpot come back, is this URL plus `/<app id>`.",
    )
    http_allow_loopback: bool = _setting(
        "ONCEFLOW_HTTP_ALLOW_LOOPBACK",
        False,
        "`1` lets the `http.request` block and the circuit breaker's `notify_url` call"
        " 127.0.0.1 (local stack and tests only; never set in `infra/`).",
        FLAG,
    )

    vertex_base_url: str | None = _setting(
        "ONCEFLOW_VERTEX_BASE_URL",
        None,
        "Where the `ai.generate` block sends Vertex AI calls instead of Google's endpoint: the"
        " local stack's and the tests' fake (`devstack/fakevertex`), called with a static"
        " token, so nothing reaches Google. Unset (production): Google's endpoint, as the"
        " function's service account.",
        ABSOLUTE_URL,
    )

    # --- the `onceflow` command ----------------------------------------------------------
    ops_url: str | None = _setting(
        "ONCEFLOW_OPS_URL", None, "The `onceflow` command's ops function URL (`--url`)."
    )
    ops_token: str | None = _setting(
        "ONCEFLOW_OPS_TOKEN",
        None,
        "The `onceflow` command's ops token, sent as `Authorization: Bearer` (`--token`).",
        secret=True,
    )
    id_token: str | None = _setting(
        "ONCEFLOW_ID_TOKEN",
        None,
        "A Google identity token for a deployed function's IAM check, sent as"
        " `X-Serverless-Authorization: Bearer` (`--id-token`).",
        secret=True,
    )

    def __post_init__(self) -> None:
        if not self.step_heartbeat_seconds < self.step_lease_seconds:
            raise SettingError(
                f"ONCEFLOW_STEP_HEARTBEAT_SECONDS ({self.step_heartbeat_seconds:g}) must be below"
                f" ONCEFLOW_STEP_LEASE_SECONDS ({self.step_lease_seconds:g})"
            )
        if self.instance_connection_name and not self.db_iam_user:
            raise SettingError("INSTANCE_CONNECTION_NAME is set but DB_IAM_USER is not")

    @property
    def project(self) -> str | None:
        """The Google Cloud project, wherever the runtime put its name."""
        return self.google_cloud_project or self.gcp_project

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """The settings `env` holds; SettingError naming the first variable that is wrong."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            spec: Setting = f.metadata["setting"]
            raw = env.get(spec.env, "")
            if raw:  # unset and empty alike leave the default
                values[f.name] = spec.form.parse(spec.env, raw)
        return cls(**values)


# The defaults, for the modules whose own config objects start from them.
DEFAULTS = Settings()


def described() -> list[tuple[str, Setting, Any]]:
    """(field name, its Setting, its default) for every setting, in declaration order."""
    return [(f.name, f.metadata["setting"], f.default) for f in fields(Settings)]


@functools.cache
def settings() -> Settings:
    """This process's settings, parsed from the environment on first use (see the module
    docstring for `settings.cache_clear()`)."""
    return Settings.from_env(os.environ)


def settings_from(env: Mapping[str, str] | None) -> Settings:
    """`env` parsed when given (tests, tools), this process's settings otherwise."""
    return settings() if env is None else Settings.from_env(env)


def named_secret(name: str) -> str | None:
    """The value of a variable whose name a row holds (a connection's webhook secret, an app's
    client secret, a grant's key, a tenant's signing key), read now; None when unset or empty.
    Never cached: the names are data, not a list this module could parse up front, and a test
    that sets one in its process has it read at the next use."""
    return os.environ.get(name) or None


@dataclass(frozen=True)
class Documented:
    """A README row for variables that are not `Settings` fields."""

    variable: str
    default: str
    description: str


# Read by the code through `named_secret`, under names that rows hold.
NAMED_SECRETS: tuple[Documented, ...] = (
    Documented(
        "`ONCEFLOW_TOKEN_KEK`",
        "—",
        "The key (32 bytes, base64; Secret Manager in the cloud, `onceflow-token-kek`) that"
        " seals OAuth tokens at rest (`shared/accounts/oauth_tokens.py`): `webhook` seals a"
        " grant at an install's callback, `advance_step`, `sweep` and `ops` refresh them; a"
        " stored grant names the variable it was sealed under.",
    ),
    Documented(
        "`HUBSPOT_APP_<appId>_CLIENT_SECRET`, `_CLIENT_ID`, `_DEVELOPER_KEY`",
        "—",
        "A HubSpot app's secrets as `infra/` hands them out (`hubspot_apps`; each only to the"
        " functions that read it, `shared/accounts/provider_apps.py` `APP_SECRET_READERS`); a"
        " `provider_apps` row names the variables.",
    ),
    Documented(
        "*named by a connection row*",
        "—",
        "`connections.webhook_secret_env` and `api_credentials_env` name the variables holding"
        " each connection's webhook secret and its API token or service key (its"
        " `credential_kind`; Secret Manager in the cloud). A"
        " tenant's `signing_secret_env` names the HMAC key for outbound `http.request`"
        " signatures.",
    ),
)

# Read by Google's libraries, not by onceflow.
LIBRARY_VARIABLES: tuple[Documented, ...] = (
    Documented(
        "`PUBSUB_EMULATOR_HOST`",
        "—",
        "`host:port` of the Pub/Sub emulator; set by the local stack.",
    ),
    Documented(
        "`NO_GCE_CHECK`",
        "—",
        "`true` stops Google auth libraries from probing the metadata server (set it"
        " everywhere off GCP).",
    ),
)
