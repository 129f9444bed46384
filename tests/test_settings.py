"""One settings object, read once per process, is the only reader of the environment in
`shared/` and `functions/`, and the README's configuration reference is generated from it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.core import settings as settings_module
from shared.core.settings import SettingError, Settings, described, settings

ROOT = Path(__file__).resolve().parent.parent
# The one module that may read os.environ.
ALLOWED = {ROOT / "shared" / "core" / "settings.py"}


def _environment_reads(path: Path) -> list[str]:
    """`os.environ`, `os.getenv`, `os.putenv` and `from os import environ/getenv` in a file."""
    tree = ast.parse(path.read_text("utf-8"))
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "getenv", "putenv", "environb")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} os.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names = {a.name for a in node.names} & {"environ", "getenv", "putenv", "environb"}
            found += [f"{path.relative_to(ROOT)}:{node.lineno} from os import {n}" for n in names]
    return found


def test_no_module_of_shared_or_functions_reads_the_environment_but_settings() -> None:
    files = [*sorted((ROOT / "shared").rglob("*.py")), *sorted((ROOT / "functions").glob("*.py"))]
    files.append(ROOT / "main.py")
    reads = [hit for path in files if path not in ALLOWED for hit in _environment_reads(path)]
    assert not reads, "read it through shared.core.settings instead:\n" + "\n".join(reads)


def test_settings_are_parsed_once_per_process_until_the_cache_is_cleared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = settings()
    assert settings() is first
    # A change behind the cache's back is not seen: the environment is read once.
    monkeypatch.setitem(os.environ, "ONCEFLOW_SWEEP_BATCH", "7")
    assert settings().sweep_batch == first.sweep_batch
    settings.cache_clear()
    assert settings().sweep_batch == 7
    # The tests' way (tests/conftest.py): setenv clears the cache itself.
    monkeypatch.setenv("ONCEFLOW_SWEEP_BATCH", "9")
    assert settings().sweep_batch == 9


def test_unset_and_empty_variables_leave_the_defaults() -> None:
    empty = {spec.env: "" for _, spec, _ in described()}
    assert Settings.from_env(empty) == Settings.from_env({}) == Settings()


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("DB_POOL_SIZE", "0"),
        ("DB_LOCK_TIMEOUT_MS", "soon"),
        ("PGPORT", "-1"),
        ("DB_IP_TYPE", "carrier-pigeon"),
        ("LOG_LEVEL", "LOUD"),
        ("PUBLIC_BASE_URL", "hooks.example.com"),
        ("WEBHOOK_MAX_BODY_BYTES", "1MB"),
        ("WEBHOOK_NUDGE", "sometimes"),
        ("DRAIN_BUDGET_SECONDS", "-1"),
        ("ONCEFLOW_STEP_LEASE_SECONDS", "0"),
        ("ONCEFLOW_STEP_HEARTBEAT_SECONDS", "900"),
        ("ONCEFLOW_ENABLE_CRASH_POINTS", "yes"),
        ("ONCEFLOW_HTTP_ALLOW_LOOPBACK", "true"),
        ("ONCEFLOW_REDISPATCH_AFTER_SECONDS", "nan"),
        ("ONCEFLOW_RUN_RETENTION_DAYS", "0"),
        ("ONCEFLOW_CRON_GRACE_SECONDS", "five minutes"),
    ],
)
def test_a_bad_value_is_refused_with_the_variables_name(variable: str, raw: str) -> None:
    with pytest.raises(SettingError, match=variable):
        Settings.from_env({variable: raw})


def test_cloud_sql_needs_its_iam_user() -> None:
    with pytest.raises(SettingError, match="DB_IAM_USER"):
        Settings.from_env({"INSTANCE_CONNECTION_NAME": "p:r:i"})


def test_every_setting_is_described_and_secrets_stay_out_of_repr() -> None:
    names = [spec.env for _, spec, _ in described()]
    assert len(names) == len(set(names))
    assert all(spec.description.strip() for _, spec, _ in described())
    env = {
        spec.env: "s3cret-value-that-is-long-enough-xx" for _, spec, _ in described() if spec.secret
    }
    assert "s3cret" not in repr(Settings.from_env(env))


def test_the_defaults_other_modules_name_are_the_settings_defaults() -> None:
    from shared.core.db import DEFAULT_POOL_SIZE, SessionLimits
    from shared.core.duty import SweepConfig
    from shared.steps.claim import LeaseConfig
    from shared.triggers.cron import CronSettings

    d = Settings()
    assert d.db_pool_size == DEFAULT_POOL_SIZE
    assert SessionLimits() == SessionLimits.from_env({})
    assert LeaseConfig() == LeaseConfig.from_env({})
    assert SweepConfig() == SweepConfig.from_env({})
    assert CronSettings() == CronSettings.from_env({})


def test_a_function_started_with_a_bad_value_refuses_to_serve_naming_it() -> None:
    """The first use parses everything: a deployment's typo fails loudly, with its name, in the
    process that reads it (here the sweep's first request)."""
    code = (
        "import functions_framework\n"
        "app = functions_framework.create_app('sweep', 'main.py')\n"
        "app.testing = True\n"
        "app.test_client().post('/')\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "NO_GCE_CHECK": "true",
        "HOME": str(ROOT),
        "SWEEP_BUDGET_SECONDS": "fifty",
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert out.returncode != 0
    assert "SWEEP_BUDGET_SECONDS must be a number of seconds" in out.stderr


def test_the_readme_configuration_reference_is_generated_from_the_settings() -> None:
    from devstack import config_reference

    readme = (ROOT / "README.md").read_text("utf-8")
    assert config_reference.rewritten(readme) == readme, (
        "the README's configuration reference differs from shared/core/settings.py:"
        " run `make config-reference`"
    )


def test_the_settings_module_imports_nothing_of_onceflow_but_the_errors() -> None:
    tree = ast.parse(Path(settings_module.__file__).read_text("utf-8"))
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shared")
    }
    assert imported == {"shared.core.errors"}


def test_a_named_secret_is_read_at_each_use_and_empty_is_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shared.core.settings import named_secret

    monkeypatch.delenv("SETTINGS_TEST_SECRET", raising=False)
    assert named_secret("SETTINGS_TEST_SECRET") is None
    monkeypatch.setitem(os.environ, "SETTINGS_TEST_SECRET", "one")  # no cache to clear
    assert named_secret("SETTINGS_TEST_SECRET") == "one"
    monkeypatch.setitem(os.environ, "SETTINGS_TEST_SECRET", "")
    assert named_secret("SETTINGS_TEST_SECRET") is None
