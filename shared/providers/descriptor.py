"""What a provider is to onceflow: the `Provider` descriptor every vendor folder declares.

Shaped like `TriggerKind` (shared/triggers/__init__.py): a frozen dataclass of callables and
declared values, so the engine asks the registry (shared/providers/registry.py) what a provider
does instead of branching on its name. A provider is a webhook scheme first (`verify`, and
`normalize` for the events its bodies become); the optional parts say what else it offers:

- `crm`: a CRM API behind the port (shared/port/interface.py), built per connection;
- `app`: one webhook URL per app for every account that installed it, and how an event names
  its account and app (shared/accounts/provider_apps.py routes by them);
- `oauth`: the install flow's vendor half (authorize URL, code exchange, token's account,
  refresh) for shared/providers/install.py and shared/providers/connect.py;
- `subscription_event_kinds`: onceflow's event actions as the vendor's subscription event
  kinds, for the subscriptions reconcile (shared/publishing/subscriptions.py);
- `journal`: an app's events kept by the vendor in a journal read by offset, a pull source
  beside (or instead of) webhooks (shared/ingest/journal.py reads it);
- `project`: an app built as files the vendor's own CLI deploys (a HubSpot project-based app),
  which `onceflow <provider> project DIR` writes and updates (shared/ops/cli.py);
- `object_kinds`: its own name for each of onceflow's neutral object kinds (contact, company,
  deal, task, note: shared/port/interface.py `KINDS`), which makes it a CRM whose events
  `crm.<kind>.<action>` triggers hear (shared/providers/registry.py `event_types_for`).

Adding a provider is a folder under shared/providers/ that builds one `Provider`, and its line
in the registry.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from shared.accounts.oauth_tokens import Grant, Refresher
from shared.accounts.provider_apps import ProviderApp
from shared.normalize.event import NormalizedEvent
from shared.port.interface import (
    KINDS,
    Capabilities,
    CrmPort,
    SubscriptionApi,
    neutral_object_kind,
    plural_of,
)

TOLERANCE_SECONDS = 300  # how far a signed timestamp may be from now, either way


@dataclass(frozen=True)
class Verdict:
    ok: bool
    check: str  # which check decided: "hubspot_v3", "timestamp_stale", "signature_missing", …

    @staticmethod
    def accept(check: str) -> Verdict:
        return Verdict(True, check)

    @staticmethod
    def refuse(check: str) -> Verdict:
        return Verdict(False, check)


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A request header by name, whatever its case."""
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value
    return None


def same(a: str | bytes, b: str | bytes) -> bool:
    """Constant-time equality of secret-derived values (`hmac.compare_digest`)."""
    a_bytes = a.encode() if isinstance(a, str) else a
    b_bytes = b.encode() if isinstance(b, str) else b
    return hmac.compare_digest(a_bytes, b_bytes)


@dataclass(frozen=True)
class SignedRequest:
    """What a signature check may look at: the request as the provider sent it."""

    method: str
    uri: str  # the full URI the provider called (shared/ingest/receive.py `public_uri`)
    body: bytes
    headers: Mapping[str, str]
    now: float
    signature_versions: tuple[str, ...] = ("v3",)  # the connection's or app's opt-ins


Verify = Callable[[str, SignedRequest], Verdict]  # (secret, request) -> verdict
Normalize = Callable[[bytes, Mapping[str, str]], list[NormalizedEvent]]
TokenSource = Callable[[str | None], str]  # rejected token (or None) in, live token out


class PortFactory(Protocol):
    """Builds a provider's CRM port: with a portal `token`, a `token_source` (OAuth), or only a
    `developer_api_key` (an app's subscriptions)."""

    def __call__(
        self,
        token: str | None,
        *,
        base_url: str | None = None,
        app_id: str | None = None,
        developer_api_key: str | None = None,
        idempotency_property: str | None = None,
        token_source: TokenSource | None = None,
    ) -> CrmPort: ...


