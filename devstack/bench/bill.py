"""What Cloud Run would bill for the requests a benchmark saw, and what that makes a month.

Pure arithmetic, no I/O beyond reading `infra/` (devstack/terraform.py): the local stack logs
every request each function served (`devstack.function_server`, `ONCEFLOW_REQUEST_LOG_DIR`),
and this module turns those intervals into billed instance time the way request-based billing
counts it, then into dollars with the small price table below.

The model, and what it leaves out:
- An instance is billed while at least one request is in flight on it; each such busy period
  is rounded up to the next 100 ms ("Cloud Run charges you only for the resources you use,
  rounded up to the nearest 100 millisecond", cloud.google.com/run/pricing). Overlapping
  requests on one instance share that time.
- Requests are packed onto as few instances as the function's concurrency allows (first
  instance with a free slot, in arrival order). Cloud Run's autoscaler aims at 60% of the
  maximum concurrency (cloud.google.com/run/docs/about-instance-autoscaling), so the real
  packing is looser: the figure is a floor for busy traffic and exact for sparse traffic,
  where every request has an instance to itself anyway.
- Container start-up and shutdown are billed too (billing-settings page) and are not in the
  request log; cold starts are rare at steady traffic and `infra/README.md` measures them.
- Free tiers are left out: the figures are what the marginal run costs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ROUNDING_SECONDS = 0.1
SECONDS_PER_MONTH = 730 * 3600  # the 730-hour month the price pages use
TICKS_PER_MONTH = 730 * 60  # a `* * * * *` schedule


@dataclass(frozen=True)
class Price:
    amount: float  # US dollars per unit
    unit: str
    source: str  # where it was read, and when


# List prices, Tier 1 regions (e.g. us-central1), read 2026-12-03. One table, so a price
# change is one line; every figure below says which rows it used.
PRICES: dict[str, Price] = {
    "run_vcpu_second": Price(
        0.000024,
        "vCPU-second",
        "cloud.google.com/run/pricing, request-based billing, Tier 1 (2026-12)",
    ),
    "run_gib_second": Price(
        0.0000025,
        "GiB-second",
        "cloud.google.com/run/pricing, request-based billing, Tier 1 (2026-12)",
    ),
    "run_request": Price(
        0.40 / 1_000_000, "request", "cloud.google.com/run/pricing: $0.40 per million (2026-12)"
    ),
    "sql_vcpu_hour": Price(
        0.0413,
        "vCPU-hour",
        "Cloud SQL Enterprise, us-central1, as quoted from cloud.google.com/sql/pricing by "
        "usage.ai (May 2026)",
    ),
    "sql_gb_hour": Price(
        0.007,
        "GB-hour of memory",
        "Cloud SQL Enterprise, us-central1, as quoted from cloud.google.com/sql/pricing by "
        "usage.ai (May 2026)",
    ),
    "sql_ssd_gb_month": Price(
        0.17, "GB-month of SSD", "cloud.google.com/sql/pricing (not confirmed in the corpus)"
    ),
    "e2_micro_hour": Price(
        0.0084,
        "e2-micro hour (a VPC connector instance)",
        "Compute Engine list price, us-central1 (not confirmed in the corpus)",
    ),
}


@dataclass(frozen=True)
class Request:
    start: float  # seconds, any common clock
    end: float


def billed_seconds(requests: Iterable[Request], concurrency: int) -> float:
    """Instance seconds billed for `requests` on instances taking `concurrency` at once."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    # Each instance: the end times of its requests in flight, and its busy periods.
    in_flight: list[list[float]] = []
    periods: list[list[list[float]]] = []
    for req in sorted(requests, key=lambda r: r.start):
        k = _instance_with_a_free_slot(in_flight, req.start, concurrency)
        if k is None:
            in_flight.append([])
            periods.append([])
            k = len(in_flight) - 1
        busy = periods[k]
        if busy and req.start <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], req.end)
        else:
            busy.append([req.start, req.end])
        in_flight[k].append(req.end)
    return sum(_rounded(end - start) for busy in periods for start, end in busy)


def _instance_with_a_free_slot(
    in_flight: list[list[float]], at: float, concurrency: int
) -> int | None:
    for k, ends in enumerate(in_flight):
        ends[:] = [e for e in ends if e > at]
        if len(ends) < concurrency:
            return k
    return None


def _rounded(seconds: float) -> float:
    # A tiny epsilon keeps 0.1 s from being rounded to 0.2 s by float noise.
    return math.ceil(seconds / ROUNDING_SECONDS - 1e-9) * ROUNDING_SECONDS


