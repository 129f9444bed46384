"""The README's configuration reference, written from `shared/core/settings.py`:
`make config-reference` (tests/test_settings.py fails when the README differs).

The table between the markers lists every `Settings` field (its variable, default and line),
then the variables whose names rows hold and those only libraries read. "Read in" is derived,
not declared: the modules that take the field off a settings object (`settings().x`, or a name
bound to `settings()`/`settings_from(...)` or annotated `Settings`).

Why modules and not functions: the import graph says too much. `webhook` imports the ops API
lazily for the approval-link page, and modules import each other for a constant, so "every
function whose entry point reaches the reading module" would list `webhook` for the retention
days; only imports at the top of a file would miss the lazily imported readers (the SSRF guard).
A module is exact, and its name says which function runs it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

from devstack.floorplan import Module
from devstack.floorplan import modules as shared_modules
from shared.core import settings as settings_module

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BEGIN = (
    "<!-- configuration reference: generated from shared/core/settings.py by"
    " `make config-reference`; edit there, not here -->"
)
END = "<!-- end of the configuration reference -->"
ACCESSORS = ("settings", "settings_from")


def _modules(root: Path) -> list[Module]:
    found = shared_modules(root)
    found += [
        Module(f"functions.{p.stem}", p)
        for p in sorted((root / "functions").glob("*.py"))
        if p.stem != "__init__"
    ]
    return found


def _property_fields(root: Path) -> dict[str, set[str]]:
    """{property of Settings: the fields it reads} (`project` reads two variables)."""
    tree = ast.parse((root / "shared" / "core" / "settings.py").read_text("utf-8"))
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Settings":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and any(
                    isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list
                ):
                    out[item.name] = {
                        n.attr
                        for n in ast.walk(item)
                        if isinstance(n, ast.Attribute)
                        and isinstance(n.value, ast.Name)
                        and n.value.id == "self"
                    }
    return out


def _is_accessor_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACCESSORS
    )


def fields_read(path: Path, names: set[str], properties: dict[str, set[str]]) -> set[str]:
    """The Settings fields a module takes off a settings object."""
    tree = ast.parse(path.read_text("utf-8"))
    holders: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_accessor_call(node.value):
            holders |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif (
            isinstance(node, ast.arg)
            and isinstance(node.annotation, ast.Name)
            and node.annotation.id == "Settings"
        ):
            holders.add(node.arg)
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        on_settings = _is_accessor_call(node.value) or (
            isinstance(node.value, ast.Name) and node.value.id in holders
        )
        if on_settings and node.attr in names:
            found.add(node.attr)
        elif on_settings and node.attr in properties:
            found |= properties[node.attr]
    return found


def readers(root: Path = ROOT) -> dict[str, list[str]]:
    """{field: the files that read it}, in path order."""
    names = {name for name, _, _ in settings_module.described()}
    properties = _property_fields(root)
    out: dict[str, list[str]] = {name: [] for name in names}
    for m in _modules(root):
        for name in fields_read(m.path, names, properties):
            out[name].append(m.path.relative_to(root).as_posix())
    return out


def _default(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _readers_cell(paths: list[str]) -> str:
    return ", ".join(f"`{p}`" for p in paths) or "—"


def table(root: Path = ROOT) -> str:
    """The reference as the README shows it, between its markers."""
    read_by = readers(root)
    rows = [
        "| variable | default | read in | meaning |",
        "|---|---|---|---|",
    ]
    for name, spec, default in settings_module.described():
        meaning = f"{spec.description} {spec.form.says}".strip()
        rows.append(
            f"| `{spec.env}` | {_default(default)} | {_readers_cell(read_by[name])} | {meaning} |"
        )
    for doc in settings_module.NAMED_SECRETS:
        rows.append(f"| {doc.variable} | {doc.default} | (named by a row) | {doc.description} |")
    for doc in settings_module.LIBRARY_VARIABLES:
        rows.append(f"| {doc.variable} | {doc.default} | Google's libraries | {doc.description} |")
    return "\n".join([BEGIN, "", *rows, "", END])


def rewritten(readme: str, root: Path = ROOT) -> str:
    """`readme` with the text between the markers replaced by the generated table."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"README.md has no configuration reference markers ({BEGIN!r} … {END!r})")
    return readme[:start] + table(root) + readme[end + len(END) :]


def main() -> int:
    text = README.read_text("utf-8")
    new = rewritten(text)
    if new != text:
        README.write_text(new, "utf-8")
        print("README.md: configuration reference rewritten")
    else:
        print("README.md: configuration reference up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
