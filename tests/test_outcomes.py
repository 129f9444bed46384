"""The one classify function and the deterministic backoff (pure logic, no database)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from shared.blocks.base import NO_RETRY, BlockFailure, BlockResult, RetryPolicy
from shared.core.errors import TransientError, classify_status
from shared.steps.outcomes import (
    DELAY_UNTIL_KEY,
    backoff_seconds,
    classify_exception,
    classify_outcome,
    served_delay,
)
from shared.steps.states import StepStatus

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def transient(**kw: object) -> BlockFailure:
    return BlockFailure("503", error_class="transient", outcome_code="HTTP_503", **kw)  # type: ignore[arg-type]


def test_http_status_classes() -> None:
    for code in (500, 502, 503, 504, 408, 425, 429):
        assert classify_status(code) == "transient", code
    for code in (400, 401, 403, 404, 409, 422, 418):
        assert classify_status(code) == "permanent", code


def test_the_hubspot_port_classifies_statuses_by_the_one_rule() -> None:
    """The port keeps its own table (it names each answer: rate_limited, busy, …), so it is
    held to the rule here: transient exactly where the rule says, plus HubSpot's own busy
    statuses (423 locked, 477 migration in progress)."""
    import httpx

    from shared.providers.hubspot.port import BUSY_STATUSES, classify_response

    request = httpx.Request("GET", "https://api.hubapi.com/crm/v3/objects/contacts/1")
    for status in range(400, 600):
        answer = classify_response(httpx.Response(status, request=request, json={}))
        expected = classify_status(status) == "transient" or status in BUSY_STATUSES
        assert answer.transient is expected, status


def test_exception_classes() -> None:
    assert classify_exception(ConnectionResetError())[0] == "transient"
    assert classify_exception(TimeoutError())[0] == "transient"
    assert classify_exception(TransientError("deadlock", retry_after=3))[::2] == ("transient", 3)
    assert classify_exception(KeyError("x"))[0] == "permanent"  # unknown is permanent
    assert classify_exception(ValueError("x"))[0] == "permanent"


def test_backoff_sequence_is_deterministic_from_1_to_15_minutes() -> None:
    default = RetryPolicy()
    assert [backoff_seconds(n, default) for n in (1, 2)] == [60.0, 900.0]
    five = RetryPolicy(max_attempts=5)
    seq = [backoff_seconds(n, five) for n in (1, 2, 3, 4)]
    assert seq[0] == 60.0 and seq[-1] == 900.0
    assert seq == sorted(seq) and len(set(seq)) == 4
    assert seq == [backoff_seconds(n, five) for n in (1, 2, 3, 4)]  # no jitter
    assert backoff_seconds(9, five) == 900.0


def test_attempt_counting_until_the_last_attempt_fails() -> None:
    policy = RetryPolicy()
    waits = []
    for attempt in (1, 2):
        s = classify_outcome(
            transient(), kind="action", retry=policy, attempt=attempt, successors=[], now=NOW
        )
        assert s.status is StepStatus.WAITING_FOR_RETRY and s.attempt == attempt
        assert s.error_class == "transient" and s.outcome_code == "HTTP_503"
        assert s.wake_at is not None
        waits.append((s.wake_at - NOW).total_seconds())
    assert waits == [60.0, 900.0]
    last = classify_outcome(
        transient(), kind="action", retry=policy, attempt=3, successors=[], now=NOW
    )
    assert last.status is StepStatus.FAILED and last.fails_run
    assert "gave up after 3 attempts" in (last.error or "")


def test_retry_after_waits_at_least_that_long() -> None:
    s = classify_outcome(
        transient(retry_after=300.0),
        kind="action",
        retry=RetryPolicy(),
        attempt=1,
        successors=[],
        now=NOW,
    )
    assert s.wake_at == NOW + timedelta(seconds=300)
    short = classify_outcome(
        transient(retry_after=5.0),
        kind="action",
        retry=RetryPolicy(),
        attempt=1,
        successors=[],
        now=NOW,
    )
    assert short.wake_at == NOW + timedelta(seconds=60)  # never shorter than the backoff


def test_throttling_parks_without_using_an_attempt() -> None:
    s = classify_outcome(
        transient(retry_after=30.0, consumes_attempt=False),
        kind="action",
        retry=RetryPolicy(),
        attempt=3,
        successors=[],
        now=NOW,
    )
    assert s.status is StepStatus.WAITING_FOR_RETRY
    assert s.attempt == 2  # the claim's bump is given back
    assert s.wake_at == NOW + timedelta(seconds=30)


def test_flow_control_never_retries() -> None:
    s = classify_outcome(
        transient(), kind="flow", retry=RetryPolicy(), attempt=1, successors=[], now=NOW
    )
    assert s.status is StepStatus.FAILED
    s2 = classify_outcome(
        ConnectionResetError(), kind="flow", retry=NO_RETRY, attempt=1, successors=[], now=NOW
    )
    assert s2.status is StepStatus.FAILED


def test_permanent_fails_at_once() -> None:
    s = classify_outcome(
        BlockFailure("no", error_class="permanent", outcome_code="HTTP_404"),
        kind="action",
        retry=RetryPolicy(),
        attempt=1,
        successors=[],
        now=NOW,
    )
    assert s.status is StepStatus.FAILED and s.error_class == "permanent"


def test_success_successors_and_branch_choice() -> None:
    plain = classify_outcome(
        BlockResult(output={"a": 1}),
        kind="action",
        retry=RetryPolicy(),
        attempt=1,
        successors=["b"],
        now=NOW,
    )
    assert plain.status is StepStatus.SUCCEEDED and plain.next_nodes == ("b",)
    chose = classify_outcome(
        BlockResult(branch_choice="y"),
        kind="flow",
        retry=NO_RETRY,
        attempt=1,
        successors=["x", "y"],
        now=NOW,
    )
    assert chose.next_nodes == ("y",) and chose.branch_choice == "y"
    ended = classify_outcome(
        BlockResult(next_nodes=()),
        kind="flow",
        retry=NO_RETRY,
        attempt=1,
        successors=["x"],
        now=NOW,
    )
    assert ended.next_nodes == ()


def test_delay_parks_then_is_served() -> None:
    wake = NOW + timedelta(minutes=5)
    s = classify_outcome(
        BlockResult(wake_at=wake),
        kind="flow",
        retry=NO_RETRY,
        attempt=1,
        successors=["next"],
        now=NOW,
    )
    assert s.status is StepStatus.WAITING_FOR_DELAY and s.wake_at == wake
    assert s.output is not None and DELAY_UNTIL_KEY in s.output
    # Parked is not served, whatever the clock says; the wake statement marks it served.
    assert not served_delay(s.output)
    assert served_delay({**s.output, "delay_served": True})
    past = classify_outcome(
        BlockResult(wake_at=NOW - timedelta(seconds=1)),
        kind="flow",
        retry=NO_RETRY,
        attempt=1,
        successors=["next"],
        now=NOW,
    )
    assert past.status is StepStatus.SUCCEEDED and past.next_nodes == ("next",)


def test_pure_modules_import_no_driver_or_http_client() -> None:
    code = (
        "import sys; import shared.steps.outcomes, shared.steps.states; "
        "bad = [m for m in ('pg8000', 'httpx') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]"


@pytest.mark.parametrize(
    "old,new", [("pending", "running"), ("running", "succeeded"), ("waiting_for_delay", "pending")]
)
def test_transition_table_allows(old: str, new: str) -> None:
    from shared.steps.states import allowed

    assert allowed(old, new)


def test_transition_table_refuses() -> None:
    from shared.steps.states import check_transition

    for old, new in [
        ("succeeded", "pending"),
        ("pending", "succeeded"),
        ("waiting_for_retry", "running"),
    ]:
        with pytest.raises(ValueError):
            check_transition(old, new)
