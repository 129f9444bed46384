"""HubSpot apps: one webhook URL for every portal that installed the app.

Each event of an app's delivery names its `portalId` and `appId`
(https://developers.hubspot.com/docs/api/webhooks); shared/accounts/provider_apps.py routes it
to the portal's connection by them. Deployed, an app's secrets are in the variables
`secret_env` names (`HUBSPOT_APP_<app id>_CLIENT_SECRET`, ...): infra/secrets.tf declares one
Secret Manager secret per app and secret, and hands each only to the functions
`provider_apps.APP_SECRET_READERS` lists.
"""

from __future__ import annotations

from shared.normalize.event import NormalizedEvent


def secret_env(app_id: str, name: str) -> str:
    """The environment variable a deployed function finds the app's secret `name` in."""
    return f"HUBSPOT_APP_{app_id}_{name.upper()}"


def event_account(event: NormalizedEvent) -> tuple[str | None, str | None]:
    """(portal id, app id) the event names."""
    portal, app = event.payload.get("portalId"), event.payload.get("appId")
    return (None if portal is None else str(portal), None if app is None else str(app))
