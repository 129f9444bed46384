"""Put the `onceflow` command into a venv: `python -m devstack.install_command VENV`.

Not `pip install -e .`: an editable install makes the checkout importable from anywhere in the
venv, and `tests/test_archive.py` relies on a venv that cannot import `shared` outside the
repository (otherwise serving the deploy archive would quietly fall back to the checkout and
prove nothing about what the archive holds). The command is a small script that runs
`python -m shared.ops.cli` with this checkout on its own `PYTHONPATH` only.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def install(venv: Path, repo: Path = REPO, python: Path | None = None) -> Path:
    script = venv / "bin" / "onceflow"
    python = python or venv.resolve() / "bin" / "python"
    script.write_text(
        "#!/bin/sh\n"
        "# onceflow from the checkout it was installed from (devstack/install_command.py)\n"
        f'PYTHONPATH={shlex.quote(str(repo))}"${{PYTHONPATH:+:$PYTHONPATH}}" '
        f'exec {shlex.quote(str(python))} -m shared.ops.cli "$@"\n',
        "utf-8",
    )
    script.chmod(0o755)
    return script


if __name__ == "__main__":
    print(install(Path(sys.argv[1] if len(sys.argv) > 1 else ".venv")))
