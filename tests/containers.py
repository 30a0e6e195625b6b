"""A real container engine for the compose test: Docker's engine (``dockerd``, Debian's
``docker.io``), a compose command (the ``docker compose`` plugin, else Debian's
``docker-compose``), and a base image built from Debian's archive when no registry is
reachable (``deploy/base-image.sh``).

What it is for: the compose deployment is what operators run, so its test runs it for
real: the project's image built from this checkout, five peer containers on the compose
network, clients in a container on that network and on the host (``ComposeProject``).

Nothing is installed here. When no engine answers and this process is root with a
``dockerd`` on PATH, :func:`start_engine` starts one and :func:`stop_engine` stops it
again. Where the engine, a compose command or ``debootstrap`` (for a missing base image)
is absent, :func:`containers_unavailable` says why and :func:`require_containers` skips,
or fails when ``SR3_REQUIRE_CONTAINERS=1`` (CI: ``.ci/run`` installs and starts them).
Every command runs under a timeout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIRE_CONTAINERS_ENV = "SR3_REQUIRE_CONTAINERS"
BASE_IMAGE = "sr3-base:bookworm"
# What the project's image is built from: the Dockerfile's COPY lines and the compose file.
PROJECT_FILES = (
    "Dockerfile",
    "docker-compose.yml",
    ".dockerignore",
    "deploy",
    "pyproject.toml",
    "README.md",
    "sr3",
    "ring",
    "recovery",
    "filesystem",
    "spark_connector",
)
COMMAND_TIMEOUT_S = 120.0
BUILD_TIMEOUT_S = 900.0  # debootstrap (about 1 min here) or an image build with pip
ENGINE_START_S_MAX = 60.0
ENGINE_STOP_S_MAX = 30.0
POLL_S = 1.0
OUTPUT_TAIL_CHARS = 4000


def containers_required() -> bool:
    """Whether ``SR3_REQUIRE_CONTAINERS`` asks for the engine; a value other than 0 or 1
    is an error rather than a silent skip."""
    value = os.environ.get(REQUIRE_CONTAINERS_ENV, "").strip()
    if value not in {"", "0", "1"}:
        raise pytest.UsageError(f"{REQUIRE_CONTAINERS_ENV}={value!r}: expected 1 (or 0, or unset)")
    return value == "1"


def require_containers(reason: str | None) -> None:
    """Skip the calling test when ``reason`` says the engine cannot run; fail it instead
    when ``SR3_REQUIRE_CONTAINERS=1``."""
    if reason is None:
        return
    if containers_required():
        pytest.fail(f"{REQUIRE_CONTAINERS_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def run(
    command: list[str],
    *,
    cwd: Path | None = None,
    timeout_s: float = COMMAND_TIMEOUT_S,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``command`` to its end within ``timeout_s``; with ``check``, an AssertionError
    naming the command and the tail of its output when it fails."""
    done = subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
    if check and done.returncode != 0:
        output = (done.stdout + done.stderr)[-OUTPUT_TAIL_CHARS:]
        raise AssertionError(f"{' '.join(command)} exited {done.returncode}:\n{output}")
    return done


@dataclass
class Engine:
    docker: str
    compose: list[str]
    # The dockerd this module started (None: it was running already, or is not ours).
    daemon: subprocess.Popen[bytes] | None = None

    def answers(self) -> bool:
        return run([self.docker, "info"], check=False, timeout_s=30).returncode == 0


def _compose_command(docker: str) -> list[str] | None:
    if run([docker, "compose", "version"], check=False).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def containers_unavailable() -> str | None:
    """Why no engine can run here, or None when :func:`start_engine` can give one."""
    docker = shutil.which("docker")
    if docker is None:
        return "no `docker` command (install Debian's docker.io)"
    if _compose_command(docker) is None:
        return "no compose command (`docker compose` or Debian's docker-compose)"
    if run([docker, "info"], check=False, timeout_s=30).returncode == 0:
        return None
    if shutil.which("dockerd") is None:
        return "no Docker engine answers and there is no `dockerd` to start"
    if os.geteuid() != 0:
        return "no Docker engine answers, and starting `dockerd` needs root"
    return None


