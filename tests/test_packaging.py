"""The buildpack installs requirements.txt; pip installs pyproject's dependencies. They must be
the same pins, or the cloud runs different code from the tests."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([A-Za-z0-9.+!-]+)$")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_lines(path: Path) -> list[str]:
    lines = []
    for raw in path.read_text("utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


def _pins(lines: list[str], source: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in lines:
        match = _PIN.match(line.replace(" ", ""))
        assert match, f"{source}: `{line}` is not pinned with == (name==version)"
        name = _normalise(match[1])
        assert name not in pins, f"{source}: {match[1]} is listed twice"
        pins[name] = match[3]
    return pins


def test_every_runtime_requirement_is_pinned() -> None:
    pins = _pins(_requirement_lines(ROOT / "requirements.txt"), "requirements.txt")
    assert "functions-framework" in pins


def test_requirements_txt_equals_pyproject_dependencies() -> None:
    requirements = _pins(_requirement_lines(ROOT / "requirements.txt"), "requirements.txt")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    declared = _pins(list(pyproject["project"]["dependencies"]), "pyproject.toml")
    only_txt = sorted(set(requirements) - set(declared))
    only_toml = sorted(set(declared) - set(requirements))
    assert not only_txt, f"in requirements.txt but not pyproject dependencies: {only_txt}"
    assert not only_toml, f"in pyproject dependencies but not requirements.txt: {only_toml}"
    differing = {
        n: (requirements[n], declared[n]) for n in requirements if requirements[n] != declared[n]
    }
    assert not differing, f"versions differ (requirements.txt, pyproject.toml): {differing}"


def test_dev_requirements_are_pinned_and_include_runtime() -> None:
    lines = _requirement_lines(ROOT / "requirements-dev.txt")
    assert "-r requirements.txt" in lines, "requirements-dev.txt must include requirements.txt"
    dev = _pins([ln for ln in lines if not ln.startswith("-r")], "requirements-dev.txt")
    runtime = _pins(_requirement_lines(ROOT / "requirements.txt"), "requirements.txt")
    clash = sorted(set(dev) & set(runtime))
    assert not clash, f"pinned in both requirements files (pin once, in requirements.txt): {clash}"
