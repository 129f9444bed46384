"""`terraform validate`, offline: every `google_*` resource and data source in infra/, each
argument and nested block, checked against the google provider's own schema (read from the
`@cdktf/provider-google` package, see devstack/provider_schema.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devstack import provider_schema
from devstack.terraform import _parse

INFRA = Path(__file__).resolve().parent.parent / "infra"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return provider_schema.load()


def declared() -> list[tuple[str, str, str, dict[str, Any]]]:
    """(group, type, name, body) of every resource and data block in infra/."""
    found = []
    for path in sorted(INFRA.glob("*.tf")):
        parsed = _parse(path)
        for group in ("resource", "data"):
            for block in parsed.get(group, []):
                for rtype, named in block.items():
                    for name, body in named.items():
                        found.append((group, rtype, name, body))
    return found


def test_the_schema_knows_what_infra_uses(schema: dict[str, Any]) -> None:
    # The reduction itself: a few facts FACTS.md records about these resources.
    fn = schema["resource"]["google_cloudfunctions2_function"]["args"]
    assert fn["name"]["optional"] is False
    service = fn["service_config"]["block"]["args"]
    assert "max_instance_request_concurrency" in service
    assert service["secret_environment_variables"]["block"] is not None
    sub = schema["resource"]["google_pubsub_subscription"]["args"]
    assert "max_delivery_attempts" in sub["dead_letter_policy"]["block"]["args"]
    assert "google_project" in schema["data"]


def test_every_google_block_in_infra_matches_the_provider_schema(
    schema: dict[str, Any],
) -> None:
    problems: list[str] = []
    checked = 0
    for group, rtype, name, body in declared():
        if not rtype.startswith("google_"):
            continue
        kind = "resource" if group == "resource" else "data"
        tree = schema[kind].get(rtype)
        if tree is None:
            problems.append(f"{group} {rtype}.{name}: no such {kind} in the google provider")
            continue
        problems += provider_schema.check_block(body, tree, f"{rtype}.{name}")
        checked += 1
    assert checked > 30, checked
    assert problems == []


def test_the_check_catches_what_validate_would(schema: dict[str, Any]) -> None:
    tree = schema["resource"]["google_pubsub_subscription"]
    good = {"name": "s", "topic": "t", "dead_letter_policy": [{"max_delivery_attempts": 5}]}
    assert provider_schema.check_block(good, tree, "google_pubsub_subscription.s") == []
    typo = {"name": "s", "topic": "t", "dead_letter_policy": [{"max_delivery_atempts": 5}]}
    assert provider_schema.check_block(typo, tree, "x.s") == [
        "x.s.dead_letter_policy: unsupported argument or block 'max_delivery_atempts'"
    ]
    assert provider_schema.check_block({"name": "s"}, tree, "x.s") == [
        "x.s: missing required argument 'topic'"
    ]