@dataclass(frozen=True)
class RecordPages:
    """Where people see a record in the vendor's own UI: support pastes those addresses into
    search (shared/ops/search.py), and the ops page links back to them."""

    site: str  # the UI's host as people know it, for messages ("app.example.com")
    page_shape: str  # a record page's path, for messages ("/records/<account>/<id>")
    owns: Callable[[str], bool]  # a URL's hostname -> whether it is this vendor's UI
    # A URL path on that host -> (account id, object type, object id); None: not a record page.
    locate: Callable[[str], tuple[str, str, str] | None]
    # (account id, object type, object id) -> the record's page; None: no page for that type.
    url: Callable[[str, str, str], str | None]


@dataclass(frozen=True)
class Crm:
    port: PortFactory
    capabilities: Capabilities  # declared: what every port of this provider offers at least
    # The port's subscription API is the app's (one set per app), reached with the app's
    # developer credential rather than a portal's token.
    app_subscriptions: bool = False
    # Per object type (singular), the properties that name a record (shared/port/
    # record_labels.py): what the ops page shows beside a record key.
    label_properties: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    record_pages: RecordPages | None = None
    # The static credentials its API takes in `connections.api_credentials_env`
    # (shared/accounts/connections.py CREDENTIAL_KINDS): "token", and maybe "service_key".
    credential_kinds: tuple[str, ...] = ("token",)
    # Its port's `rate_limit` reads the portal's shared budget from the vendor's rate-limit
    # headers after every call (`RateLimitState.remaining`/`reset_seconds`/`daily_remaining`,
    # parsed in the vendor folder), so the connection's window narrows to what the portal has
    # left and a 429 shrinks it (shared/port/budget.py, the one place that narrows).
    rate_budget: bool = False


@dataclass(frozen=True)
class TokenAccount:
    account_id: str  # the provider account (portal) a token acts for
    app_id: str | None


@dataclass(frozen=True)
class OAuth:
    authorize_url: Callable[..., str]  # client_id, redirect_uri, scopes, state, base
    # raises CodeRefused (shared/accounts/token_endpoint.py), PortError
    exchange_code: Callable[..., Grant]
    token_account: Callable[..., TokenAccount]  # access token, client_id, client_secret, base_url
    refresher: Callable[..., Refresher]  # client_id, client_secret, base_url


@dataclass(frozen=True)
class AppWebhooks:
    """A provider whose app has one webhook URL for every account that installed it."""

    # (account id, app id) an event names; None where it names none.
    event_account: Callable[[NormalizedEvent], tuple[str | None, str | None]]
    # The environment variable a deployed function finds an app's secret in (infra/).
    secret_env: Callable[[str, str], str]


# The headers an inbox row read from a journal carries (its offset, and which journal: "global"
# or an account id), so the provider's `normalize` knows the body is a journal entry's file.
# Never a provider's own header: the webhook path keeps only the headers providers declare.
JOURNAL_OFFSET_HEADER = "x-onceflow-journal-offset"
JOURNAL_NAME_HEADER = "x-onceflow-journal"


@dataclass(frozen=True)
class JournalEntry:
    """One entry of a journal: its offset and its file exactly as downloaded (kept raw in the
    inbox: the drain normalizes it like a webhook body)."""

    offset: str
    body: bytes


@dataclass(frozen=True)
class JournalEnd:
    """Nothing after the offset (yet)."""


@dataclass(frozen=True)
class OffsetGone:
    """The offset asked after is no longer kept (older than the journal's retention, or never
    existed): entries may have been lost between it and the earliest one still kept."""

    detail: str


JournalRead = JournalEntry | JournalEnd | OffsetGone


@dataclass(frozen=True)
class Journal:
    """A vendor journal of an app's events, read by offset (a pull source)."""

    # (app, journal — "global" or an account id —, offset or None for the earliest entry) ->
    # the entry after it; raises PortError (transient: try again next pass).
    next_entry: Callable[[ProviderApp, str, str | None], JournalRead]
    # How long the vendor keeps entries: a reader away longer has a gap.
    retention_seconds: int
    # (app, the accounts that installed it) -> the journal's subscription API, which the
    # subscriptions reconcile keeps equal to what the active workflows need; None: the
    # journal's subscriptions are not managed through an API.
    subscriptions: Callable[[ProviderApp, tuple[str, ...]], SubscriptionApi] | None = None


