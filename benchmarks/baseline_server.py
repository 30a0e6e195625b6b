"""The bare HTTP object store ``bench_store.py`` measures sr3 against, in its own process:
``PUT /obj/{n}`` writes the body to a file (no fsync, no verification, no compression),
``GET /obj/{n}`` answers with the file.

    python benchmarks/baseline_server.py PORT DIR
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ring.codec import CHUNK_BYTES_MAX

__all__ = ["run_baseline_server", "start_baseline_server", "stop_process"]

SERVER_START_TIMEOUT_S = 30.0
SERVER_STOP_TIMEOUT_S = 10.0
BASELINE_BODY_BYTES_MAX = CHUNK_BYTES_MAX + 1024 * 1024


def run_baseline_server(port: int, directory: Path) -> None:
    """Serve ``PUT``/``GET /obj/{n}`` from ``directory`` until terminated."""

    def object_path(request: web.Request) -> Path:
        return directory / request.match_info["n"]

    async def put_object(request: web.Request) -> web.Response:
        body = await request.read()
        await asyncio.to_thread(object_path(request).write_bytes, body)
        return web.Response(status=201)

    async def get_object(request: web.Request) -> web.StreamResponse:
        path = object_path(request)
        if not path.is_file():
            return web.Response(status=404)
        return web.FileResponse(path)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    directory.mkdir(parents=True, exist_ok=True)
    app = web.Application(client_max_size=BASELINE_BODY_BYTES_MAX)
    app.router.add_put(r"/obj/{n:\d+}", put_object)
    app.router.add_get(r"/obj/{n:\d+}", get_object)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(url, timeout=0.5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if process.poll() is not None:
            raise RuntimeError(f"baseline server exited with code {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"baseline server not healthy after {SERVER_START_TIMEOUT_S} s")
        time.sleep(0.05)


def start_baseline_server(directory: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with open(log_path, "ab") as log_handle:
        process = subprocess.Popen(
            [sys.executable, __file__, str(port), str(directory)],
            stdin=subprocess.DEVNULL,
            stdout=log_handle,
            stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{base_url}/health", process)
    except BaseException:
        stop_process(process)
        raise
    return process, base_url


def stop_process(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(SERVER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(SERVER_STOP_TIMEOUT_S)


if __name__ == "__main__":
    run_baseline_server(int(sys.argv[1]), Path(sys.argv[2]))
