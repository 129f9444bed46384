"""The outbound blocks load through the catalog with the declarations the engine relies on."""

from __future__ import annotations

from shared.blocks import registry


def test_catalog_registers_crm_and_http_blocks() -> None:
    registry.load_catalog()
    create = registry.get("crm.create")
    assert create.creates and create.side_effect == "at_most_once"
    assert registry.get("crm.update").side_effect == "idempotent"
    for name in ("crm.get", "crm.search"):
        assert registry.get(name).side_effect == "none"
    http = registry.get("http.request")
    assert http.side_effect == "idempotent" and http.kind == "action"
    assert all(registry.get(n).price > 0 for n in ("crm.create", "crm.update", "http.request"))
