"""The e2e stack is wired as infra/ declares: subscriptions, policies, scheduler cadence."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from devstack import emulator, scheduler
from devstack.stack import RunningStack

pytestmark = pytest.mark.e2e


def test_every_component_answers(stack: RunningStack) -> None:
    rows = stack.healthy()
    assert {r.name for r in rows} >= {"postgres", "pubsub", "webhook", "admit_event", "scheduler"}
    assert [r for r in rows if not r.ok] == []


def test_push_subscriptions_match_infra(stack: RunningStack) -> None:
    layout = emulator.declared_layout()
    base = f"http://{stack.emulator_host}/v1/projects/{stack.project}"
    for topic in layout.topics:
        assert httpx.get(f"{base}/topics/{topic}").status_code == 200, topic
    push = [s for s in layout.subscriptions if s.function is not None]
    assert {s.function for s in push} == {"admit_event", "advance_step"}
    for sub in push:
        got = httpx.get(f"{base}/subscriptions/{sub.name}").json()
        assert got["topic"] == f"projects/{stack.project}/topics/{sub.topic}"
        # The topic in the push path is what functions-framework puts in the CloudEvent source.
        assert got["pushConfig"]["pushEndpoint"] == (
            f"{stack.url(sub.function)}/projects/{stack.project}/topics/{sub.topic}"
        )
        assert got["deadLetterPolicy"] == {
            "deadLetterTopic": f"projects/{stack.project}/topics/{sub.dead_letter_topic}",
            "maxDeliveryAttempts": sub.max_delivery_attempts,
        }
        assert got["retryPolicy"]["minimumBackoff"] == sub.minimum_backoff


def test_scheduler_calls_every_scheduled_function(stack: RunningStack) -> None:
    wanted = {j.function for j in scheduler.declared_jobs()}
    assert wanted == {"drain_inbox", "publish_outbox", "sweep"}
    deadline = time.monotonic() + 30
    called: set[str] = set()
    while time.monotonic() < deadline and called != wanted:
        called = {
            line["function"]
            for line in map(json.loads, _json_lines(stack.log("scheduler")))
            if line.get("message") == "calling"
        }
        time.sleep(0.2)
    assert called == wanted


def _json_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("{")]
