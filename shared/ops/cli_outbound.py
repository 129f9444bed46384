"""`onceflow outbound …`: outbound event subscriptions and their deliveries, through the ops
API (shared/ops/api/outbound.py). Kept out of shared/ops/cli.py, which registers these: its
parsers (`add_parsers`) and its commands (`COMMANDS`, keyed as cli.py's `REMOTE`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from shared.ingest.outbound import EVENT_TYPES
from shared.ops import terminal


class _Session(Protocol):
    """What a command uses of shared/ops/cli.py's `Session` (imported there, not here: cli.py
    imports this module)."""

    client: Any
    out: TextIO

    def say(self, data: Any, line: Callable[[], str]) -> None: ...

    def emit(self, data: Any, readable: Callable[[], None]) -> None: ...


def add_parsers(sub: Any, remote: argparse.ArgumentParser) -> None:
    outbound = sub.add_parser(
        "outbound",
        help="outbound events: subscribe a URL, list subscriptions and deliveries, re-send",
    )
    osub = outbound.add_subparsers(dest="action", required=True)
    p = osub.add_parser("subscribe", parents=[remote], help="subscribe a URL to event types")
    # Not `url`: that is the ops API's (`--url`, every remote command's).
    p.add_argument("target", metavar="URL", help="where the events are POSTed")
    p.add_argument(
        "--event", action="append", required=True, choices=EVENT_TYPES, help="repeatable"
    )
    p.add_argument(
        "--secret-env",
        required=True,
        metavar="VAR",
        help="the NAME of the env var holding the whsec_ secret (never the secret)",
    )
    p.add_argument("--tenant", help="required with an admin token")
    osub.add_parser("subscriptions", parents=[remote], help="subscriptions you can see")
    for action in ("enable", "disable"):
        p = osub.add_parser(action, parents=[remote], help=f"{action} a subscription")
        p.add_argument("subscription", metavar="SUBSCRIPTION_ID")
    p = osub.add_parser("deliveries", parents=[remote], help="deliveries, newest first")
    p.add_argument("--status", choices=("pending", "delivered", "given_up"))
    p.add_argument("--limit", type=int, default=50)
    p = osub.add_parser("resend", parents=[remote], help="send a delivery again (same id)")
    p.add_argument("delivery", metavar="DELIVERY_ID")


def _subscribe(s: _Session, args: argparse.Namespace) -> int:
    body = {"url": args.target, "event_types": args.event, "secret_env": args.secret_env}
    if args.tenant:
        body["tenant_id"] = args.tenant
    sub = s.client.call("POST", "/v1/outbound/subscriptions", body=body)
    s.say(sub, lambda: f"subscription {sub['id']}: {sub['url']} <- {', '.join(sub['event_types'])}")
    return 0


def _subscriptions(s: _Session, args: argparse.Namespace) -> int:
    result = s.client.call("GET", "/v1/outbound/subscriptions")
    rows = [
        (x["id"], x["tenant_id"], x["url"], ",".join(x["event_types"]), x["enabled"])
        for x in result["items"]
    ]
    headers = ("subscription", "tenant", "url", "events", "enabled")
    s.emit(result, lambda: terminal.table(rows, headers, s.out))
    return 0


def _enabled(s: _Session, args: argparse.Namespace, enabled: bool) -> int:
    path = f"/v1/outbound/subscriptions/{args.subscription}/enabled"
    sub = s.client.call("POST", path, body={"enabled": enabled})
    s.say(sub, lambda: f"subscription {sub['id']}: {'enabled' if sub['enabled'] else 'disabled'}")
    return 0


def _deliveries(s: _Session, args: argparse.Namespace) -> int:
    params = {"limit": args.limit, **({"status": args.status} if args.status else {})}
    result = s.client.call("GET", "/v1/outbound/deliveries", query=params)
    rows = [
        (d["id"], d["event_type"], d["status"], d["attempts"], d["url"], d["last_error"] or "")
        for d in result["items"]
    ]
    headers = ("delivery", "event", "status", "attempts", "url", "last error")
    s.emit(result, lambda: terminal.table(rows, headers, s.out))
    return 0


def _resend(s: _Session, args: argparse.Namespace) -> int:
    result = s.client.call("POST", f"/v1/outbound/deliveries/{args.delivery}/resend")
    s.say(result, lambda: f"delivery {result['id']}: sent again at the sweep's next pass")
    return 0


COMMANDS: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "outbound subscribe": _subscribe,
    "outbound subscriptions": _subscriptions,
    "outbound enable": lambda s, a: _enabled(s, a, True),
    "outbound disable": lambda s, a: _enabled(s, a, False),
    "outbound deliveries": _deliveries,
    "outbound resend": _resend,
}
