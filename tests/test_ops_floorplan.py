"""The ops wing's floor plan, read from the imports (devstack/floorplan.py, `make floorplan`):
no import circle among its modules (the API, the page, the picture and the OpenAPI document
used to import each other), and no lower wing importing ops (the install callback page once
sat in accounts and reached up for the page and the audit)."""

from __future__ import annotations

from pathlib import Path

from devstack.floorplan import circles, import_graph, upward_arrows

ROOT = Path(__file__).resolve().parent.parent


def ops_circles(root: Path) -> list[list[str]]:
    return [c for c in circles(import_graph(root)) if any(m.startswith("shared.ops") for m in c)]


def arrows_into_ops(root: Path) -> list[tuple[str, str]]:
    return [(a, b) for a, b in upward_arrows(import_graph(root)) if b.startswith("shared.ops")]


def test_no_import_circle_runs_through_ops() -> None:
    assert ops_circles(ROOT) == []


def test_no_lower_wing_imports_ops() -> None:
    assert arrows_into_ops(ROOT) == []
