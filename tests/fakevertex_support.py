"""The fake Vertex AI endpoint as the `ai.generate` block reaches it: ONCEFLOW_VERTEX_BASE_URL
points the SDK at it (with a static token, so nothing reaches Google), and the test tenant is
given a Vertex project and location."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from devstack.fakevertex.server import FakeVertex
from shared.core.db import Database
from tests.steps_support import TENANT

PROJECT = "onceflow-test"
LOCATION = "europe-west1"


@contextmanager
def fake_vertex(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVertex]:
    server = FakeVertex().start()
    monkeypatch.setenv("ONCEFLOW_VERTEX_BASE_URL", server.base_url)
    try:
        yield server
    finally:
        server.stop()


def configure_tenant(db: Database, *, model: str | None = None) -> None:
    with db.transaction() as tx:
        tx.execute(
            "UPDATE tenants SET vertex_project = :p, vertex_location = :l, vertex_model = :m"
            " WHERE id = :t",
            p=PROJECT,
            l=LOCATION,
            m=model,
            t=TENANT,
        )
