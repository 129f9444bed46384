"""`python -m devstack.fakevertex [port]`: serve the fake Vertex AI endpoint (it answers `{}`
to any prompt unless a fixture matches; the local stack points ONCEFLOW_VERTEX_BASE_URL here)."""

from __future__ import annotations

import sys
import time

from devstack.fakevertex.server import FakeVertex


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8093
    fake = FakeVertex(port=port).start()
    print(f"fake Vertex AI on {fake.base_url}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
