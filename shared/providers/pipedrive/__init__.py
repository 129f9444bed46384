"""Pipedrive: its webhooks (v2) as events, declared as one `Provider` (registry.py lists it).
No CRM adapter yet (issue 28)."""

from __future__ import annotations

from shared.providers.descriptor import Provider
from shared.providers.pipedrive import normalize, signature

PROVIDER = Provider(
    name="pipedrive",
    title="Pipedrive",
    verify=signature.verify,
    # No retry schedule we can rely on is documented (Pipedrive says only that non-2xx
    # deliveries are retried): three days. Longer only costs echo-marker rows.
    redelivery_horizon_seconds=72 * 3600,
    normalize=lambda body, _headers: normalize.normalize(body),
    event_types=normalize.event_types,
    # `meta.change_source` is `api` for a change made through the API, `app` in the web app,
    # and `meta.user_id` the user who made it; a token acts as its installing user (webhooks
    # v2 guide; docs/vendors/pipedrive.md §5). Not unique to onceflow (the same user's other
    # integrations write as `api` too), so it only rules echoes out; markers rule them in.
    api_author_source="api",
    # onceflow's neutral kinds in Pipedrive's names: its webhook `meta.entity` and API paths
    # (/api/v2/persons, /organizations, /deals, /activities; notes are v1 only: /v1/notes),
    # docs/vendors/pipedrive.md "Mapping to onceflow's port".
    object_kinds={
        "contact": "person",
        "company": "organization",
        "deal": "deal",
        "task": "activity",
        "note": "note",
    },
)
