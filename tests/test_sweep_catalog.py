"""The sweep's catalog (shared/sweep/catalog.py) is the one list of what the sweep runs: every
owner that declares `sweep_duties` is registered there, in the order the sweep has always run
its duties, and no module below the sweep imports the loop or the catalog (owners declare in
the shape of shared/core/duty.py, so the sweep's imports only run down)."""

from __future__ import annotations

import ast
from pathlib import Path

from shared.core.duty import SweepConfig
from shared.sweep import catalog

ROOT = Path(__file__).resolve().parent.parent


def _modules_declaring_duties() -> set[str]:
    found = set()
    for path in (ROOT / "shared").rglob("*.py"):
        tree = ast.parse(path.read_text("utf-8"))
        if any(
            isinstance(node, ast.FunctionDef) and node.name == "sweep_duties" for node in tree.body
        ):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.add(".".join(parts))
    return found


def test_every_owner_that_declares_duties_is_in_the_catalog() -> None:
    registered = {owner.__module__ for owner in catalog.DUTIES}
    assert _modules_declaring_duties() == registered


def test_the_catalog_keeps_the_sweeps_duty_order() -> None:
    names = [d.name for d in catalog.default_duties(SweepConfig())]
    assert names == [
        "report_backlog",
        "expire_echo_markers",
        "reroute_unrouted_app_events",
        "read_provider_journals",
        "delete_expired_throttle_windows",
        "reconcile_budget_reservations",
        "reconcile_subscriptions",
        "trim_lease_history",
        "trim_pre_admission_drops",
        "trim_oauth_install_states",
        "retention",
        "expire_outbound_deliveries",
        "fire_cron_ticks",
        "expire_webhook_trigger_keys",
        "poll_sources",
    ]
    assert len(set(names)) == len(names)  # a duty's name is its claim row


def test_the_repairs_run_in_the_sweeps_order() -> None:
    assert [r.__name__ for r in catalog.REPAIRS] == [
        "reclaim_expired_leases",
        "wake_due_steps",
        "redispatch_lost_steps",
        "requeue_undecided_events",
        "fire_due_bursts",
        "start_due_runs",
        "grant_due_limits",
        "start_granted_runs",
        "remind_and_escalate_approvals",
        "deliver_approval_messages",
        "deliver_outbound_events",
    ]
