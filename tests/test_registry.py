"""The block registry and the flow-control blocks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel, ValidationError

from shared.blocks import registry
from shared.blocks.base import NO_RETRY, BlockContext, BlockFailure, BlockResult, BlockSpec, Gate
from shared.blocks.flow import NO_BRANCH_TAKEN, DelayConfig, wake_time
from shared.workflows.definition import Branch, Step


class _Empty(BaseModel):
    pass


def _noop(ctx: BlockContext, config: BaseModel) -> BlockResult:
    return BlockResult()


def _spec(**overrides: object) -> BlockSpec:
    fields: dict[str, object] = {
        "type_name": "test.create",
        "config_model": _Empty,
        "kind": "action",
        "side_effect": "idempotent",
        "price": 1,
        "retry": NO_RETRY,
        "execute": _noop,
        "gates": frozenset({Gate.CHARGE}),
    }
    fields.update(overrides)
    return BlockSpec(**fields)  # type: ignore[arg-type]


@pytest.fixture
def empty_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    # The catalog's own first load happens first, so no lookup below fills the empty one.
    registry.all_specs()
    monkeypatch.setattr(registry, "_SPECS", {})


@pytest.mark.usefixtures("empty_registry")
def test_registry_refuses_a_create_that_is_not_at_most_once() -> None:
    with pytest.raises(registry.RegistryError, match="must be 'at_most_once'"):
        registry.register(_spec(creates=True, side_effect="idempotent"))
    assert not registry.is_registered("test.create")
    registry.register(_spec(creates=True, side_effect="at_most_once"))
    assert registry.get("test.create").side_effect == "at_most_once"


@pytest.mark.usefixtures("empty_registry")
def test_a_bad_descriptor_in_a_catalog_module_stops_the_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shared.blocks import flow

    monkeypatch.setattr(flow, "SPECS", (*flow.SPECS, _spec(creates=True)))
    with pytest.raises(registry.RegistryError, match="creates records"):
        registry.load_catalog(("shared.blocks.flow",))


@pytest.mark.usefixtures("empty_registry")
def test_import_errors_and_missing_specs_are_errors() -> None:
    with pytest.raises(ModuleNotFoundError):
        registry.load_catalog(("shared.blocks.does_not_exist",))
    with pytest.raises(registry.RegistryError, match="must define SPECS"):
        registry.load_catalog(("shared.blocks.registry",))


@pytest.mark.usefixtures("empty_registry")
def test_flow_blocks_must_be_free_of_side_effects_and_retries() -> None:
    with pytest.raises(registry.RegistryError, match="flow-control"):
        registry.register(_spec(type_name="test.flow", kind="flow", side_effect="idempotent"))


@pytest.mark.usefixtures("empty_registry")
def test_same_name_twice_is_refused_unless_identical() -> None:
    spec = _spec()
    registry.register(spec)
    registry.register(spec)
    with pytest.raises(registry.RegistryError, match="already registered"):
        registry.register(_spec(price=2))


@pytest.mark.usefixtures("empty_registry")
def test_unknown_type_names_the_known_ones() -> None:
    registry.load_catalog(("shared.blocks.flow",))
    with pytest.raises(registry.UnknownBlockType, match=r"'nope'.*branch, delay, end"):
        registry.get("nope")


def test_full_catalog_loads_with_declared_properties() -> None:
    specs = {s.type_name: s for s in registry.load_catalog()}
    for name in ("branch", "delay", "end"):
        assert specs[name].kind == "flow"
        assert specs[name].price == 0
        assert specs[name].retry == NO_RETRY
    for spec in specs.values():
        assert not spec.creates or spec.side_effect == "at_most_once"


# ---------------------------------------------------------------- flow blocks


def _ctx(node: Step | None, scope: dict[str, object]) -> BlockContext:
    return BlockContext(
        tenant_id="acme",
        run_id="r",
        step_id="s",
        step_key="route",
        attempt=1,
        idempotency_key="k",
        scope=scope,
        node=node,
    )


ROUTE = Step(
    id="route",
    type="branch",
    branches=[
        Branch(when='record.stage == "won"', next="celebrate"),
        Branch(when="record.amount > 100", next="big"),
    ],
    otherwise="small",
)


def _branch(node: Step, scope: dict[str, object]) -> BlockResult:
    registry.load_catalog(("shared.blocks.flow",))
    spec = registry.get("branch")
    return spec.execute(_ctx(node, scope), spec.config_model())


def test_branch_takes_the_first_condition_that_holds() -> None:
    result = _branch(ROUTE, {"record": {"stage": "won", "amount": 500}})
    assert (result.branch_choice, result.next_nodes) == ("celebrate", ("celebrate",))
    result = _branch(ROUTE, {"record": {"stage": "open", "amount": 500}})
    assert result.next_nodes == ("big",)


def test_branch_falls_back_to_otherwise_then_ends_the_path() -> None:
    result = _branch(ROUTE, {"record": {"stage": "open", "amount": 5}})
    assert (result.branch_choice, result.next_nodes) == ("small", ("small",))
    no_otherwise = ROUTE.model_copy(update={"otherwise": None})
    result = _branch(no_otherwise, {"record": {"stage": "open", "amount": 5}})
    assert (result.branch_choice, result.next_nodes) == (NO_BRANCH_TAKEN, ())


def test_branch_condition_error_fails_permanently() -> None:
    with pytest.raises(BlockFailure) as failure:
        _branch(ROUTE, {"record": {"amount": 5}})
    assert failure.value.error_class == "permanent"
    assert failure.value.outcome_code == "EXPRESSION_ERROR"
    assert "stage" in str(failure.value)


def test_delay_durations_and_until() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    assert wake_time(DelayConfig(minutes=5, seconds=30), now) == now + timedelta(seconds=330)
    later = now + timedelta(days=2)
    assert wake_time(DelayConfig.model_validate({"until": later.isoformat()}), now) == later
    assert wake_time(DelayConfig(until=now - timedelta(days=1)), now) == now
    registry.load_catalog(("shared.blocks.flow",))
    result = registry.get("delay").execute(_ctx(None, {}), DelayConfig(hours=1))
    assert result.wake_at is not None
    assert timedelta(minutes=59) < result.wake_at - datetime.now(UTC) <= timedelta(hours=1)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "positive duration"),
        ({"seconds": 5, "until": "2025-01-01T00:00:00Z"}, "either"),
        ({"until": "2025-01-01T00:00:00"}, "UTC offset"),
        ({"days": 400}, "at most"),
        ({"weeks": 1}, "Extra inputs"),
        ({"seconds": -1}, "greater than or equal"),
    ],
)
def test_delay_config_errors(config: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DelayConfig.model_validate(config)


def test_end_ends_the_path() -> None:
    registry.load_catalog(("shared.blocks.flow",))
    spec = registry.get("end")
    assert spec.execute(_ctx(None, {}), spec.config_model()).next_nodes == ()


def test_a_fresh_process_finds_every_block_without_loading_the_catalog() -> None:
    """The catalog loads on the first lookup: no caller loads it or keeps a flag for it."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "from shared.blocks import registry\n"
        "print(registry.is_registered('crm.create'), registry.get('http.request').type_name,"
        " len(registry.all_specs()) > 5)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.split() == ["True", "http.request", "True"]