@dataclass(frozen=True)
class Shape:
    """What one instance of a function is given (infra/functions.tf)."""

    vcpu: float
    memory_gib: float

    def dollars(self, instance_seconds: float, requests: float) -> float:
        return (
            instance_seconds
            * (
                self.vcpu * PRICES["run_vcpu_second"].amount
                + self.memory_gib * PRICES["run_gib_second"].amount
            )
            + requests * PRICES["run_request"].amount
        )


def memory_gib(text: str) -> float:
    """'256Mi' → 0.25, '1Gi' → 1.0 (the forms infra/functions.tf uses)."""
    units = {"Mi": 1 / 1024, "Gi": 1.0}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    raise ValueError(f"unreadable memory size {text!r}")


def shapes_from_infra() -> dict[str, Shape]:
    from devstack import terraform

    functions = terraform.load().locals["functions"]
    return {
        name: Shape(vcpu=float(body["cpu"]), memory_gib=memory_gib(str(body["memory"])))
        for name, body in functions.items()
    }


@dataclass(frozen=True)
class Fixed:
    """What a deployment pays per month before its first event."""

    lines: tuple[tuple[str, float], ...]

    @property
    def total(self) -> float:
        return sum(amount for _, amount in self.lines)


def fixed_monthly(
    *,
    shapes: Mapping[str, Shape],
    idle_tick_seconds: Mapping[str, float],
    webhook_min_instances: int,
    sql_vcpu: float,
    sql_memory_gb: float,
    sql_disk_gb: float,
    connector_instances: int,
) -> Fixed:
    """The idle month: each scheduled function's tick (measured on an idle stack, rounded as
    billed) every minute, warm webhook instances (billed here at the active rate: an upper
    bound, the idle rate of a minimum instance is lower), the database and the connector."""
    lines = []
    for name, seconds in sorted(idle_tick_seconds.items()):
        billed = _rounded(seconds) * TICKS_PER_MONTH
        lines.append((f"{name} ticks", shapes[name].dollars(billed, TICKS_PER_MONTH)))
    if webhook_min_instances:
        lines.append(
            (
                f"webhook min instances ({webhook_min_instances})",
                shapes["webhook"].dollars(webhook_min_instances * SECONDS_PER_MONTH, 0),
            )
        )
    hours = SECONDS_PER_MONTH / 3600
    lines.append(
        (
            "Cloud SQL",
            hours
            * (
                sql_vcpu * PRICES["sql_vcpu_hour"].amount
                + sql_memory_gb * PRICES["sql_gb_hour"].amount
            )
            + sql_disk_gb * PRICES["sql_ssd_gb_month"].amount,
        )
    )
    lines.append(("VPC connector", connector_instances * hours * PRICES["e2_micro_hour"].amount))
    return Fixed(tuple(lines))


# infra/sql.tf declares no disk_size, so the instance gets Cloud SQL's default of 10 GB.
SQL_DEFAULT_DISK_GB = 10


def fixed_from_infra(shapes: Mapping[str, Shape], idle_tick_seconds: Mapping[str, float]) -> Fixed:
    """`fixed_monthly` with every size read from infra/'s defaults."""
    from devstack import terraform

    decl = terraform.load()
    tier = str(decl.variables["sql_tier"])
    custom = re.fullmatch(r"db-custom-(\d+)-(\d+)", tier)
    if custom is None:
        raise ValueError(f"sql_tier {tier!r} is not a db-custom-CPUS-MEMORY_MB tier")
    connector = next(decl.of_type("google_vpc_access_connector"))
    return fixed_monthly(
        shapes=shapes,
        idle_tick_seconds=idle_tick_seconds,
        webhook_min_instances=int(decl.variables["webhook_min_instances"]),
        sql_vcpu=float(custom.group(1)),
        sql_memory_gb=float(custom.group(2)) / 1024,
        sql_disk_gb=SQL_DEFAULT_DISK_GB,
        connector_instances=int(terraform.attribute(decl, connector, "min_instances")),
    )


def per_million_runs(variable_per_run: float, fixed: Fixed, runs_per_day: float) -> float:
    """Dollars per million runs at a steady `runs_per_day`: the runs' own billed time plus
    their share of the fixed month."""
    runs_per_month = runs_per_day * SECONDS_PER_MONTH / 86_400
    return 1_000_000 * (variable_per_run + fixed.total / runs_per_month)
