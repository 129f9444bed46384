"""The HubSpot API versions onceflow calls, pinned here, and every path built from them.

HubSpot replaced its numbered paths (`/crm/v3/…`, `/crm/v4/…`, `/oauth/v1/…`,
`/webhooks/v3/…`) with date-based versions, `/api-name/YYYY-MM/resource` on the same host
(https://developers.hubspot.com/docs/api-reference/latest/overview). v1 to v3 go unsupported in
September 2027 and v4 on 30 March 2027; HubSpot says to move "directly from any legacy version
to date-based versioning … Do not use v3 or v4 as an intermediate step"
(https://developers.hubspot.com/changelog/legacy-apis-and-legacy-apps-whats-going-unsupported-and-when).
A version is released each March and September, never changes once out, and is supported at
least 18 months (https://developers.hubspot.com/spotlight). Nothing else in onceflow spells a
HubSpot path: the port (port.py), OAuth (oauth.py) and the fake HubSpot (devstack/fakecrm/)
all build theirs here, and tests/fakecrm_support.py fails a test whose port called a numbered
path (`is_numbered`).

Why these dates:
- CRM `2026-09` (GA 8 Sep 2026, https://developers.hubspot.com/changelog/fall-2026-spotlight):
  the newest version, the one HubSpot's migration guide recommends
  (https://developers.hubspot.com/docs/api-reference/legacy/migration-guide), supported until
  at least March 2028 — where `2026-03` runs out around September 2027, with v3. It is also the
  version that enforces a portal's admin-configured validation rules on every CRM write
  (https://developers.hubspot.com/changelog/crm-api-write-validation-enforcement): such a
  refusal is a 400 `VALIDATION_ERROR`, classified permanent with the rule's message in
  port.py `classify_response`.
- OAuth `2026-03`: `POST /oauth/2026-03/token` (code exchange, refresh, client credentials; form
  body only) and `POST /oauth/2026-03/token/introspect` are the only date-based OAuth endpoints
  HubSpot documents (https://developers.hubspot.com/docs/api-reference/2026-03/authentication/manage-oauth-tokens;
  HubSpot/hubspot-sdk-python `resources/auth/api.md`); no `2026-09` twin was found.
- Webhooks (legacy public apps' subscriptions) `2026-03`: `/webhooks/2026-03/{appId}/subscriptions`
  "can only be used with legacy public apps"
  (https://developers.hubspot.com/docs/api-reference/latest/webhooks/guide.md); no `2026-09`
  twin documented either.
- Webhooks journal `2026-03`: `/webhooks-journal/…/2026-03/…`
  (https://developers.hubspot.com/docs/api-reference/latest/webhooks-journal/guide).
Moving a family to a newer date is a change of its constant here (and the fake's served
versions follow it: devstack/fakecrm/server.py serves these and the ones before them).
"""

from __future__ import annotations

import re

CRM_VERSION = "2026-09"
OAUTH_VERSION = "2026-03"
WEBHOOKS_VERSION = "2026-03"
WEBHOOKS_JOURNAL_VERSION = "2026-03"
# The first CRM version that enforces a portal's validation rules on writes (see above).
VALIDATION_RULES_FROM = "2026-09"

# A numbered HubSpot path: a `v<N>` segment (`/crm/v3/objects`, `/crm/v4/associations`,
# `/oauth/v1/token`, `/webhooks/v3/1/subscriptions`, `/properties/v1/…`).
_NUMBERED = re.compile(r"/v\d+(?:/|$)")


def is_numbered(path: str) -> bool:
    """Whether `path` (a URL path, no host) is one of HubSpot's numbered API paths."""
    return bool(_NUMBERED.search(path))


def crm_objects(object_type: str, object_id: str | None = None) -> str:
    """Create (POST), and with `object_id` read (GET) and update (PATCH), a CRM record; a
    create's `associations` ride in its body (there is no separate association call)."""
    base = f"/crm/objects/{CRM_VERSION}/{object_type}"
    return base if object_id is None else f"{base}/{object_id}"


def crm_search(object_type: str) -> str:
    return f"/crm/objects/{CRM_VERSION}/{object_type}/search"


def oauth_token() -> str:
    """Code exchange, refresh and client credentials, all form-encoded in the body."""
    return f"/oauth/{OAUTH_VERSION}/token"


def oauth_introspect() -> str:
    """Which portal (`hub_id`) and app a token acts for, whether it is `active`."""
    return f"/oauth/{OAUTH_VERSION}/token/introspect"


def webhook_subscriptions(app_id: str, subscription_id: str | None = None) -> str:
    """A legacy public app's webhook subscriptions (and one of them)."""
    base = f"/webhooks/{WEBHOOKS_VERSION}/{app_id}/subscriptions"
    return base if subscription_id is None else f"{base}/{subscription_id}"


def journal(tail: str, *, local: bool) -> str:
    """The webhooks journal: the global one (every install of the app) or one portal's."""
    name = "journal-local" if local else "journal"
    return f"/webhooks-journal/{name}/{WEBHOOKS_JOURNAL_VERSION}/{tail}"


def journal_subscriptions() -> str:
    """The journal's per-install subscriptions (create or update, list, delete)."""
    return f"/webhooks-journal/subscriptions/{WEBHOOKS_JOURNAL_VERSION}"
