"""A fake HubSpot server for tests and the local stack, over real HTTP.

It lives outside the deploy archive (`devstack/`) and behaves like the vendor where onceflow
depends on it: HubSpot-shaped CRM v3 object endpoints, **non-idempotent creates** (replaying a
create makes a second record, exactly what the vendor does), a unique `email` on contacts (409
with "Existing ID: N"), the webhooks v3 subscription API, rate-limit headers, signed v3
webhooks sent to the inbox when its records change, and fault injection per request or per
rule. An admin API under `/_admin` exposes what it did.

Run it: `python -m devstack.fakecrm --port N --webhook-url URL --app-secret-env VAR`.
"""

from devstack.fakecrm.server import FakeCrm, FakeCrmConfig

__all__ = ["FakeCrm", "FakeCrmConfig"]