# (object type, provider event kind, property): one webhook subscription, as
# shared/publishing/subscriptions.py computes them and shared/port/interface.py `Subscription.key`.
SubscriptionKey = tuple[str, str, str | None]


@dataclass(frozen=True)
class ProjectSpec:
    """What onceflow asks of an app's project files: its OAuth client (scopes, where the
    install comes back) and its webhooks (where they go, which subscriptions)."""

    app_id: str
    name: str  # the app's name for a new project; an existing one keeps its own
    scopes: tuple[str, ...]
    redirect_urls: tuple[str, ...]
    target_url: str | None  # None: keep the one the files hold
    subscriptions: frozenset[SubscriptionKey]


@dataclass(frozen=True)
class AppProject:
    """An app whose configuration and webhook subscriptions are files deployed with the
    vendor's CLI, not settings an API changes."""

    # Writes or updates the project under the directory, keeping what a person added there;
    # returns the subscriptions the files declare afterwards (read back from them).
    write: Callable[[Path, ProjectSpec], frozenset[SubscriptionKey]]
    # The subscriptions the project under the directory declares.
    read_declared: Callable[[Path], frozenset[SubscriptionKey]]
    deploy_hint: str  # what a person runs after writing, e.g. the vendor CLI's upload command


@dataclass(frozen=True)
class Provider:
    name: str  # as stored in connections.provider and in event types (`<name>.<object>.…`)
    title: str  # as people write it, for messages
    verify: Verify
    # How late the provider can still deliver an event after it occurred, through its own
    # retries (echo markers are kept this long: shared/ingest/echo.py, DESIGN invariant 17).
    redelivery_horizon_seconds: int
    normalize: Normalize | None = None  # None: its requests address webhook triggers only
    # Every event type its webhooks can become, when they form a closed set.
    event_types: Callable[[], frozenset[str]] | None = None
    kept_headers: tuple[str, ...] = ()  # request headers its normalizer or a person needs later
    hidden_headers: tuple[str, ...] = ()  # credentials and signatures: never kept nor shown
    # A generic webhook scheme rather than a vendor: a webhook trigger may be signed with it.
    generic: bool = False
    crm: Crm | None = None
    app: AppWebhooks | None = None
    oauth: OAuth | None = None
    subscription_event_kinds: Mapping[str, str] = field(default_factory=dict)
    journal: Journal | None = None
    project: AppProject | None = None
    # The `author_source` its events carry for a change made through its API, when they name
    # who made each change (`Capabilities.event_author_identity`) and a connection's writes
    # act as one user (`connections.provider_user_id`): an event from another source or user
    # is then not onceflow's echo, whatever the markers say (shared/ingest/echo.py
    # `authored_elsewhere`). None: the echo-marker rule decides alone.
    api_author_source: str | None = None
    # Its own (singular) name for each neutral object kind it has: {"contact": "person"}. A
    # workflow may name a kind either way (`object_kind`); its events are normalized to the
    # neutral kind (registry.normalize), and its adapter turns the neutral kind the port is
    # given back into its own name (`own_object_kind`). Declared here, not on `Crm`: its
    # webhooks name records whether or not onceflow can call its API.
    object_kinds: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.object_kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"{self.name}: object_kinds maps no neutral kind {sorted(unknown)}")

    def object_kind(self, name: str) -> str | None:
        """The neutral kind (singular) `name` means on this provider: a neutral kind, or its
        own name of one, singular or plural, any case (`person`, `Organizations`); None when
        it is neither."""
        kind = neutral_object_kind(name)
        if kind is not None:
            return kind
        word = name.strip().lower()
        for neutral, own in self.object_kinds.items():
            if word in (own, plural_of(own)):
                return neutral
        return None

    def own_object_kind(self, name: str) -> str | None:
        """Its own (singular) name for the kind `name` means (`object_kind`): contact ->
        person; None when `name` means no kind it has."""
        kind = self.object_kind(name)
        return None if kind is None else self.object_kinds.get(kind)
