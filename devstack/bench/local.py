"""A throwaway local stack for the benches that drive it end to end (`bench-latency`,
`bench-e2e`): free ports, a fresh durable cluster in a temporary folder, stopped and removed
afterwards unless the caller keeps it to read its logs."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from devstack import postgres
from devstack import stack as devstack


@contextlib.contextmanager
def throwaway_stack(prefix: str, *, keep: bool) -> Iterator[devstack.RunningStack]:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    # The stack starts its own cluster only without DATABASE_URL.
    os.environ.pop("DATABASE_URL", None)
    try:
        devstack.up(root / "local", free_ports=True)
        running = devstack.RunningStack.open(root / "local")
        if keep:
            print(
                f"stack kept running in {root / 'local'} (logs there; stop with "
                f"`python -m devstack.stack down --root {root / 'local'}`)"
            )
        yield running
    finally:
        if not keep:
            devstack.down(root / "local", quiet=True)
            shutil.rmtree(root, ignore_errors=True)


def cluster(running: devstack.RunningStack) -> postgres.Cluster:
    """The stack's own PostgreSQL cluster (for pgbench on the same server)."""
    return postgres.Cluster(
        running.root / "pg", int(running.info["components"]["postgres"]["port"])
    )