def start_engine(log: Path) -> Engine:
    """An engine that answers: the running one, else a ``dockerd`` started here (its
    output in ``log``). Call :func:`containers_unavailable` first."""
    docker = shutil.which("docker")
    assert docker is not None
    compose = _compose_command(docker)
    assert compose is not None
    engine = Engine(docker, compose)
    if engine.answers():
        return engine
    with log.open("ab") as sink:
        engine.daemon = subprocess.Popen(
            ["dockerd"], stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + ENGINE_START_S_MAX
    while not engine.answers():
        if engine.daemon.poll() is not None or time.monotonic() > deadline:
            stop_engine(engine)
            tail = log.read_text(errors="replace")[-OUTPUT_TAIL_CHARS:]
            raise AssertionError(f"dockerd did not start within {ENGINE_START_S_MAX} s:\n{tail}")
        time.sleep(POLL_S)
    return engine


def stop_engine(engine: Engine) -> None:
    """Stop the ``dockerd`` :func:`start_engine` started, if it did."""
    daemon, engine.daemon = engine.daemon, None
    if daemon is None or daemon.poll() is not None:
        return
    daemon.terminate()
    try:
        daemon.wait(timeout=ENGINE_STOP_S_MAX)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait(timeout=10)


def base_image_unavailable(engine: Engine) -> str | None:
    """Why the base image can be neither found nor built, or None."""
    if run([engine.docker, "image", "inspect", BASE_IMAGE], check=False).returncode == 0:
        return None
    if shutil.which("debootstrap") is None:
        return f"no image {BASE_IMAGE} and no `debootstrap` to build it (apt install debootstrap)"
    if os.geteuid() != 0:
        return f"no image {BASE_IMAGE}, and building it (debootstrap) needs root"
    return None


def ensure_base_image(engine: Engine) -> str:
    """The base image's tag, built from Debian's archive the first time."""
    if run([engine.docker, "image", "inspect", BASE_IMAGE], check=False).returncode != 0:
        run([str(ROOT / "deploy" / "base-image.sh"), BASE_IMAGE], timeout_s=BUILD_TIMEOUT_S)
    return BASE_IMAGE


@dataclass
class ComposeProject:
    """A copy of the project's compose deployment in ``directory``, run as compose
    project ``name`` (its own network and volumes) with ``.env`` holding ``secret``."""

    engine: Engine
    directory: Path
    name: str
    secret: str
    base_image: str
    published: list[str] = field(default_factory=list)  # host:port of every peer

    @classmethod
    def create(
        cls, engine: Engine, directory: Path, name: str, secret: str, base_image: str
    ) -> ComposeProject:
        directory.mkdir(parents=True, exist_ok=True)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        for entry in PROJECT_FILES:
            source = ROOT / entry
            if source.is_dir():
                shutil.copytree(source, directory / entry, ignore=ignore)
            else:
                shutil.copy2(source, directory / entry)
        (directory / ".env").write_text(f"SR3_SECRET={secret}\nSR3_BASE_IMAGE={base_image}\n")
        return cls(engine, directory, name, secret, base_image)

    def compose(
        self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return run(
            [*self.engine.compose, "-p", self.name, *args],
            cwd=self.directory,
            timeout_s=timeout_s,
            check=check,
        )

    def build(self) -> None:
        self.compose("build", timeout_s=BUILD_TIMEOUT_S)

    def containers(self) -> dict[str, str]:
        """Service name → container id, of every container of the project that exists."""
        ids = self.compose("ps", "-q").stdout.split()
        if not ids:
            return {}
        fmt = '{{index .Config.Labels "com.docker.compose.service"}} {{.Id}}'
        lines = run([self.engine.docker, "inspect", "--format", fmt, *ids]).stdout
        return dict(line.split() for line in lines.splitlines() if line.strip())

    def health(self) -> dict[str, str]:
        """Service name → its health ('healthy', 'starting', ...) or state."""
        containers = self.containers()
        if not containers:
            return {}
        fmt = (
            '{{index .Config.Labels "com.docker.compose.service"}} '
            "{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}"
        )
        lines = run([self.engine.docker, "inspect", "--format", fmt, *containers.values()])
        return dict(line.split() for line in lines.stdout.splitlines() if line.strip())

    def wait_healthy(self, services: list[str], timeout_s: float) -> float:
        """Seconds until every one of ``services`` is healthy; AssertionError with their
        states and logs when ``timeout_s`` passes first."""
        start = time.monotonic()
        while True:
            health = self.health()
            if all(health.get(service) == "healthy" for service in services):
                return time.monotonic() - start
            if time.monotonic() - start > timeout_s:
                logs = self.compose("logs", "--tail", "20", check=False).stdout
                raise AssertionError(
                    f"not healthy within {timeout_s:.0f} s: {health}\n{logs[-OUTPUT_TAIL_CHARS:]}"
                )
            time.sleep(POLL_S)

    def run_in_network(
        self, service: str, command: list[str], *, volumes: dict[Path, str], env: dict[str, str]
    ) -> subprocess.CompletedProcess[str]:
        """``command`` in a new container of ``service``'s image and configuration on the
        project's network (not its published ports), removed afterwards."""
        options: list[str] = []
        for host, inside in volumes.items():
            options += ["-v", f"{host}:{inside}"]
        for key, value in env.items():
            options += ["-e", f"{key}={value}"]
        return self.compose(
            "run", "--rm", "--no-deps", *options, "--entrypoint", command[0], service, *command[1:]
        )

    def volumes(self) -> set[str]:
        """Names of every volume the engine holds (the project's and any other)."""
        return set(run([self.engine.docker, "volume", "ls", "-q"]).stdout.split())

    def set_env(self, **values: str) -> None:
        """Add ``values`` to the project's ``.env`` (taken by the next ``up``)."""
        with (self.directory / ".env").open("a") as env:
            env.writelines(f"{key}={value}\n" for key, value in values.items())

    def down(self) -> None:
        """Remove the containers, the network and the volumes (every byte of the ring)."""
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.compose("down", "-v", "--remove-orphans")
