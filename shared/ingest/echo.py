"""Echo markers: recognising the webhook a write of onceflow's own causes.

When a workflow's `crm.update` sets `lifecyclestage = "customer"` on a contact, the provider
answers with a `contact.property_changed` webhook for that very change. Without a marker, a
workflow triggered by that property would start again — a loop. So the CRM block records one
marker per written field (`record_echo_marker`), committed BEFORE the request leaves (the
webhook may arrive before the response does), and admission refuses an event whose changed
fields are ALL explained by live markers for that record (`is_echo` → `echo_suppressed`).

Decisions:
- Object types are SINGULAR (`contact`, `deal`), the same as `workflow_trigger_events.
  record_object_type`; a marker under `contacts` would never match.
- Values are compared by `value_hash`, a SHA-256 of a canonical string form. Providers report
  property values as strings (HubSpot's `propertyValue` is always one), so the canonical form
  is what a provider would send back: a string as is, None as "", booleans as "true"/"false"
  (Python's str() would give "True", which no provider echoes), integral floats without ".0",
  other numbers by str(), lists and objects as compact sorted JSON.
- Markers are NOT consumed by a match: they expire. One write can come back several times
  (HubSpot sends one webhook per changed property, retries deliveries, and several bindings
  check the same event), and consuming would make the check a write that concurrent
  admissions contend on. The price: within the TTL, a person setting the field back to the
  exact value onceflow wrote (after changing it to something else in between) is taken for an
  echo. The TTL is short (crm.update's default is 10 minutes) to keep that window small.
- A marker can explain a change only if the change happened after onceflow's write was sent
  (`sent_at`, give or take `ECHO_CLOCK_SKEW_SECONDS` between the provider's clock and the
  database's) and before the marker expired, both judged at the event's `occurred_at` (the
  provider's time of the change). So a rep who set `lifecyclestage=customer` a minute before a
  workflow wrote the same value keeps their trigger, and a backlog at admission doesn't let an
  echo through. One SQL definition (`echo_markers_alive`, migration 0101) serves admission's
  context statement and `check_echo`.
- Expired markers are deleted only after a grace, by the sweep calling `expire_echo_markers`
  here (the one expiry statement): an event that occurred while its marker was alive but is
  admitted late is still recognised. Invariant 17: the grace must outlast the longest time an
  event can take from occurrence to admission, which is two legs: the provider's own retries
  of a failed delivery (`REDELIVERY_HORIZON_SECONDS` in shared/providers/registry.py, per
  provider:
  HubSpot retries for about 34 hours), then onceflow's path from inbox to admission (Pub/Sub
  backoff, a publisher backlog, the sweep's re-publish until it gives an undecided event up as
  undelivered; `ENGINE_ADMISSION_SECONDS`, checked against shared/core/duty.py's `SweepConfig`
  by a test).
  `expiry_grace_seconds` adds them; the marker's `keep_until` is fixed from its connection's
  provider when it is written. A longer grace costs only rows: whether a marker matches is
  judged by `expires_at` at the change's time, never by whether it still exists.
- `crm.create` records markers for the properties it set once the response names the record
  (HubSpot sends a propertyChange per property set at creation). Their `sent_at` is the step's
  at-most-once mark, set just before the request left. The webhook can in principle be
  admitted in the milliseconds between the response and the marker's commit; the path from
  webhook to admission (inbox, drain, outbox, Pub/Sub) takes far longer, and this is said in
  the README.
- An event with no changed fields (a creation, a deletion) is never an echo: a marker
  describes field values.
- The author, first, where the provider says who made each change and which source its API
  writes carry (`Provider.api_author_source`) and the connection knows the user its writes act
  as (`connections.provider_user_id`): a change from another source or by another user is not
  an echo, whatever the markers say (`authored_elsewhere`). That keeps a person's edit in the
  provider's UI that sets the value onceflow just wrote, which the markers alone would take
  for an echo. The author can only rule an echo out: the same user's other API integrations
  write with the same author (Pipedrive: `change_source: api` and the token's user), so an
  event by onceflow's own author still needs its markers (the rule above) to be refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.duty import Duty, SweepConfig
from shared.providers import registry
from shared.providers.registry import REDELIVERY_HORIZON_SECONDS

SQL = queries.load("echo")
INSERT = SQL["echo_markers_insert"]
FOR_CHANGE = SQL["echo_markers_for_change"]
EXPIRE = SQL["echo_markers_expire"]

DEFAULT_TTL_SECONDS = 600
# The longest time onceflow itself takes from a delivery's arrival to its admission (see the
# module docstring); the provider's redelivery horizon comes on top.
ENGINE_ADMISSION_SECONDS = 3600
# How far the provider's clock (occurredAt) may run behind the database's (sent_at) and still
# match: a change stamped up to this long before our write was sent is taken for its echo.
ECHO_CLOCK_SKEW_SECONDS = 5
EXPIRE_BATCH = 5000


def expiry_grace_seconds(provider: str) -> int:
    """How long after expiry a marker of a `provider` connection is kept: the provider's
    longest redelivery plus onceflow's own slowest admission (module docstring)."""
    return REDELIVERY_HORIZON_SECONDS[provider] + ENGINE_ADMISSION_SECONDS


