"""The bill arithmetic of `make bench-e2e` (devstack/bench/bill.py): request-based billing's
100 ms rounding per busy period, requests sharing an instance up to its concurrency, and the
fixed month read from infra/'s defaults. Pure logic, no stack."""

from __future__ import annotations

import pytest

from devstack.bench import bill
from devstack.bench.bill import Request


def test_a_short_request_alone_is_billed_a_whole_100_ms() -> None:
    assert bill.billed_seconds([Request(0.0, 0.005)], concurrency=1) == pytest.approx(0.1)


def test_each_busy_period_is_rounded_up_on_its_own() -> None:
    # Two 30 ms requests a second apart: two busy periods, 100 ms each.
    reqs = [Request(0.0, 0.03), Request(1.0, 1.03)]
    assert bill.billed_seconds(reqs, concurrency=8) == pytest.approx(0.2)


def test_overlapping_requests_share_an_instance_up_to_its_concurrency() -> None:
    # Eight 50 ms requests at once: one instance at concurrency 8 (one 100 ms period), eight
    # instances at concurrency 1 (eight periods).
    reqs = [Request(0.0, 0.05) for _ in range(8)]
    assert bill.billed_seconds(reqs, concurrency=8) == pytest.approx(0.1)
    assert bill.billed_seconds(reqs, concurrency=1) == pytest.approx(0.8)


def test_a_ninth_request_in_flight_opens_a_second_instance() -> None:
    reqs = [Request(0.0, 0.25) for _ in range(9)]
    # Instance one: 250 ms → 300 ms billed; instance two: the same.
    assert bill.billed_seconds(reqs, concurrency=8) == pytest.approx(0.6)


def test_a_slot_freed_by_a_finished_request_is_reused() -> None:
    # At concurrency 1, back-to-back requests stay on one instance and merge into one period.
    reqs = [Request(0.0, 0.04), Request(0.04, 0.08), Request(0.08, 0.12)]
    assert bill.billed_seconds(reqs, concurrency=1) == pytest.approx(0.2)


def test_concurrency_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        bill.billed_seconds([], concurrency=0)


def test_memory_sizes_are_read_as_gib() -> None:
    assert bill.memory_gib("256Mi") == 0.25
    assert bill.memory_gib("1Gi") == 1.0
    with pytest.raises(ValueError, match="unreadable"):
        bill.memory_gib("256MB")


def test_shapes_and_the_fixed_month_come_from_infra_defaults() -> None:
    shapes = bill.shapes_from_infra()
    assert shapes["advance_step"] == bill.Shape(vcpu=1.0, memory_gib=0.5)
    fixed = bill.fixed_from_infra(shapes, {"sweep": 0.05})
    names = [line for line, _ in fixed.lines]
    assert names[0] == "sweep ticks" and "Cloud SQL" in names and "VPC connector" in names
    # A 50 ms tick is billed 100 ms, 43,800 times a month, on 1 vCPU and 256 MiB.
    tick = dict(fixed.lines)["sweep ticks"]
    per_second = bill.PRICES["run_vcpu_second"].amount + 0.25 * bill.PRICES["run_gib_second"].amount
    expected = 0.1 * bill.TICKS_PER_MONTH * per_second
    expected += bill.TICKS_PER_MONTH * bill.PRICES["run_request"].amount
    assert tick == pytest.approx(expected)
    assert fixed.total == pytest.approx(sum(amount for _, amount in fixed.lines))


def test_the_fixed_month_weighs_less_per_run_as_traffic_grows() -> None:
    fixed = bill.Fixed((("database", 50.0),))
    small = bill.per_million_runs(0.00001, fixed, 5_000)
    large = bill.per_million_runs(0.00001, fixed, 50_000_000)
    assert small > large > 10.0  # $10 per million is the variable part alone
    assert large == pytest.approx(10.0 + 50.0 / (50_000_000 * 730 / 24) * 1e6)
