"""`python -m devstack.fakeslack [port]`: serve the fake Slack Web API (the local stack points
ONCEFLOW_SLACK_API_URL at its /api). Its bot token and signing secret come from
FAKESLACK_BOT_TOKEN / FAKESLACK_SIGNING_SECRET (defaults below), interactions go to
FAKESLACK_INTERACTION_URL."""

from __future__ import annotations

import os
import sys
import time

from devstack.fakeslack.server import FakeSlack

DEFAULT_BOT_TOKEN = "xoxb-fake-local"  # noqa: S105 - the local stack's fake
DEFAULT_SIGNING_SECRET = "fake-local-signing-secret"  # noqa: S105 - the local stack's fake


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8094
    fake = FakeSlack(
        bot_token=os.environ.get("FAKESLACK_BOT_TOKEN", DEFAULT_BOT_TOKEN),
        signing_secret=os.environ.get("FAKESLACK_SIGNING_SECRET", DEFAULT_SIGNING_SECRET),
        interaction_url=os.environ.get("FAKESLACK_INTERACTION_URL"),
        port=port,
    ).start()
    print(f"fake Slack on {fake.api_url}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
