"""Providers are folders reached through one registry (issue 25 item 5): nothing outside
shared/providers/ names a vendor in code, and what the engine asks the registry agrees with the
routes it serves and the database's own lists.

What counts as naming a vendor, outside shared/providers/ (and in functions/, main.py):
- an import of a vendor's folder (`shared.providers.hubspot...`), or any identifier containing
  a vendor's name (a variable, attribute, function, class, argument, keyword, alias);
- a string literal that contains the vendor's name as a lower-case word and is a token (no
  whitespace: `"hubspot"`, `"/hubspot/app/"`, `"x-hubspot-signature"`,
  `"hubspot.contact.created"`, an f-string's `"/v1/apps/hubspot/"`), or any such literal that
  is compared against, used as a dict key or a subscript. That is how code keys on a vendor:
  provider names, routes, headers, event types.
Not counted: docstrings, comments, and prose meant for people (messages, descriptions: text
with spaces, like "HubSpot refuses a task without ..." or "e.g. hubspot.contact.created" in a
help text). They explain *why* a neutral rule exists, cite the vendor's docs or give an
example (STYLE.md: comments say why); they cannot make the code branch on a vendor, which is
the boundary this test holds. A vendor is a registered provider that is not a generic webhook
scheme (`standard`, `hmac` are generic: their names are ordinary words).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.core.db import Database
from shared.providers import registry
from shared.providers.install import CALLBACK_PATH, CALLBACK_PATHS, callback_path
from tests.ops_support import (
    bearer,
    mint,
)

ROOT = Path(__file__).resolve().parent.parent
VENDORS = tuple(p.name for p in registry.ALL if not p.generic)


def _checked_files() -> list[Path]:
    files = [
        p for p in (ROOT / "shared").rglob("*.py") if "providers" not in p.relative_to(ROOT).parts
    ]
    return sorted([*files, *(ROOT / "functions").glob("*.py"), ROOT / "main.py"])


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                found.add(id(body[0].value))
    return found


def _identifiers(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Attribute):
        yield node.attr
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        yield node.name
    elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
        yield node.arg
    elif isinstance(node, ast.alias):
        yield node.name
        if node.asname:
            yield node.asname
    elif isinstance(node, ast.ImportFrom) and node.module:
        yield node.module


def _keyed_on(tree: ast.AST) -> set[int]:
    """String literals the code compares against or indexes with (however long)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        operands: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            operands = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Subscript):
            operands = [node.slice]
        elif isinstance(node, ast.match_case):
            operands = [node.pattern]
        for operand in operands:
            found.update(id(n) for n in ast.walk(operand) if isinstance(n, ast.Constant))
    return found


def vendor_mentions(path: Path) -> list[str]:
    """Where the module names a vendor in code: `line: what`."""
    tree = ast.parse(path.read_text("utf-8"))
    docstrings, keyed_on = _docstrings(tree), _keyed_on(tree)
    words = [re.compile(rf"(?<![a-z0-9]){v}(?![a-z0-9])") for v in VENDORS]
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        for name in _identifiers(node):
            if any(v in name.lower() for v in VENDORS):
                found.append(f"{line}: identifier {name}")
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and (id(node) in keyed_on or not any(c.isspace() for c in node.value))
            and any(w.search(node.value) for w in words)
        ):
            found.append(f"{line}: string {node.value[:60]!r}")
    return found


def test_no_module_outside_the_providers_names_a_vendor() -> None:
    offending = {
        str(path.relative_to(ROOT)): mentions
        for path in _checked_files()
        if (mentions := vendor_mentions(path))
    }
    assert offending == {}, "name a vendor outside shared/providers/ (ask the registry)"


def test_the_check_catches_each_way_of_naming_a_vendor(tmp_path: Path) -> None:
    """The boundary test's own rules, on a module that breaks each of them."""
    module = tmp_path / "m.py"
    module.write_text(
        '"""About HubSpot and hubspot: a docstring is prose."""\n'
        "from shared.providers.hubspot.port import HubSpotPort\n"
        "import shared.providers.pipedrive\n"
        "def f(provider: str, hubspot_url: str) -> bool:\n"
        "    # hubspot in a comment is prose too\n"
        '    message = "HubSpot refuses it, see hubspot.contact.created"  # prose\n'
        '    return provider == "hubspot" or provider in ("pipedrive",) or message == "a hubspot"\n'
        'PATH = f"/hubspot/app/{1}"\n'
        'HEADER = "x-hubspot-signature"\n'
    )
    found = vendor_mentions(module)
    assert any("identifier shared.providers.hubspot.port" in m for m in found)
    assert any("identifier HubSpotPort" in m for m in found)
    assert any("identifier shared.providers.pipedrive" in m for m in found)
    assert any("identifier hubspot_url" in m for m in found)
    assert sum("string 'hubspot'" in m for m in found) == 1
    assert any("string 'pipedrive'" in m for m in found)
    assert any("string 'a hubspot'" in m for m in found)  # compared against: counted
    assert any("'/hubspot/app/'" in m for m in found)
    assert any("'x-hubspot-signature'" in m for m in found)
    assert not any(m.startswith(("1:", "5:", "6:")) for m in found), found