_GRACE_PROVIDERS = list(REDELIVERY_HORIZON_SECONDS)
_GRACE_SECONDS = [float(expiry_grace_seconds(p)) for p in _GRACE_PROVIDERS]
_MAX_GRACE_SECONDS = max(_GRACE_SECONDS)


def canonical_value(value: Any) -> str:
    """The string a provider would report for `value` (see the module docstring)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def value_hash(value: Any) -> bytes:
    return hashlib.sha256(canonical_value(value).encode()).digest()


def record_echo_marker(
    tx: Tx,
    *,
    connection_id: str,
    object_type: str,
    object_id: str,
    fields: Mapping[str, Any],
    step_id: str | None,
    ttl_seconds: int = DEFAULT_TTL_SECONDS,
    since_side_effect_mark: bool = False,
    at_commit: bool = False,
) -> int:
    """Record that onceflow writes `fields` on one record; the markers written (with
    `at_commit`: the markers queued, sent with `tx`'s COMMIT in its round trip, Tx.at_commit).

    An update calls it in a transaction that commits BEFORE the write's request leaves (sent
    now). A create calls it once the response names the record, with
    `since_side_effect_mark=True`: sent when the step's at-most-once mark was set, just before
    the request left. `object_type` is the singular onceflow type (`contact`)."""
    if not fields:
        return 0
    if ttl_seconds <= 0:
        raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds}")
    names = list(fields)
    params = dict(
        connection_id=connection_id,
        object_type=object_type,
        object_id=str(object_id),
        fields=names,
        value_hashes=[value_hash(fields[name]) for name in names],
        step_id=step_id,
        ttl_seconds=ttl_seconds,
        since_side_effect_mark=since_side_effect_mark,
        providers=_GRACE_PROVIDERS,
        grace_seconds=_GRACE_SECONDS,
        max_grace_seconds=_MAX_GRACE_SECONDS,
    )
    if at_commit:
        tx.at_commit(INSERT, **params)
        return len(names)
    return tx.execute(INSERT, **params)


def authored_elsewhere(
    provider: str | None,
    *,
    author_source: str | None,
    author_id: str | None,
    connection_user_id: str | None,
) -> bool:
    """True when the event's author proves the change is not onceflow's write: its provider
    declares the source API writes carry, the connection knows its user, and the event names
    another source or another user (module docstring). False when any of that is unknown."""
    found = registry.get(provider) if provider else None
    if found is None or found.api_author_source is None or connection_user_id is None:
        return False
    if author_source is None or author_id is None:
        return False
    return author_source != found.api_author_source or author_id != connection_user_id


def is_echo(
    changed_fields: Mapping[str, Any],
    markers: Iterable[tuple[str, bytes]],
    *,
    elsewhere: bool = False,
) -> bool:
    """True when every changed field has a live marker with the same value hash, unless the
    author already proved the change someone else's (`elsewhere`: `authored_elsewhere`).

    `markers` are (field, value_hash) pairs alive at the change's time for the same record.
    Pure: admission fetches the markers in its context query and decides here."""
    if elsewhere or not changed_fields:
        return False
    live: dict[str, set[bytes]] = {}
    for name, digest in markers:
        live.setdefault(name, set()).add(bytes(digest))
    return all(value_hash(v) in live.get(k, ()) for k, v in changed_fields.items())


def markers_from_json(value: Any) -> tuple[tuple[str, bytes], ...]:
    """The markers a statement read as a JSON array of [field, hex value hash] pairs
    (admission's context, a wait's lookback), as `is_echo` takes them."""
    pairs = value or ()
    return tuple((str(f), bytes.fromhex(h)) for f, h in pairs)


def check_echo(
    tx: Tx,
    *,
    connection_id: str | None,
    object_type: str | None,
    object_id: str | None,
    changed_fields: Mapping[str, Any],
    occurred_at: datetime,
) -> bool:
    """`is_echo` with the markers read from the database (one statement)."""
    if connection_id is None or object_type is None or object_id is None or not changed_fields:
        return False
    rows = tx.all(
        FOR_CHANGE,
        connection_id=connection_id,
        object_type=object_type,
        object_id=object_id,
        fields=list(changed_fields),
        occurred_at=occurred_at,
        skew_seconds=float(ECHO_CLOCK_SKEW_SECONDS),
    )
    return is_echo(changed_fields, [(r["field"], r["value_hash"]) for r in rows])


def expire_echo_markers(tx: Tx, *, batch: int = EXPIRE_BATCH) -> int:
    """Delete markers past their provider's grace (`keep_until`; at most `batch`); how many."""
    return tx.execute(EXPIRE, batch=batch)


def expire_markers_past_grace(db: Database) -> dict[str, int]:
    """The sweep duty: markers expired for longer than their grace, one batch."""
    with db.transaction() as tx:
        return {"expired": expire_echo_markers(tx)}


def sweep_duties(config: SweepConfig) -> tuple[Duty, ...]:
    return (Duty("expire_echo_markers", 300.0, expire_markers_past_grace),)
