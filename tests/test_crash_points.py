"""Crash points: armed only by explicit configuration, and they kill the process on the spot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shared.core.crashpoints import CRASH_POINTS, EXIT_CODE, armed_points

ROOT = Path(__file__).resolve().parent.parent


def test_not_armed_without_the_enable_flag() -> None:
    assert armed_points({"ONCEFLOW_CRASH_POINTS": "after_claim"}) == {}
    assert armed_points({"ONCEFLOW_ENABLE_CRASH_POINTS": "1"}) == {}


def test_parsing_names_and_nth_hits() -> None:
    env = {
        "ONCEFLOW_ENABLE_CRASH_POINTS": "1",
        "ONCEFLOW_CRASH_POINTS": "after_claim, before_settle_commit:3",
    }
    assert armed_points(env) == {"after_claim": 1, "before_settle_commit": 3}
    with pytest.raises(ValueError, match="unknown crash point"):
        armed_points({"ONCEFLOW_ENABLE_CRASH_POINTS": "1", "ONCEFLOW_CRASH_POINTS": "nowhere"})


def test_the_five_points_of_the_step_path_exist() -> None:
    assert CRASH_POINTS == (
        "after_claim",
        "after_side_effect_mark",
        "after_side_effect",
        "before_settle_commit",
        "after_commit_before_publish",
    )


def test_an_armed_point_exits_137_on_its_nth_hit() -> None:
    code = (
        "from shared.core.crashpoints import crash_point\n"
        "for i in range(5):\n"
        "    print(i, flush=True)\n"
        "    crash_point('after_side_effect')\n"
        "print('survived', flush=True)\n"
    )
    env = {
        "ONCEFLOW_ENABLE_CRASH_POINTS": "1",
        "ONCEFLOW_CRASH_POINTS": "after_side_effect:3",
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == EXIT_CODE
    assert out.stdout.split() == ["0", "1", "2"]
    unarmed = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "ONCEFLOW_CRASH_POINTS": "after_side_effect"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unarmed.returncode == 0 and "survived" in unarmed.stdout


def test_infra_never_arms_crash_points() -> None:
    infra = ROOT / "infra"
    texts = [p.read_text() for p in infra.rglob("*") if p.is_file()] if infra.exists() else []
    assert not any(
        "ONCEFLOW_ENABLE_CRASH_POINTS" in t or "ONCEFLOW_CRASH_POINTS" in t for t in texts
    )
