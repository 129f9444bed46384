"""Trigger kinds: what starts a workflow. One module per kind, registered in `kinds()` below.

A kind says, for a definition's `trigger`:
- whether the trigger is of this kind (`applies`; exactly one kind must apply);
- what `validate` says about it (`check`, given a function that records a located problem),
  and about it for the definition's tenant (`check_tenant`: what a tenant may name);
- which event types its workflow is bound to on activation (`event_types`): a CRM-event
  trigger listens to the types it lists, a schedule to a type of its own workflow, so the
  events a kind emits meet ordinary bindings and admission treats them like any other;
- the sweep duties that produce its events (`duties`: cron ticks, polls), which the sweep's
  catalog (shared/sweep/catalog.py) gathers through `sweep_duties`;
- what only the database can say, checked on activation (`check_activation`);
- what ops shows about it (`status`).

Every kind that emits goes through `shared.ingest.outbox.emit`, with a deterministic key under a
unique constraint, so admission, dedup modes, refusals and the ops views need nothing new.
Adding a kind is adding a module here and its fields on `Trigger`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from shared.core.duty import Duty, SweepConfig
from shared.workflows.definition import Trigger

if TYPE_CHECKING:
    from shared.core.db import Tx

PathT = tuple[str | int, ...]
AddProblem = Callable[[Literal["error", "warning"], PathT, str], None]


@dataclass(frozen=True)
class TriggerKind:
    name: str
    fields: tuple[str, ...]  # the `Trigger` fields that belong to this kind
    applies: Callable[[Trigger], bool]
    check: Callable[[Trigger, AddProblem], None]
    event_types: Callable[[Trigger, str], tuple[str, ...]]
    duties: Callable[[], Sequence[Duty]] = lambda: ()
    # What the tenant may name in the trigger (a polled table in its own schema); `validate`
    # checks it with the definition's `tenant`, activation with the activating tenant.
    check_tenant: Callable[[Trigger, str, AddProblem], None] = lambda _t, _tenant, _add: None
    # What only the database can say about the trigger (given the tenant), checked on
    # activation (a polled table exists and an index answers its query); problems refuse it.
    check_activation: Callable[[Tx, Trigger, str], list[tuple[PathT, str]]] = (
        lambda _tx, _t, _tenant: []
    )
    # What ops shows about the trigger of an active workflow (missed ticks, a poll's last
    # error, refused webhook requests): JSON-able.
    status: Callable[[Tx, Trigger, str], dict[str, Any]] = lambda _tx, _t, _workflow_id: {}


def kinds() -> tuple[TriggerKind, ...]:
    # Imported here: each kind module imports `TriggerKind` from this package, which must be
    # defined before they load.
    from shared.triggers import cron, events, poll, webhook

    return (events.KIND, cron.KIND, webhook.KIND, poll.KIND)


def kinds_of(trigger: Trigger) -> list[TriggerKind]:
    return [k for k in kinds() if k.applies(trigger)]


def kind_of(trigger: Trigger) -> TriggerKind:
    """The one kind of a validated trigger."""
    found = kinds_of(trigger)
    if len(found) != 1:
        raise ValueError(f"a trigger has exactly one kind; this one has {len(found)}")
    return found[0]


def check_trigger(trigger: Trigger, add: AddProblem) -> None:
    """Exactly one kind, and that kind's own checks."""
    found = kinds_of(trigger)
    if not found:
        names = ", ".join(f"`{k.name}`" for k in kinds())
        add("error", ("trigger",), f"a trigger needs one of: {names}")
        return
    if len(found) > 1:
        names = " and ".join(f"`{k.name}`" for k in found)
        add("error", ("trigger",), f"a trigger is one kind; this one has both {names}")
        return
    kind = found[0]
    for other in kinds():
        for name in other.fields:
            if other is not kind and name not in kind.fields and name in trigger.model_fields_set:
                add(
                    "error",
                    ("trigger", name),
                    f"`{name}` belongs to a {other.name} trigger; this one is a {kind.name} "
                    "trigger",
                )
    kind.check(trigger, add)


def check_trigger_tenant(trigger: Trigger, tenant_id: str, add: AddProblem) -> None:
    """The trigger's kind's checks of what the tenant may name (nothing when it has no one
    kind: `check_trigger` says so)."""
    found = kinds_of(trigger)
    if len(found) == 1:
        found[0].check_tenant(trigger, tenant_id, add)


def binding_event_types(trigger: Trigger, workflow_id: str) -> tuple[str, ...]:
    """The event types the workflow is bound to while this trigger's version is active."""
    return tuple(dict.fromkeys(kind_of(trigger).event_types(trigger, workflow_id)))


def sweep_duties(config: SweepConfig) -> list[Duty]:
    """Every kind's duties (cron ticks, webhook-trigger keys, polls), in kind order."""
    return [d for k in kinds() for d in k.duties()]


def status(tx: Tx, trigger: Trigger, workflow_id: str) -> tuple[str, dict[str, Any]]:
    """The kind of an active workflow's trigger and what ops shows about it."""
    kind = kind_of(trigger)
    return kind.name, kind.status(tx, trigger, workflow_id)
