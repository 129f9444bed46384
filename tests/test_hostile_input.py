"""Hostile bodies through the real `ops` entry point (in-process): too deep JSON, YAML alias
bombs and deep YAML are 4xx with a reason, never the generic 500; and `validate` warns about
`http.request` URLs the address policy refuses whatever DNS answers."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest

from shared.core import request_body
from shared.core.db import Database
from shared.core.request_body import BodyRefused, json_depth_exceeds, parse_json, read_body
from shared.publishing.validate import MAX_YAML_DEPTH, validate_text
from tests.ops_support import (
    bearer,
    mint,
    seed_tenant,
)

VALIDATE = "/v1/workflows/validate"
# Each level refers nine times to the one before: 9**8 (43 million) strings from 400 bytes.
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True)
)


def definition(**step_config: Any) -> str:
    return (
        "name: notify\ntenant: acme\ntrigger:\n  events: [hubspot.contact.created]\nsteps:\n"
        f"  - id: call\n    type: http.request\n    config: {json.dumps(step_config)}\n"
    )


@pytest.fixture
def token(db: Database) -> str:
    seed_tenant(db, "acme")
    return mint(db, "acme")


def post(client: Any, token: str, path: str, body: bytes) -> Any:
    return client.post(
        path, data=body, headers={**bearer(token), "Content-Type": "application/json"}
    )


def assert_definition_refused(response: Any, path: str, words: str) -> None:
    """validate answers 200 with `valid: false`; publish refuses with 422."""
    if path == VALIDATE:
        assert response.status_code == 200, response.data
        assert response.json["valid"] is False
    else:
        assert response.status_code == 422, response.data
    assert words in json.dumps(response.json)


@pytest.mark.parametrize("path", [VALIDATE, "/v1/workflows", "/v1/rehearsals"])
def test_json_nested_past_the_limit_is_400_not_500(client: Any, token: str, path: str) -> None:
    # 5000 levels made json.loads raise RecursionError: the generic 500.
    deep = b'{"source": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    response = post(client, token, path, deep)
    assert response.status_code == 400, response.data
    assert response.json["code"] == "too_deep"
    within = b'{"source": ' + b"[" * 20 + b"]" * 20 + b"}"
    assert post(client, token, path, within).status_code == 422  # parsed, then judged


def test_yaml_alias_bomb_is_refused_before_it_expands(client: Any, token: str) -> None:
    assert len(ALIAS_BOMB) < 500
    for path in (VALIDATE, "/v1/workflows"):
        started = time.monotonic()
        response = post(client, token, path, json.dumps({"source": ALIAS_BOMB}).encode())
        assert time.monotonic() - started < 10  # expanded, it takes minutes and gigabytes
        assert_definition_refused(response, path, "anchors (&a) are not accepted")


def test_yaml_anchors_and_aliases_are_refused_with_their_position() -> None:
    report = validate_text("name: x\nother: &o {a: 1}\ncopy: *o\n")
    (problem,) = report.errors
    assert (problem.line, problem.column) == (2, 8)
    assert "anchors (&o) are not accepted" in problem.message


@pytest.mark.parametrize(
    "source",
    [
        "x: " + "[" * 3000 + "]" * 3000,  # flow style
        "x: " + "{a: " * 3000 + "1" + "}" * 3000,
        "".join("  " * i + "- \n" for i in range(200)) + "  " * 200 + "x\n",  # block style
    ],
)
def test_deep_yaml_is_refused_not_500(client: Any, token: str, source: str) -> None:
    # Only yaml.YAMLError was caught; the composer's RecursionError escaped as a 500.
    for path in (VALIDATE, "/v1/workflows"):
        response = post(client, token, path, json.dumps({"source": source}).encode())
        assert_definition_refused(response, path, f"nests deeper than {MAX_YAML_DEPTH} levels")


def test_yaml_within_the_depth_limit_still_validates() -> None:
    nested: Any = "deep"
    for _ in range(MAX_YAML_DEPTH - 6):  # the definition's own levels come on top
        nested = {"k": nested}
    report = validate_text(definition(url="https://hooks.example.com/in", body=nested))
    assert report.ok, [str(p) for p in report.problems]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:8080/hook", "loopback address 127.0.0.1"),
        ("http://2130706433/hook", "loopback address 127.0.0.1"),
        ("http://0x7f.1/hook", "loopback address 127.0.0.1"),
        ("http://localhost/hook", "loopback name 'localhost'"),
        ("http://169.254.169.254/computeMetadata/v1/", "metadata address 169.254.169.254"),
        ("http://metadata.google.internal/x", "metadata or internal name"),
        ("http://10.1.2.3/x", "private address 10.1.2.3"),
        ("http://[::ffff:192.168.0.1]/x", "IPv4-mapped private address"),
        ("http://127.0.0.1:8080:80/", "invalid URL"),
        ("ftp://files.example.com/x", "only http and https"),
    ],
)
def test_validate_warns_about_urls_the_address_policy_always_refuses(url: str, reason: str) -> None:
    report = validate_text(definition(url=url))
    assert report.ok  # a warning, not an error: the definition is legal
    (warning,) = report.warnings
    assert warning.path == ("steps", 0, "config", "url")
    assert reason in warning.message, warning.message


@pytest.mark.parametrize(
    "url",
    ["https://hooks.example.com/in", "https://${{ record.site }}/in", "http://8.8.8.8/x"],
)
def test_validate_is_quiet_about_urls_only_dns_can_judge(url: str) -> None:
    assert validate_text(definition(url=url)).warnings == []


def test_publish_answers_the_warning_too(client: Any, token: str) -> None:
    source = definition(url="http://169.254.169.254/computeMetadata/v1/")
    response = post(client, token, "/v1/workflows", json.dumps({"source": source}).encode())
    assert response.status_code == 201, response.data
    assert "metadata address" in json.dumps(response.json["warnings"])


# ---- the bounded reader itself ---------------------------------------------------------


class _Unframeable(Exception):
    """What a server's chunk parser raises (gunicorn's are plain Exceptions, not OSErrors)."""


def test_reader_errors_are_400_with_their_name() -> None:
    def read(_: int) -> bytes:
        raise _Unframeable("Invalid chunk size: 'zz'")

    with pytest.raises(BodyRefused) as err:
        read_body(read, declared_length=None, cap=100, deadline_seconds=10)
    assert (err.value.status, err.value.code, err.value.check) == (
        400,
        "malformed_body",
        "body_framing",
    )
    assert "Invalid chunk size" in err.value.message


def test_sizes_declared_and_read() -> None:
    with pytest.raises(BodyRefused) as err:
        read_body(lambda n: b"x" * n, declared_length=10**10, cap=100, deadline_seconds=10)
    assert (err.value.status, err.value.check) == (413, "content_length")
    with pytest.raises(BodyRefused) as err:
        read_body(lambda n: b"x" * n, declared_length=None, cap=100, deadline_seconds=10)
    assert (err.value.status, err.value.check) == (413, "body_read")
    parts = [b"abc", b"def", b""]
    read = read_body(lambda n: parts.pop(0), declared_length=6, cap=100, deadline_seconds=10)
    assert read == b"abcdef"


def test_a_stalled_body_is_cut_at_the_deadline_and_answered_408() -> None:
    """A real socket whose peer sends 3 of 10 declared bytes and stops: the read blocks
    until the deadline shuts the read side down, then the refusal is a 408."""
    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(b"abc")
        environ: dict[str, Any] = {request_body.SOCKET_KEY: ours}
        with pytest.raises(BodyRefused) as err:
            read_body(
                ours.recv,
                declared_length=10,
                cap=100,
                environ=environ,
                deadline_seconds=0.5,
            )
        assert (err.value.status, err.value.code) == (408, "body_timeout")
        assert request_body.CONSUMED_KEY not in environ
    finally:
        ours.close()
        theirs.close()


def test_json_depth_counts_brackets_outside_strings_only() -> None:
    assert not json_depth_exceeds(b'{"a": "[[[[[[[[[[[[[[[[[[", "b": [1, [2]]}', 3)
    assert json_depth_exceeds(b'{"a": [[[1]]]}', 3)
    assert not json_depth_exceeds(b'{"a": "\\"[[[[[[\\""}', 1)
    with pytest.raises(BodyRefused) as err:
        parse_json(b"[" * 100 + b"]" * 100)
    assert err.value.code == "too_deep"
    with pytest.raises(BodyRefused) as err:
        parse_json(b"{nope")
    assert err.value.code == "malformed_json"
