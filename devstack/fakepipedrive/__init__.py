"""A fake Pipedrive for tests and the local stack, over real HTTP.

Like devstack/fakecrm/ (the fake HubSpot), it lives outside the deploy archive and behaves like
the vendor where that is inconvenient: non-idempotent creates, a burst limit per token and a
daily token budget with their headers and 429s, API tokens beside OAuth access tokens that
expire, and webhooks v2 delivered with HTTP Basic, retried, concurrently and sometimes twice.
The facts it imitates, with their sources: docs/vendors/pipedrive.md.
"""

from devstack.fakepipedrive.server import FakePipedrive, FakePipedriveConfig
from devstack.fakepipedrive.webhooks import DeliveryPolicy

__all__ = ["DeliveryPolicy", "FakePipedrive", "FakePipedriveConfig"]
