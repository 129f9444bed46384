"""bench-e2e's inputs, checked without running the bench: the workflow it binds is valid and
three steps long, and each request carries the batch it claims with distinct events."""

from __future__ import annotations

import json

from devstack.bench import e2e
from devstack.seed import PROPERTY_CHANGED
from shared.publishing.validate import validate_data


def test_the_bench_workflow_is_a_valid_three_step_graph() -> None:
    report = validate_data(
        {
            "name": "e2e",
            "tenant": e2e.TENANT,
            "trigger": {"events": [PROPERTY_CHANGED], "dedup": "every_time"},
            "steps": [dict(s) for s in e2e.STEPS],
        }
    )
    assert report.ok, report
    assert len(e2e.STEPS) == 3


def test_a_batch_body_carries_distinct_events_of_the_bench_portal() -> None:
    events = json.loads(e2e.batch_body(30, 10))
    assert len(events) == 10
    assert len({e["eventId"] for e in events}) == 10
    assert len({e["objectId"] for e in events}) == 10
    assert {e["portalId"] for e in events} == {e2e.PORTAL}
    # Consecutive batches never share an event: the bench counts one run per event.
    following = json.loads(e2e.batch_body(40, 10))
    assert not {e["eventId"] for e in events} & {e["eventId"] for e in following}
