"""`onceflow messaging` and `onceflow approvers`: how a tenant's approvals reach people
(issue 31 item 4), over the ops API (`/v1/messaging`, `/v1/approver-identities`), so an
operator never needs SQL for them. Registered by shared/ops/cli.py (`parsers`, `REMOTE`).

  messaging show                      the tenant's Slack app and SMTP server (variable names)
  messaging slack --bot-token-env VAR --signing-secret-env VAR   (or --clear)
  messaging smtp --host H --port P --from ADDR [--username U --password-env VAR]  (or --clear)
  approvers add (--slack UID | --email ADDR) --user LABEL
  approvers list [--user LABEL]
  approvers remove (--slack UID | --email ADDR)

Every command takes `--tenant` (required with an admin token). The settings name environment
variables; a secret itself is never given to, stored by or shown by onceflow.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from shared.ops import terminal
from shared.ops.client import OpsClient

DONE = 0  # cli.EXIT_OK; errors are the API's, mapped to exit codes by cli._dispatch


class Session(Protocol):
    """What a command here uses of cli.Session (cli.py imports this module, so not the class:
    that would be an import circle)."""

    client: OpsClient
    out: TextIO

    def say(self, data: Any, line: Callable[[], str]) -> None: ...

    def emit(self, data: Any, readable: Callable[[], None]) -> None: ...


def _print_settings(s: Session, m: dict[str, Any]) -> None:
    slack, smtp = m["slack"], m["smtp"]
    print(f"tenant {m['tenant_id']}", file=s.out)
    if slack:
        print(
            f"  slack: bot token in ${slack['bot_token_env']}{_here(slack['bot_token_set'])},"
            f" signing secret in ${slack['signing_secret_env']}"
            f"{_here(slack['signing_secret_set'])}",
            file=s.out,
        )
    else:
        print("  slack: (none)", file=s.out)
    if smtp:
        login = (
            f", login {smtp['username']} (password in ${smtp['password_env']}"
            f"{_here(smtp['password_set'])})"
            if smtp["username"]
            else ""
        )
        tls = "STARTTLS" if smtp["starttls"] else "no TLS"
        port = smtp["port"] or 25
        print(
            f"  smtp: {smtp['host']}:{port} from {smtp['sender']}, {tls}{login}",
            file=s.out,
        )
    else:
        print("  smtp: (none)", file=s.out)


def _here(is_set: bool | None) -> str:
    """Whether the ops function has the variable (the function that reads it needs it too)."""
    return "" if is_set else " (not set in ops)"


def approval_lines(step: dict[str, Any]) -> list[str]:
    """How a parked approval step reached people, for `onceflow show`: its votes against its
    quorum, and each Slack or email message's state (with the last error of one not sent)."""
    w = step.get("waits_for")
    if not w or w["kind"] != "approval":
        return []
    approving = [v for v in w["votes"] if v["counted"] and v["decision"] == "approved"]
    votes = ", ".join(
        f"{v['voter']} {v['decision']} via {v['via']}{'' if v['counted'] else ' (late)'}"
        for v in w["votes"]
    )
    lines = [f"{step['step_key']}: {len(approving)} of {w['required']} approvals"
             + (f": {votes}" if votes else "")]  # fmt: skip
    for m in w["messages"]:
        line = f"  {m['channel']} {m['purpose']} to {m['recipient']}: {m['state']}"
        if m["state"] != "sent":
            line += f", {m['attempts']} attempt{'' if m['attempts'] == 1 else 's'}"
            if m["last_error"]:
                line += f", last error: {m['last_error']}"
        lines.append(line)
    return lines


def _messaging_show(s: Session, args: argparse.Namespace) -> int:
    m = s.client.call("GET", "/v1/messaging", query={"tenant_id": args.tenant})
    s.emit(m, lambda: _print_settings(s, m))
    return DONE


def _messaging_slack(s: Session, args: argparse.Namespace) -> int:
    body = {
        "tenant_id": args.tenant,
        "bot_token_env": None if args.clear else args.bot_token_env,
        "signing_secret_env": None if args.clear else args.signing_secret_env,
    }
    m = s.client.call("POST", "/v1/messaging/slack", body=body)
    s.emit(m, lambda: _print_settings(s, m))
    return DONE


