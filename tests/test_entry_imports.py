"""main.py hands each function only its own entry point: a cold start imports that function's
code, not the whole bundle (a webhook instance answers a CRM whose delivery times out in
seconds; it has no use for admission, the step engine or the ops API)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shared.core.deployables import DEPLOYABLES

ROOT = Path(__file__).resolve().parent.parent


def _loaded_after_serving(target: str) -> set[str]:
    """The `shared.*` modules a fresh process has imported once functions-framework has built
    the app for `target` from main.py, as it does at an instance's start."""
    code = (
        "import json, sys, functions_framework\n"
        f"functions_framework.create_app({target!r}, 'main.py')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('shared', 'functions')))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={"PATH": "/usr/bin:/bin", "NO_GCE_CHECK": "true", "HOME": str(ROOT)},
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_main_names_every_deployable_and_nothing_else() -> None:
    import main

    assert set(main.ENTRY_POINTS) == {d.name for d in DEPLOYABLES}
    with pytest.raises(AttributeError):
        main.not_a_function  # noqa: B018


def test_a_webhook_instance_imports_neither_admission_nor_the_engine_nor_ops() -> None:
    loaded = _loaded_after_serving("webhook")
    assert "functions.webhook" in loaded
    unwanted = {
        "functions.admit_event",
        "functions.advance_step",
        "functions.ops",
        "shared.admission.admit",
        "shared.steps.advance",
        "shared.ops.api",
    }
    assert not loaded & unwanted, sorted(loaded & unwanted)
