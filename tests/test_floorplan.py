"""The floor plan holds: no import circle between modules of `shared/`, and no arrow from a
wing up to a wing above it (`WINGS` in devstack/floorplan.py, the order `make floorplan`
prints). Imports inside functions count: a lazy import that hides a circle from the
interpreter is still a circle in the design."""

from __future__ import annotations

from devstack import floorplan


def test_no_import_circle_in_shared() -> None:
    assert floorplan.circles(floorplan.import_graph()) == []


def test_no_arrow_runs_back_up_the_wings() -> None:
    assert floorplan.upward_arrows(floorplan.import_graph()) == []


def test_every_wing_of_shared_is_in_the_plan_and_nothing_is_loose() -> None:
    mods = floorplan.modules()
    wings = {m.name.split(".")[1] for m in mods if m.name.count(".") >= 1}
    assert wings <= set(floorplan.WINGS), sorted(wings - set(floorplan.WINGS))
    loose = [m.name for m in mods if m.name.count(".") == 1 and m.path.name != "__init__.py"]
    assert loose == []


def test_the_checks_see_a_circle_and_an_upward_arrow() -> None:
    graph = {
        "shared.core.a": {"shared.ops.b"},  # core → ops: up
        "shared.ops.b": {"shared.core.a"},  # and back: a circle
    }
    assert floorplan.circles(graph) == [["shared.core.a", "shared.ops.b"]]
    assert floorplan.upward_arrows(graph) == [("shared.core.a", "shared.ops.b")]
