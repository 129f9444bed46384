"""The sweep's catalog: what the scheduled `sweep` runs, and in which order.

Each owner declares its own work where its rule lives; this module only lists the owners, as
shared/blocks/registry.py lists the block modules and `shared.triggers.kinds()` the trigger
kinds. Adding a repair is one function in its owner plus one line in `REPAIRS`; adding a duty
is a `sweep_duties(config)` in its owner plus one line in `DUTIES`. The loop
(shared/sweep/loop.py) doesn't change.

- `REPAIRS` run on every pass (a `Repair`, shared/core/duty.py): the step engine's reclaim of
  expired leases, wake-ups and re-dispatch of lost step-ready messages, then the re-publish of
  trigger events admission never decided, then the debounce bursts due now
  (shared/admission/debounce_fire.py), then the heads of throttled run-start queues whose
  window has room (shared/admission/run_throttle.py), then the lines behind step limits whose
  next window has opened (shared/gates/limit_queue.py), then the runs a run's end handed a
  keyed-concurrency slot that did not start yet (shared/admission/concurrency.py), then the
  approvals' reminders and escalations due and the approval messages due (Slack posts and
  their updates, shared/steps/approval_messages.py), then the outbound events due now
  (shared/publishing/outbound.py: sent signed, retried with backoff, given up at the cap).
- `DUTIES` each give the periodic `Duty`s of one owner, each claimed once per period across
  all sweep instances: the backlog report the alerts read (every minute), echo marker expiry,
  app events routed once their portal connects, provider journals read (every minute), ended
  throttle windows, budget reservations left open, provider subscription repair (hourly), the
  lease history of long-finished runs, pre-admission drops and install states (hourly),
  retention (every five minutes), finished outbound deliveries (hourly), and the trigger kinds'
  own (cron ticks, webhook-trigger key expiry, table and CRM polls).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shared import triggers
from shared.admission import concurrency_start, debounce_fire, run_throttle_start
from shared.core.duty import Duty, Repair, SweepConfig
from shared.gates import budgets, limit_queue, throttle
from shared.ingest import drops, echo, inbox, journal, outbox
from shared.providers import install
from shared.publishing import outbound, subscriptions
from shared.steps import approval_messages, repairs
from shared.sweep import backlog, retention

REPAIRS: tuple[Repair, ...] = (
    repairs.reclaim_expired_leases,
    repairs.wake_due_steps,
    repairs.redispatch_lost_steps,
    outbox.requeue_undecided_events,
    debounce_fire.fire_due_bursts,
    run_throttle_start.start_due_runs,
    limit_queue.grant_due_limits,
    concurrency_start.start_granted_runs,
    approval_messages.remind_and_escalate_approvals,
    approval_messages.deliver_approval_messages,
    outbound.deliver_outbound_events,
)

DUTIES: tuple[Callable[[SweepConfig], Sequence[Duty]], ...] = (
    backlog.sweep_duties,
    echo.sweep_duties,
    inbox.sweep_duties,
    journal.sweep_duties,
    throttle.sweep_duties,
    budgets.sweep_duties,
    subscriptions.sweep_duties,
    repairs.sweep_duties,
    drops.sweep_duties,
    install.sweep_duties,
    retention.sweep_duties,
    outbound.sweep_duties,
    triggers.sweep_duties,
)


def default_duties(config: SweepConfig | None = None) -> list[Duty]:
    """Every periodic duty, in catalog order."""
    config = config or SweepConfig.from_env()
    return [duty for owner in DUTIES for duty in owner(config)]
