"""Standard Webhooks senders (https://www.standardwebhooks.com), declared as one `Provider`:
a generic scheme, so a webhook trigger may be signed with it too."""

from __future__ import annotations

from shared.providers.descriptor import Provider
from shared.providers.standard import normalize, signature

PROVIDER = Provider(
    name="standard",
    title="Standard Webhooks",
    verify=signature.verify,
    # Senders retry as they choose, commonly within a day or two: three days.
    redelivery_horizon_seconds=72 * 3600,
    normalize=normalize.normalize,
    kept_headers=("webhook-id", "webhook-timestamp"),
    hidden_headers=("webhook-signature",),
    generic=True,
)
