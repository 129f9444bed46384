"""HubSpot: everything onceflow knows about it, declared as one `Provider`.

Its webhook signatures (`signature.py`), the events its bodies become (`normalize.py`), its
apps' one URL for all their portals (`apps.py`), the OAuth install and refresh (`oauth.py`),
its record pages in the UI (`records.py`), its webhooks journal (`journal.py`) and the CRM
adapter with its subscriptions, error classes and rate-limit headers (`port.py`).
shared/providers/registry.py lists it; nothing outside shared/providers/ names it.
"""

from __future__ import annotations

from shared.providers.descriptor import AppWebhooks, Crm, OAuth, Provider
from shared.providers.hubspot import apps, journal, normalize, oauth, project, records, signature
from shared.providers.hubspot.port import HubSpotPort

PROVIDER = Provider(
    name="hubspot",
    title="HubSpot",
    verify=signature.verify,
    # "we will attempt to re-send failed notifications up to 10 times ... with an exponential
    # backoff based on the next attemptNumber. So the first retry will happen in 2 minutes, the
    # second retry in 4 minutes, the third retry in 8 minutes, etc."
    # (https://developers.hubspot.com/docs/methods/webhooks/webhooks-overview, "Retries"; the
    # newer https://developers.hubspot.com/docs/api/webhooks says 10 retries over 24 hours).
    # 2 + 4 + ... + 1024 minutes = 2,046 minutes = 34.1 hours after the first attempt; 36 hours
    # leaves room for the first attempt's own delay and the attempts' timeouts.
    redelivery_horizon_seconds=36 * 3600,
    # A webhook body, or a journal entry's file read by shared/ingest/journal.py (journal.py).
    normalize=lambda body, headers: normalize.normalize(
        journal.webhook_body(body, headers) if journal.is_journal_row(headers) else body
    ),
    event_types=normalize.event_types,
    kept_headers=("x-hubspot-request-timestamp",),
    hidden_headers=("x-hubspot-signature", "x-hubspot-signature-v3"),
    crm=Crm(
        port=HubSpotPort,
        capabilities=HubSpotPort.capabilities,
        app_subscriptions=True,
        label_properties={
            "contact": ("firstname", "lastname"),
            "company": ("name",),
            "deal": ("dealname",),
            "task": ("hs_task_subject",),
            "ticket": ("subject",),
        },
        record_pages=records.RECORD_PAGES,
        # A private app's access token (legacy private apps: existing ones keep working) or a
        # service key, their replacement for single-portal integrations: both static bearers
        # with the same REST scopes and limits; a service key cannot be used for webhooks
        # (https://developers.hubspot.com/changelog/service-keys,
        # https://developers.hubspot.com/docs/apps/developer-platform/build-apps/authentication/account-service-keys).
        credential_kinds=("token", "service_key"),
        rate_budget=True,  # port.read_rate_limit
    ),
    app=AppWebhooks(event_account=apps.event_account, secret_env=apps.secret_env),
    oauth=OAuth(
        authorize_url=oauth.authorize_url,
        exchange_code=oauth.exchange_code,
        token_account=oauth.token_account,
        refresher=oauth.hubspot_refresher,
    ),
    # HubSpot's CRM objects are named as onceflow names them (/crm/objects/2026-09/contacts,
    # …/tasks and …/notes: https://developers.hubspot.com/docs/api/crm/understanding-the-crm).
    object_kinds={k: k for k in ("contact", "company", "deal", "task", "note")},
    # onceflow event actions (shared/normalize/event.py naming) -> a legacy app's webhook
    # subscription event kinds (the same names as the v3 API had).
    subscription_event_kinds={
        "created": "creation",
        "property_changed": "propertyChange",
        "deleted": "deletion",
        "privacy_deleted": "privacyDeletion",
        "merged": "merge",
        "restored": "restore",
        "association_changed": "associationChange",
    },
    journal=journal.JOURNAL,
    # Project-based apps: webhooks declared in the project's files (project.py).
    project=project.PROJECT,
)