def test_each_provider_is_one_registry_entry_with_its_declared_parts() -> None:
    names = [p.name for p in registry.ALL]
    assert len(names) == len(set(names))
    assert tuple(names) == registry.PROVIDERS
    assert set(registry.REDELIVERY_HORIZON_SECONDS) == set(names)
    for provider in registry.ALL:
        assert registry.get(provider.name) is provider
        if provider.app is not None:  # routing by account needs its events' account and app
            assert provider.normalize is not None
        if provider.oauth is not None:  # an OAuth connection's port refreshes its token
            assert provider.crm is not None
    assert set(registry.known_event_types()) == {
        p.name for p in registry.ALL if p.event_types is not None
    }


def test_routes_come_from_the_registry() -> None:
    from shared.ingest import app_webhook

    for name in registry.app_providers():
        assert app_webhook.is_app_path(f"/{name}/app/123")
    for provider in registry.ALL:
        if provider.app is None:
            assert not app_webhook.is_app_path(f"/{provider.name}/app/123")
    assert {callback_path(p) for p in registry.oauth_providers()} == CALLBACK_PATHS
    assert CALLBACK_PATH in CALLBACK_PATHS


def test_the_ops_app_routes_take_the_providers_the_registry_gives_apps(
    db: Database, client: Any
) -> None:
    """`/v1/apps/{provider}/...`: the document lists the registry's app (OAuth) providers, and
    any other provider is a 404 that says why, whether it is known without apps or unknown."""
    spec = client.get("/openapi.json").get_json()
    for path, offered in (
        ("/v1/apps/{provider}/{app_id}", registry.app_providers()),
        ("/v1/apps/{provider}/{app_id}/installs", registry.oauth_providers()),
        ("/v1/apps/{provider}/{app_id}/installs/confirm", registry.oauth_providers()),
    ):
        (op,) = spec["paths"][path].values()
        (param,) = [p for p in op["parameters"] if p["name"] == "provider"]
        assert param["schema"]["enum"] == list(offered)
    admin = bearer(mint(db, None))
    without_apps = [p.name for p in registry.ALL if p.app is None and p.oauth is None]
    assert without_apps
    for name in without_apps:
        for r in (
            client.get(f"/v1/apps/{name}/123", headers=admin),
            client.post(f"/v1/apps/{name}/123/installs", json={"tenant_id": "acme"}, headers=admin),
            client.post(
                f"/v1/apps/{name}/123/installs/confirm",
                json={"confirm_code": "x" * 43},
                headers=admin,
            ),
        ):
            assert r.status_code == 404
            assert r.get_json()["code"] == "not_found"
            assert f"provider {name!r} has no" in r.get_json()["message"]
    r = client.get("/v1/apps/nosuchvendor/123", headers=admin)
    assert r.status_code == 404
    assert "no such provider 'nosuchvendor'" in r.get_json()["message"]


@pytest.mark.parametrize(
    ("table", "names"),
    [
        ("connections", lambda: set(registry.PROVIDERS)),
        # An app row is an app's webhook URL, its OAuth client, or both (0200_oauth_installs).
        ("provider_apps", lambda: set(registry.app_providers()) | set(registry.oauth_providers())),
    ],
)
def test_the_database_accepts_exactly_the_registered_providers(
    db: Database, table: str, names: Callable[[], set[str]]
) -> None:
    """The CHECK constraints on `provider` list what the registry lists: a provider added to one
    and not the other would be refused by the database, or stored with no code to run it."""
    with db.transaction() as tx:
        checks = [
            str(r["def"])
            for r in tx.all(
                "SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint"
                " WHERE conrelid = CAST(:table AS regclass) AND contype = 'c'",
                table=table,
            )
            if re.search(r"\(\(provider\b", str(r["def"]))
        ]
    assert len(checks) == 1, checks
    allowed = set(re.findall(r"'([a-z_]+)'::text", checks[0]))
    assert allowed == names()
