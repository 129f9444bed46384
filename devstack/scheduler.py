"""The local Cloud Scheduler: POSTs to the scheduled functions at the cadence infra/ declares.

Each `google_cloud_scheduler_job` in `infra/scheduler.tf` is read with python-hcl2 (its cron
`schedule`, the function its `http_target.uri` points at, the method and the
`attempt_deadline`), so the local cadence and the cloud's cannot drift.

`ONCEFLOW_SCHEDULER_SPEEDUP` (default 1) runs the scheduler's clock that many times faster:
with 12, a `* * * * *` job fires every 5 s and a `*/5 * * * *` one every 25 s, keeping the
jobs' relative cadence. 0 turns the scheduler off (functions are then only called by hand).

Like Cloud Scheduler, a call is not retried here; unlike it, a job whose previous call is still
running is skipped rather than stacked, because a sped-up clock would otherwise pile up
invocations of functions that loop until shortly before their deadline.

Run: `python -m devstack.scheduler --stack .local/stack.json` (the stack starts it).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType

import httpx
from cronsim import CronSim, CronSimError

from devstack import terraform
from shared.core.deployables import DEPLOYABLES

SPEEDUP_ENV = "ONCEFLOW_SCHEDULER_SPEEDUP"


class CronError(ValueError):
    pass


@dataclass(frozen=True, repr=False)
class Cron:
    """A five-field cron expression, read by `cronsim` (the library cron triggers use too)."""

    text: str

    @classmethod
    def parse(cls, text: str) -> Cron:
        if len(text.split()) != 5:
            raise CronError(f"cron schedule {text!r} does not have five fields")
        try:
            CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
        except CronSimError as exc:
            raise CronError(f"cannot read cron schedule {text!r}: {exc}") from None
        return cls(text)

    def __repr__(self) -> str:
        return f"Cron({self.text!r})"

    def next_after(self, at: datetime) -> datetime:
        """The first matching minute strictly after `at`."""
        try:
            return next(CronSim(self.text, at))
        except StopIteration:
            raise CronError(f"cron schedule {self.text!r} never fires") from None


@dataclass(frozen=True)
class Job:
    name: str
    function: str
    cron: Cron
    method: str = "POST"
    deadline_seconds: float = 180.0
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


def declared_jobs(infra_dir: Path = terraform.INFRA_DIR) -> tuple[Job, ...]:
    """Every Cloud Scheduler job infra/ declares, with the function it calls."""
    decl = terraform.load(infra_dir)
    known = tuple(d.name for d in DEPLOYABLES)
    jobs: list[Job] = []
    for inst in decl.of_type("google_cloud_scheduler_job"):
        schedule = terraform.attribute(decl, inst, "schedule")
        if not isinstance(schedule, str):
            raise terraform.InfraUnreadable(f"{inst.file}: {inst.address} has no literal schedule")
        uri = terraform.attribute(decl, inst, "http_target", "uri")
        method = terraform.attribute(decl, inst, "http_target", "http_method") or "POST"
        deadline = terraform.attribute(decl, inst, "attempt_deadline")
        body = terraform.attribute(decl, inst, "http_target", "body")
        headers = terraform.attribute(decl, inst, "http_target", "headers") or {}
        jobs.append(
            Job(
                name=str(terraform.attribute(decl, inst, "name") or inst.address),
                function=terraform.function_name(decl, uri, known),
                cron=Cron.parse(schedule),
                method=str(method).upper(),
                deadline_seconds=_seconds(deadline) if deadline else 180.0,
                # Cloud Scheduler takes the body base64-encoded, as Terraform declares it.
                body=base64.b64decode(body) if isinstance(body, str) else b"",
                headers=tuple((str(k), str(v)) for k, v in dict(headers).items()),
            )
        )
    return tuple(jobs)


def _seconds(duration: object) -> float:
    text = str(duration)
    return float(text[:-1]) if text.endswith("s") else float(text)


def speedup_from_env(env: Mapping[str, str] = os.environ) -> float:
    raw = env.get(SPEEDUP_ENV, "1").strip() or "1"
    try:
        value = float(raw)
    except ValueError:
        raise CronError(
            f"{SPEEDUP_ENV}={raw!r} is not a number (1 = real cadence, 0 = off)"
        ) from None
    if value < 0:
        raise CronError(f"{SPEEDUP_ENV} must be 0 (off) or a positive factor, not {raw}")
    return value


class LocalScheduler:
    """Fires each job at its cron minutes, on a clock running `speedup` times faster."""

    def __init__(self, jobs: tuple[Job, ...], urls: Mapping[str, str], speedup: float) -> None:
        self.jobs = jobs
        self.urls = dict(urls)
        self.speedup = speedup
        self.stopping = threading.Event()
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()
        self._real_start = time.time()
        self._virtual_start = datetime.now(UTC)

    def virtual_now(self) -> datetime:
        elapsed = (time.time() - self._real_start) * self.speedup
        return self._virtual_start + timedelta(seconds=elapsed)

    def real_time_of(self, virtual: datetime) -> float:
        return self._real_start + (virtual - self._virtual_start).total_seconds() / self.speedup

    def run(self) -> None:
        if self.speedup == 0 or not self.jobs:
            _log("scheduler off" if self.speedup == 0 else "no scheduler jobs declared")
            self.stopping.wait()
            return
        _log(
            "scheduler started",
            speedup=self.speedup,
            jobs=[{"function": j.function, "schedule": j.cron.text} for j in self.jobs],
        )
        upcoming = {j.name: j.cron.next_after(self.virtual_now()) for j in self.jobs}
        while not self.stopping.is_set():
            soonest = min(upcoming.values())
            wait = self.real_time_of(soonest) - time.time()
            if wait > 0 and self.stopping.wait(min(wait, 60.0)):
                break
            if self.virtual_now() < soonest:
                continue
            for job in self.jobs:
                if upcoming[job.name] <= soonest:
                    self.fire(job)
                    upcoming[job.name] = job.cron.next_after(soonest)

    def fire(self, job: Job) -> None:
        with self._lock:
            if job.name in self._in_flight:
                _log("skipped: previous call still running", function=job.function)
                return
            self._in_flight.add(job.name)
        threading.Thread(target=self._call, args=(job,), daemon=True).start()

    def _call(self, job: Job) -> None:
        started = time.monotonic()
        _log("calling", function=job.function)
        try:
            response = httpx.request(
                job.method,
                self.urls[job.function],
                headers={**dict(job.headers), "User-Agent": "Google-Cloud-Scheduler"},
                content=job.body,
                timeout=job.deadline_seconds,
            )
            _log(
                "called",
                function=job.function,
                status=response.status_code,
                seconds=round(time.monotonic() - started, 3),
            )
        except httpx.HTTPError as exc:
            _log("call failed", function=job.function, error=repr(exc))
        finally:
            with self._lock:
                self._in_flight.discard(job.name)


# Jobs fire from their own threads; print() writes the text and the newline separately, so
# two threads can glue their lines together. One write per line, under a lock, keeps the
# log one JSON object per line.
_log_lock = threading.Lock()


def _log(message: str, **fields: object) -> None:
    line = {"time": datetime.now(UTC).isoformat(), "message": message, **fields}
    with _log_lock:
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the local Cloud Scheduler")
    parser.add_argument(
        "--stack", type=Path, required=True, help="the stack.json to read URLs from"
    )
    args = parser.parse_args(argv)
    try:
        stack = json.loads(args.stack.read_text())
        urls = {
            name: c["url"] for name, c in stack["components"].items() if c.get("kind") == "function"
        }
        scheduler = LocalScheduler(declared_jobs(), urls, speedup_from_env())
    except (CronError, terraform.InfraUnreadable, OSError, KeyError, ValueError) as exc:
        print(f"scheduler: {exc}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: FrameType | None) -> None:
        scheduler.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    scheduler.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
