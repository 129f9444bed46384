"""Pipedrive: everything onceflow knows about it, declared as one `Provider`.

Its webhooks' HTTP Basic check (`signature.py`), the events its v2 bodies become
(`normalize.py`), the CRM adapter with its error classes, rate-limit headers and webhooks API
(`port.py`) and the OAuth install and refresh (`oauth.py`); API-token connections use the port
with the token. Vendor facts and their sources: docs/vendors/pipedrive.md.
shared/providers/registry.py lists it; nothing outside shared/providers/ names it.
"""

from __future__ import annotations

from shared.providers.descriptor import Crm, OAuth, Provider
from shared.providers.pipedrive import kinds, normalize, oauth, signature
from shared.providers.pipedrive.port import PipedrivePort

PROVIDER = Provider(
    name="pipedrive",
    title="Pipedrive",
    verify=signature.verify,
    # A failed first attempt is retried 3 times, at 3, 30 and 150 s, with a 10 s timeout each,
    # then dropped (https://pipedrive.readme.io/docs/guide-for-webhooks-v2, "Retry logic"): all
    # redelivery ends about 4 minutes after the event. Pipedrive's own queueing before the
    # first attempt is undocumented; three days leaves a wide margin (it only costs echo-marker
    # rows).
    redelivery_horizon_seconds=72 * 3600,
    normalize=lambda body, _headers: normalize.normalize(body),
    event_types=normalize.event_types,
    # `meta.change_source` is `api` for a change made through the API, `app` in the web app,
    # and `meta.user_id` the user who made it; a token acts as its installing user (webhooks
    # v2 guide; docs/vendors/pipedrive.md §5). Not unique to onceflow (the same user's other
    # integrations write as `api` too), so it only rules echoes out; markers rule them in.
    api_author_source="api",
    object_kinds=kinds.OBJECT_KINDS,
    crm=Crm(
        port=PipedrivePort,
        capabilities=PipedrivePort.capabilities,
        # The properties that name a record: v2 persons and organizations have `name`, deals
        # `title`, activities `subject` (V2M); under Pipedrive's names and onceflow's.
        label_properties={
            "contact": ("name",),
            "company": ("name",),
            "deal": ("title",),
            "task": ("subject",),
        },
        # No record pages: Pipedrive's UI addresses name the company domain
        # (`{domain}.pipedrive.com/person/1`), which can change, while a connection's account
        # is the company id (meta.company_id, users/me): they cannot be matched.
        record_pages=None,
        rate_budget=True,  # port.read_rate_limit
    ),
    oauth=OAuth(
        authorize_url=oauth.authorize_url,
        exchange_code=oauth.exchange_code,
        token_account=oauth.token_account,
        refresher=oauth.pipedrive_refresher,
    ),
    # onceflow event actions -> webhook `event_action`s (/v1/webhooks, docs/vendors/
    # pipedrive.md §1.4). No per-field subscriptions: a property change is one `change`
    # webhook per object, whatever fields are watched (the normaliser names them).
    subscription_event_kinds={
        "created": "create",
        "property_changed": "change",
        "deleted": "delete",
    },
)