def _messaging_smtp(s: Session, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"tenant_id": args.tenant, "host": None}
    if not args.clear:
        body.update(
            host=args.host,
            port=args.port,
            sender=args.sender,
            username=args.username,
            password_env=args.password_env,
            starttls=not args.no_starttls,
        )
    m = s.client.call("POST", "/v1/messaging/smtp", body=body)
    s.emit(m, lambda: _print_settings(s, m))
    return DONE


def _who(args: argparse.Namespace) -> dict[str, Any]:
    return {"tenant_id": args.tenant, "slack_user_id": args.slack, "email": args.email}


def _approvers_add(s: Session, args: argparse.Namespace) -> int:
    i = s.client.call("POST", "/v1/approver-identities", body={**_who(args), "user": args.user})
    s.say(i, lambda: f"{i['channel']} {i['external_id']} is {i['user']} in {i['tenant_id']}")
    return DONE


def _approvers_remove(s: Session, args: argparse.Namespace) -> int:
    i = s.client.call("POST", "/v1/approver-identities/remove", body=_who(args))
    s.say(i, lambda: f"{i['channel']} {i['external_id']} ({i['user']}): removed")
    return DONE


def _approvers_list(s: Session, args: argparse.Namespace) -> int:
    query = {"tenant_id": args.tenant, "user": args.user}
    result = s.client.call("GET", "/v1/approver-identities", query=query)
    s.emit(
        result,
        lambda: terminal.table(
            [(i["tenant_id"], i["user"], i["channel"], i["external_id"]) for i in result["items"]],
            ("tenant", "user", "channel", "identity"),
            s.out,
        ),
    )
    return DONE


REMOTE: dict[str, Callable[[Session, argparse.Namespace], int]] = {
    "messaging show": _messaging_show,
    "messaging slack": _messaging_slack,
    "messaging smtp": _messaging_smtp,
    "approvers add": _approvers_add,
    "approvers list": _approvers_list,
    "approvers remove": _approvers_remove,
}


def parsers(sub: Any, remote: argparse.ArgumentParser) -> None:
    tenant = argparse.ArgumentParser(add_help=False)
    tenant.add_argument("--tenant", help="required with an admin token")
    parents = [remote, tenant]

    messaging = sub.add_parser(
        "messaging", help="how approvals reach people: a tenant's Slack app and SMTP server"
    )
    msub = messaging.add_subparsers(dest="action", required=True)
    msub.add_parser("show", parents=parents, help="the tenant's Slack and SMTP settings")
    p = msub.add_parser("slack", parents=parents, help="set the tenant's Slack app")
    p.add_argument("--bot-token-env", metavar="VAR", help="the NAME of the bot token's variable")
    p.add_argument(
        "--signing-secret-env", metavar="VAR", help="the NAME of the signing secret's variable"
    )
    p.add_argument("--clear", action="store_true", help="the tenant has no Slack")
    p = msub.add_parser("smtp", parents=parents, help="set the tenant's SMTP server")
    p.add_argument("--host")
    p.add_argument("--port", type=int, help="default 587")
    p.add_argument("--from", dest="sender", metavar="ADDRESS", help="the From address")
    p.add_argument("--username")
    p.add_argument("--password-env", metavar="VAR", help="the NAME of the password's variable")
    p.add_argument("--no-starttls", action="store_true", help="send without STARTTLS")
    p.add_argument("--clear", action="store_true", help="the tenant sends no email")

    approvers = sub.add_parser(
        "approvers", help="who a Slack user id or an email address is: add, list, remove"
    )
    asub = approvers.add_subparsers(dest="action", required=True)
    for action, what in (("add", "map"), ("remove", "unmap")):
        p = asub.add_parser(action, parents=parents, help=f"{what} a Slack user or an address")
        who = p.add_mutually_exclusive_group(required=True)
        who.add_argument("--slack", metavar="USER_ID", help="a Slack user id, U…")
        who.add_argument("--email", metavar="ADDRESS")
        if action == "add":
            p.add_argument("--user", required=True, help="the onceflow user (token label)")
    p = asub.add_parser("list", parents=parents, help="identities you can see")
    p.add_argument("--user", help="only this onceflow user's")
