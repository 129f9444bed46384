"""Every fake HubSpot a test starts is checked when the test ends: no request reached it on a
numbered API path (`/crm/v3/…`, `/oauth/v1/…`, `/webhooks/v3/…`). HubSpot's numbered versions
go unsupported in 2027 and a new app cannot call them (shared/providers/hubspot/versions.py);
the fake also answers them 404 by default, but a 404 can pass unnoticed in a test that expects
one (a missing record, say), so the recorded paths are what decides. A fake started as a legacy
app (`FakeCrmConfig(new_app=False)`) is exempt: numbered calls are what it is there to serve."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devstack.fakecrm import FakeCrm


@pytest.fixture(autouse=True)
def no_numbered_hubspot_paths(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    started: list[FakeCrm] = []
    start = FakeCrm.start

    def start_and_remember(self: FakeCrm) -> FakeCrm:
        started.append(self)
        return start(self)

    monkeypatch.setattr(FakeCrm, "start", start_and_remember)
    yield
    numbered = [
        call for fake in started if fake.config.new_app for call in fake.numbered_requests()
    ]
    assert not numbered, f"HubSpot called on numbered API paths: {numbered}"
