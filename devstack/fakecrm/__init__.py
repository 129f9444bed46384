"""A fake HubSpot server for tests and the local stack, over real HTTP.

It lives outside the deploy archive (`devstack/`) and behaves like the vendor where onceflow
depends on it: HubSpot-shaped CRM object endpoints on the date-based paths (404 on the numbered
ones, as for a new app, unless it plays a legacy app), **non-idempotent creates** (replaying a
create makes a second record, exactly what the vendor does), a unique `email` on contacts (409
with "Existing ID: N"), a portal's validation rules enforced on `2026-09` writes, service keys,
a legacy app's webhook subscription API, the 2026-03 OAuth token and introspection endpoints,
rate-limit headers, signed v3 webhooks sent to the inbox when its records change, and fault
injection per request or per rule. An admin API under `/_admin` exposes what it did.

Run it: `python -m devstack.fakecrm --port N --webhook-url URL --app-secret-env VAR`.
"""

from devstack.fakecrm.server import FakeCrm, FakeCrmConfig

__all__ = ["FakeCrm", "FakeCrmConfig"]
