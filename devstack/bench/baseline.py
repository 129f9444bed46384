"""The pgbench baseline and the JSON-line format every onceflow benchmark prints."""

from __future__ import annotations

import json
import re
import subprocess
from contextlib import AbstractContextManager
from typing import Any

from devstack import postgres
from devstack.tools import pg_bindir


def bench_cluster() -> AbstractContextManager[postgres.Cluster]:
    """A durable (fsync on) throwaway cluster, so figures mean what production would see."""
    return postgres.throwaway("onceflow-bench-pg-", fast=False)


def pgbench_tps(
    cluster: postgres.Cluster, *, clients: int = 8, seconds: int = 10, scale: int = 10
) -> float:
    """`pgbench -N` (no branch updates: the simple-update write path) TPS on `cluster`."""
    pgbench = str(pg_bindir() / "pgbench")
    postgres.create_database(cluster.port, "pgbench")
    common = ["-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres"]
    subprocess.run(
        [pgbench, *common, "-i", "-q", "-s", str(scale), "pgbench"], check=True, capture_output=True
    )
    out = subprocess.run(
        [pgbench, *common, "-N", "-c", str(clients), "-j", "2", "-T", str(seconds), "pgbench"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    match = re.search(r"tps = ([0-9.]+)", out)
    if not match:
        raise RuntimeError(f"could not read pgbench output:\n{out}")
    return float(match.group(1))


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values` by rank: the latency figures every bench prints."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def emit(bench: str, value: float, unit: str, pgbench: float | None, **extra: Any) -> None:
    """One JSON line; `ratio` is value / pgbench TPS when the unit is a rate."""
    line: dict[str, Any] = {
        "bench": bench,
        "value": round(value, 3),
        "unit": unit,
        "pgbench_tps": round(pgbench, 1) if pgbench else None,
    }
    line["ratio"] = round(value / pgbench, 4) if pgbench and unit.endswith("/s") else None
    line.update(extra)
    print(json.dumps(line), flush=True)
