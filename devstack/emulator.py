"""The Pub/Sub emulator, with the topics and push subscriptions `infra/pubsub.tf` declares.

The emulator keeps everything in memory, so after every start the topics and subscriptions
are created again, from the Terraform (`devstack.terraform`), never from a second list that
could drift. Push endpoints point at the local function processes with a path of the form
`/projects/<P>/topics/<T>`: functions-framework copies that into the CloudEvent `source`, the
way the cloud's push delivery carries the topic. Retry and dead-letter policies are created as
declared; the emulator honours both (see FACTS.md).

`running` is a bare emulator (no layout) for the tests and the benches, which make their own
topics per project.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from devstack import terraform
from devstack.tools import free_port, pubsub_emulator
from shared.core.deployables import DEPLOYABLES


@dataclass(frozen=True)
class Subscription:
    name: str
    topic: str
    # The function a push subscription delivers to; None for a pull subscription.
    function: str | None
    ack_deadline_seconds: int | None = None
    minimum_backoff: str | None = None
    maximum_backoff: str | None = None
    dead_letter_topic: str | None = None
    max_delivery_attempts: int | None = None


@dataclass(frozen=True)
class Layout:
    topics: tuple[str, ...]
    subscriptions: tuple[Subscription, ...]


def declared_layout(infra_dir: Path = terraform.INFRA_DIR) -> Layout:
    """Topics and subscriptions as infra/ declares them."""
    decl = terraform.load(infra_dir)
    known = tuple(d.name for d in DEPLOYABLES)
    topics: list[str] = []
    for inst in decl.of_type("google_pubsub_topic"):
        name = terraform.attribute(decl, inst, "name")
        if not isinstance(name, str):
            raise terraform.InfraUnreadable(f"{inst.file}: {inst.address} has no literal name")
        topics.append(name)
    subs: list[Subscription] = []
    for inst in decl.of_type("google_pubsub_subscription"):
        name = terraform.attribute(decl, inst, "name")
        topic = terraform.resource_name(
            decl, terraform.attribute(decl, inst, "topic"), f"topic of {inst.address}"
        )
        endpoint = terraform.attribute(decl, inst, "push_config", "push_endpoint")
        dead_letter = terraform.attribute(decl, inst, "dead_letter_policy", "dead_letter_topic")
        subs.append(
            Subscription(
                name=str(name),
                topic=topic,
                function=(
                    terraform.function_name(decl, endpoint, known) if endpoint is not None else None
                ),
                ack_deadline_seconds=terraform.attribute(decl, inst, "ack_deadline_seconds"),
                minimum_backoff=terraform.attribute(decl, inst, "retry_policy", "minimum_backoff"),
                maximum_backoff=terraform.attribute(decl, inst, "retry_policy", "maximum_backoff"),
                dead_letter_topic=(
                    terraform.resource_name(decl, dead_letter, "dead-letter topic")
                    if dead_letter is not None
                    else None
                ),
                max_delivery_attempts=terraform.attribute(
                    decl, inst, "dead_letter_policy", "max_delivery_attempts"
                ),
            )
        )
    if not topics:
        raise terraform.InfraUnreadable(
            "infra/ declares no google_pubsub_topic: the local stack copies its topics from there"
        )
    return Layout(tuple(topics), tuple(subs))


def start(
    command: list[str], port: int, log: IO[bytes], env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    """Start the emulator in its own process group (so `down` can stop Java and its launcher)."""
    if command[-1] == "start":  # the gcloud route: `gcloud beta emulators pubsub start`
        args = [*command, f"--host-port=127.0.0.1:{port}"]
    else:
        args = [*command, "--host=127.0.0.1", f"--port={port}"]
    return subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(env),
        start_new_session=True,
    )


def is_ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).text.strip() == "Ok"
    except httpx.HTTPError:
        return False


def wait_ready(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not is_ready(url):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the Pub/Sub emulator exited with status {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Pub/Sub emulator did not answer at {url} in {timeout:.0f} s")
        time.sleep(0.1)


@contextlib.contextmanager
def running(log_path: Path | None = None, timeout: float = 60.0) -> Iterator[str]:
    """An emulator on a free loopback port for the tests and the benches, its output in
    `log_path` (or nowhere); its `PUBSUB_EMULATOR_HOST` once it answers. Stopped afterwards."""
    port = free_port()
    with open(log_path or os.devnull, "wb") as log:
        process = start(pubsub_emulator(), port, log, os.environ)
    try:
        try:
            wait_ready(f"http://127.0.0.1:{port}", process, timeout)
        except RuntimeError as exc:
            output = log_path.read_text(errors="replace")[-800:] if log_path else ""
            raise RuntimeError(f"{exc}\n{output}".rstrip()) from None
        yield f"127.0.0.1:{port}"
    finally:
        # The launcher is a shell script running java: stop the whole group it started.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def push_endpoint(function_url: str, project: str, topic: str) -> str:
    return f"{function_url}/projects/{project}/topics/{topic}"


def create_layout(url: str, project: str, layout: Layout, function_urls: Mapping[str, str]) -> None:
    """Create every topic, then every subscription (idempotent: 409 means it is there)."""
    with httpx.Client(base_url=url, timeout=10.0) as client:
        for topic in layout.topics:
            # The emulator answers a repeated topic PUT with a bare 404, so look first.
            path = f"/v1/projects/{project}/topics/{topic}"
            if client.get(path).status_code != 200:
                _put(client, path, {})
        for sub in layout.subscriptions:
            body: dict[str, Any] = {"topic": f"projects/{project}/topics/{sub.topic}"}
            if sub.function is not None:
                body["pushConfig"] = {
                    "pushEndpoint": push_endpoint(function_urls[sub.function], project, sub.topic)
                }
            if sub.ack_deadline_seconds is not None:
                body["ackDeadlineSeconds"] = int(sub.ack_deadline_seconds)
            if sub.minimum_backoff or sub.maximum_backoff:
                body["retryPolicy"] = {
                    k: v
                    for k, v in (
                        ("minimumBackoff", sub.minimum_backoff),
                        ("maximumBackoff", sub.maximum_backoff),
                    )
                    if v
                }
            if sub.dead_letter_topic is not None:
                body["deadLetterPolicy"] = {
                    "deadLetterTopic": f"projects/{project}/topics/{sub.dead_letter_topic}",
                    "maxDeliveryAttempts": int(sub.max_delivery_attempts or 5),
                }
            _put(client, f"/v1/projects/{project}/subscriptions/{sub.name}", body)


def _put(client: httpx.Client, path: str, body: dict[str, Any]) -> None:
    response = client.put(path, json=body)
    if response.status_code not in (200, 409):
        raise RuntimeError(
            f"the Pub/Sub emulator refused PUT {path}: {response.status_code} {response.text[:300]}"
        )
