"""The integration port: what onceflow needs from a CRM, in onceflow's own terms.

No vendor type or error crosses this line. Adapters (shared/providers/hubspot/port.py, …) raise
`PortError` with a vendor-neutral `code` and a classification, and declare their optional
capabilities, so the engine never branches on a vendor's name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

ObjectType = Literal["contacts", "companies", "deals", "tasks", "notes"]


def plural_of(word: str) -> str:
    """An object kind's plural, as CRM APIs spell them: company -> companies, activity ->
    activities, person -> persons (Pipedrive's /api/v2/persons), deal -> deals."""
    if len(word) > 1 and word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


# onceflow's neutral object kinds, singular -> plural (a workflow may name either). Every CRM
# provider declares its own name for each (`Provider.object_kinds`: Pipedrive's contact is a
# person); events, record keys, echo markers and the port speak these, and the adapter alone
# turns them into its vendor's names (shared/providers/descriptor.py `Provider.object_kind`).
KINDS = ("contact", "company", "deal", "task", "note")
PLURAL = {kind: plural_of(kind) for kind in KINDS}
SINGULAR = {plural: singular for singular, plural in PLURAL.items()}


def neutral_object_kind(name: str) -> str | None:
    """The neutral kind (singular) `name` spells, singular or plural, any case; None if it
    spells none."""
    word = name.strip().lower()
    if word in PLURAL:
        return word
    return SINGULAR.get(word)


# Codes whose request provably never changed anything at the provider.
# `busy`: the provider said it would not act on the request now.
NOT_APPLIED_CODES = frozenset(
    {
        "connect_failed",
        "rate_limited",
        "busy",
        "unauthorized",
        "invalid_request",
        "not_found",
        "conflict",
    }
)


class PortError(Exception):
    """A classified failure from a provider.

    code: vendor-neutral (`rate_limited`, `busy`, `unavailable`, `timeout`, `connection_reset`,
    `conflict`, `not_found`, `unauthorized`, `invalid_request`, `unknown`).
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        transient: bool,
        retry_after: float | None = None,
        status: int | None = None,
        existing_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.transient = transient
        self.retry_after = retry_after
        self.status = status
        self.existing_id = existing_id


@dataclass(frozen=True)
class Record:
    object_type: str
    id: str
    properties: Mapping[str, Any]


@dataclass(frozen=True)
class Subscription:
    """One provider webhook subscription: an object type, an event kind, maybe a property."""

    object_type: str  # "contact", "deal", "company"
    event_kind: str  # "creation", "deletion", "propertyChange"
    property_name: str | None = None
    id: str | None = None  # the provider's id, when it exists there

    def key(self) -> tuple[str, str, str | None]:
        return (self.object_type, self.event_kind, self.property_name)


@dataclass(frozen=True)
class Association:
    """Link a record being created to an existing one (`to_object_type` plural, e.g.
    "contacts"). `type_id` None: the provider's default type for the pair."""

    to_object_type: str
    to_id: str
    type_id: int | None = None


@dataclass(frozen=True)
class Capabilities:
    write_idempotency: bool = False  # the provider dedupes writes by a key we send
    event_author_identity: bool = False  # events say who made the change
    subscription_management: bool = False  # subscriptions can be managed through the API


@dataclass(frozen=True)
class SearchFilter:
    property: str
    operator: str  # EQ, NEQ, GT, LT, CONTAINS_TOKEN …
    value: Any


@dataclass(frozen=True)
class SearchPage:
    records: list[Record]
    next_after: str | None  # the cursor of the next page; None on the last one


class SubscriptionApi(Protocol):
    """What the subscriptions reconcile (shared/publishing/subscriptions.py) needs of a
    provider: a CRM port, or another subscription API of the same shape (a webhooks journal's,
    shared/providers/hubspot/journal.py)."""

    @property
    def capabilities(self) -> Capabilities: ...

    def list_subscriptions(self) -> list[Subscription]: ...

    def create_subscription(self, subscription: Subscription) -> Subscription: ...

    def delete_subscription(self, subscription_id: str) -> None: ...


class CrmPort(Protocol):
    capabilities: Capabilities
    # With `capabilities.write_idempotency`: the property a create stamps its idempotency key
    # in; the provider refuses a second record with the same value and names the first.
    idempotency_property: str | None

    def create(
        self,
        object_type: str,
        properties: Mapping[str, Any],
        associations: Sequence[Association] = (),
    ) -> Record: ...

    def update(self, object_type: str, object_id: str, properties: Mapping[str, Any]) -> Record: ...

    def get(self, object_type: str, object_id: str, properties: Sequence[str] = ()) -> Record: ...

    def search(
        self, object_type: str, filters: Sequence[SearchFilter], limit: int = 10
    ) -> list[Record]: ...

    def search_page(
        self,
        object_type: str,
        filters: Sequence[SearchFilter],
        *,
        limit: int = 100,
        after: str | None = None,
        properties: Sequence[str] = (),
    ) -> SearchPage: ...

    def list_subscriptions(self) -> list[Subscription]: ...

    def create_subscription(self, subscription: Subscription) -> Subscription: ...

    def delete_subscription(self, subscription_id: str) -> None: ...


@runtime_checkable
class WebhookTargeted(Protocol):
    """A port whose subscriptions are webhooks it creates itself, each naming where to deliver
    and the credential to present there (a vendor without app-level subscriptions). The port's
    builder (shared/providers/connect.py) tells it the connection's own webhook URL and secret."""

    def target_webhooks(self, url: str, credential: str | None) -> None: ...


@dataclass
class RateLimitState:
    """What the provider's rate-limit headers said last, for throttling decisions."""

    remaining: int | None = None
    max: int | None = None
    interval_ms: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Vendor-neutral, for the portal's shared budget (shared/port/budget.py): how long the
    # short window `remaining` speaks of lasts from now, and what the daily budget has left
    # (None: the answer did not say).
    reset_seconds: float | None = None
    daily_remaining: int | None = None


def plural_object_type(object_type: str) -> str:
    kind = neutral_object_kind(object_type)
    if kind is None:
        raise PortError(
            f"unsupported object type {object_type!r}", code="invalid_request", transient=False
        )
    return PLURAL[kind]


def singular_object_type(object_type: str) -> str:
    return SINGULAR[plural_object_type(object_type)]
