"""How the demo tells its story and looks at the stack: the chapters and verdicts it prints,
the SQL it reads the database with (devstack/demo.sql), and the patient wait for something
to have happened. Shared by the scenario (devstack/demo.py) and its app chapters
(devstack/demo_app.py), which import it and never each other's internals."""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from shared.core.queries import parse_blocks

SQL = parse_blocks((Path(__file__).with_name("demo.sql")).read_text("utf-8"))
WAIT_SECONDS = float(os.environ.get("ONCEFLOW_DEMO_WAIT_SECONDS", "20"))
T = TypeVar("T")


@dataclass
class Story:
    """What happened, chapter by chapter, plus a one-line verdict per chapter for the end."""

    chapter: int = 0
    verdicts: list[tuple[bool, str]] = field(default_factory=list)

    def title(self, text: str) -> None:
        self.chapter += 1
        print(f"\n{self.chapter}. {text}", flush=True)

    def say(self, text: str) -> None:
        print(textwrap.fill(text, 96, initial_indent="   ", subsequent_indent="   "), flush=True)

    def verdict(self, ok: bool, text: str) -> None:
        self.verdicts.append((ok, text))
        self.say(("→ " if ok else "✗ ") + text)


def wait_for(probe: Callable[[], T | None], seconds: float = WAIT_SECONDS) -> T | None:
    """Poll `probe` until it returns something truthy or the time is up."""
    deadline = time.monotonic() + seconds
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)
