"""`python -m devstack.fakepipedrive --port N [--api-token-env VAR] [--time-factor F]`

The API token is read from the environment variable named by --api-token-env (never from the
command line, where `ps` would show it); it acts as --user-id. Prints one JSON line with the
URL once listening. Webhooks are made through its own `/v1/webhooks`, as at Pipedrive.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from types import FrameType

from devstack.fakepipedrive.server import FakePipedrive, FakePipedriveConfig
from devstack.fakepipedrive.webhooks import DeliveryPolicy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.fakepipedrive", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-token-env", default=None, help="env var holding an API token")
    parser.add_argument("--user-id", type=int, default=12415231, help="the API token's user")
    parser.add_argument("--burst-api-token", type=int, default=20)
    parser.add_argument("--burst-oauth", type=int, default=80)
    parser.add_argument("--daily-budget", type=int, default=30_000)
    parser.add_argument("--time-factor", type=float, default=1.0, help="scales retry waits")
    parser.add_argument("--duplicate-every", type=int, default=0)
    args = parser.parse_args(argv)

    config = FakePipedriveConfig(
        host=args.host,
        port=args.port,
        burst_api_token=args.burst_api_token,
        burst_oauth=args.burst_oauth,
        daily_budget=args.daily_budget,
        delivery=DeliveryPolicy(time_factor=args.time_factor, duplicate_every=args.duplicate_every),
    )
    if args.api_token_env:
        token = os.environ.get(args.api_token_env)
        if not token:
            print(f"environment variable {args.api_token_env} is not set", file=sys.stderr)
            return 2
        config.api_tokens = {token: args.user_id}
    fake = FakePipedrive(config)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(json.dumps({"fakepipedrive": fake.url}), flush=True)
    try:
        fake.server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        fake.sender.stop()
        fake.server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
