"""`python -m devstack.fakecrm --port N --webhook-url URL --app-secret-env VAR`

The app secret is read from the environment variable named by --app-secret-env (never from
the command line, where `ps` would show it). Prints one JSON line with the URL once listening.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from types import FrameType

from devstack.fakecrm.server import FakeCrm, FakeCrmConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.fakecrm", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--webhook-url", default=None, help="where signed v3 webhooks go")
    parser.add_argument("--app-secret-env", default=None, help="env var holding the app secret")
    parser.add_argument("--token-env", default=None, help="env var holding the bearer token")
    parser.add_argument("--app-id", default="424242")
    parser.add_argument("--portal-id", type=int, default=62515)
    parser.add_argument("--rate-limit-max", type=int, default=190)
    parser.add_argument("--require-subscriptions", action="store_true")
    parser.add_argument("--search-lag-seconds", type=float, default=0.0)
    parser.add_argument("--delivery", choices=("serial", "realistic"), default="serial")
    args = parser.parse_args(argv)

    config = FakeCrmConfig(
        host=args.host,
        port=args.port,
        webhook_url=args.webhook_url,
        app_id=args.app_id,
        portal_id=args.portal_id,
        rate_limit_max=args.rate_limit_max,
        require_subscriptions=args.require_subscriptions,
        search_lag_seconds=args.search_lag_seconds,
        delivery=args.delivery,
    )
    if args.app_secret_env:
        secret = os.environ.get(args.app_secret_env)
        if not secret:
            print(f"environment variable {args.app_secret_env} is not set", file=sys.stderr)
            return 2
        config.app_secret = secret
        config.oauth_client_secret = secret  # HubSpot: one client secret, signatures and OAuth
    if args.token_env:
        config.token = os.environ.get(args.token_env) or None
    fake = FakeCrm(config)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(json.dumps({"fakecrm": fake.url, "app_id": config.app_id}), flush=True)
    try:
        fake.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        fake.server.server_close()
        fake.webhooks.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
