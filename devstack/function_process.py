"""A functions-framework process serving one entry point of main.py, as Cloud Run runs it.

`command` is its command line for every caller: the local stack, the crash harness and the
archive test start and watch their processes their own way (log files, process groups,
restarts). `serve` is the whole life of one process for a test or a bench that only needs its
URL: a free loopback port, wait until it answers HTTP, stop it afterwards.
"""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx

from devstack.tools import MissingTool, free_port
from shared.core.deployables import Deployable, by_name

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


def functions_framework_bin() -> Path:
    candidate = Path(sys.executable).parent / "functions-framework"
    if not candidate.exists():
        raise MissingTool(
            f"functions-framework not found next to {sys.executable}: run `make venv` "
            "(it installs requirements-dev.txt)"
        )
    return candidate


def signature_type(fn: Deployable) -> str:
    """What functions/<name>.py declares (`@functions_framework.cloud_event` or `.http`)."""
    source = REPO / "functions" / f"{fn.name}.py"
    with contextlib.suppress(OSError, SyntaxError):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == fn.name:
                for deco in node.decorator_list:
                    target = deco.func if isinstance(deco, ast.Call) else deco
                    if isinstance(target, ast.Attribute) and target.attr == "cloud_event":
                        return "cloudevent"
                    if isinstance(target, ast.Attribute) and target.attr == "http":
                        return "http"
    return "cloudevent" if fn.trigger == "pubsub" else "http"


def command(
    target: str,
    port: int,
    *,
    source: Path = REPO / "main.py",
    signature: str | None = None,
    front: bool = False,
) -> list[str]:
    """Serve `target` of `source` on 127.0.0.1:`port`; without `signature`, functions-framework
    takes `http`.

    `front=True` runs the same server through `devstack.function_server`, which adds the head
    deadline Cloud Run's front end provides in the cloud (the local stack and `serve` use it;
    it needs the repository as the working directory). Without it, the exact command the
    cloud's buildpack runs (what the archive test checks)."""
    if front:
        args = [sys.executable, "-m", "devstack.function_server"]
    else:
        args = [str(functions_framework_bin())]
    args += ["--source", str(source), "--target", target]
    if signature is not None:
        args += ["--signature-type", signature]
    return [*args, "--host", HOST, "--port", str(port)]


def concurrency_env(fn: Deployable) -> dict[str, str]:
    """How many requests a process of `fn` serves at once, as its deployment says
    (infra/functions.tf sets the same two variables from the same figures): gunicorn's
    threads (functions-framework reads THREADS; Cloud Run's concurrency docs ask for THREADS
    equal to the concurrency) and the pool that lets every one of them hold a connection."""
    return {"THREADS": str(fn.concurrency), "DB_POOL_SIZE": str(fn.pool_size)}


@contextlib.contextmanager
def serve(target: str, env: Mapping[str, str], *, timeout: float = 30.0) -> Iterator[str]:
    """Run `target` of the repository's main.py with the caller's environment plus `env`; its
    base URL once it answers HTTP (any status: the app is loaded by then)."""
    with serve_process(target, env, timeout=timeout) as (base, _):
        yield base


@contextlib.contextmanager
def serve_process(
    target: str, env: Mapping[str, str], *, timeout: float = 30.0
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`serve`, also giving the process, which leads its own process group (gunicorn's
    arbiter and worker), so a bench can read the CPU time the whole group used. THREADS and
    DB_POOL_SIZE are the deployment's for `target` (`concurrency_env`) unless `env` or the
    caller's environment sets them."""
    port = free_port()
    process = subprocess.Popen(
        command(target, port, front=True),
        cwd=REPO,
        env={**concurrency_env(by_name(target)), **os.environ, **env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                httpx.get(base + "/", timeout=1)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{target} process did not start") from None
                time.sleep(0.1)
        yield base, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            # The whole group: a worker must not outlive its arbiter.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
