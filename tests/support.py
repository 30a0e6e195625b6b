"""What the tests share: the run seed, ports and clusters, Spark's prerequisites, and
signed raw HTTP, on-disk chunk lookup and metrics parsing.

This is the one module tests import helpers from, always as ``support`` (never
``tests.support``, never ``conftest`` or a test module: a second copy would hold a second
seed and a second port counter; tests/test_suite.py checks). conftest.py builds
its fixtures from it.

The HTTP helpers talk to real peers over loopback and look at real files. They
deliberately use the same signing code as the client (``ring.auth.Signer``) but not the
client itself, so a test can send exactly the request it is about: a tampered body, a
replayed nonce, a body that is not a chunk.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import pytest
from yarl import URL

from filesystem.namespace import Namespace
from ring import api, fs_api, paxos
from ring.auth import Signer, scoped_credential
from ring.client import Client
from ring.errors import NotFound, SR3Error
from ring.placement import Member, Ring
from ring.tls import ClientTls
from spark_connector.fs_client import FsClient
from sr3.local import LocalCluster

__all__ = [
    "REQUIRE_SPARK_ENV",
    "SEED",
    "SEED_ENV",
    "Answer",
    "Cut",
    "CutClient",
    "HttpProbe",
    "MakeCluster",
    "chunk_file",
    "chunk_holders",
    "commit_next_batch",
    "log_ends",
    "cut_rename",
    "fs_rename",
    "materialize",
    "metric_value",
    "missing_spark_requirements",
    "next_base_port",
    "peer_address",
    "require_spark",
    "spark_credential",
    "spark_required",
    "tracebacks_since",
    "start_cluster",
    "wall_ms",
    "where_renamed",
    "WritesClient",
]

SEED_ENV = "SR3_TEST_SEED"
SEED = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(2**32))

# Each test run takes its own stretch of ports (other runs may share the machine), below
# the kernel's ephemeral range so client sockets never sit on a port a peer wants.
# LocalCluster skips ports that are busy, scanning upwards from the base it is given.
_BASE_PORTS = itertools.count(21000 + (os.getpid() % 40) * 250, 5)


def next_base_port() -> int:
    return next(_BASE_PORTS)


CLUSTER_START_TRIES = 3

MakeCluster = Callable[..., LocalCluster]


def start_cluster(home: Path, peers: int, **options: object) -> LocalCluster:
    """Create and start a local cluster under ``home``; retry elsewhere on a port race."""
    error: SR3Error | None = None
    for _attempt in range(CLUSTER_START_TRIES):
        cluster = LocalCluster.create(
            home,
            peers,
            cluster_file=home / "cluster.json",
            base_port=next_base_port(),
            **options,  # type: ignore[arg-type]
        )
        try:
            cluster.up()
        except SR3Error as exc:  # another process took the port between probe and bind
            cluster.down(purge=True)
            error = exc
            continue
        return cluster
    assert error is not None
    raise error


# CI sets this to 1 (.ci/run): there a missing Spark prerequisite fails the run instead of
# skipping the end-to-end tests, which would otherwise pass without testing anything.
REQUIRE_SPARK_ENV = "SR3_REQUIRE_SPARK"

SPARK_INSTALL_HINTS = {
    "java": (
        "a Java 17 runtime: install one (e.g. `apt-get install openjdk-17-jre-headless`) "
        "and put `java` on PATH or point JAVA_HOME at it"
    ),
    "pyspark": "PySpark: `make install`, or `pip install -e '.[spark,dev]'`",
    "pandas": "pandas: `make install`, or `pip install -e '.[spark,dev]'`",
    "pyarrow": "pyarrow: `make install`, or `pip install -e '.[spark,dev]'`",
}


def spark_required() -> bool:
    """Whether ``SR3_REQUIRE_SPARK`` asks for Spark; a value other than 0 or 1 is an error
    rather than a silent skip."""
    value = os.environ.get(REQUIRE_SPARK_ENV, "").strip()
    if value not in {"", "0", "1"}:
        raise pytest.UsageError(f"{REQUIRE_SPARK_ENV}={value!r}: expected 1 (or 0, or unset)")
    return value == "1"


def _java_found() -> bool:
    # PySpark's launcher runs $JAVA_HOME/bin/java when JAVA_HOME is set, else `java`.
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        return os.access(Path(java_home) / "bin" / "java", os.X_OK)
    return shutil.which("java") is not None


def missing_spark_requirements(*modules: str) -> list[str]:
    """What real Spark needs and this machine lacks: a Java runtime, PySpark, and the
    extra Python ``modules`` (e.g. pandas), each with how to install it."""
    missing = [] if _java_found() else ["java"]
    missing += [name for name in ("pyspark", *modules) if importlib.util.find_spec(name) is None]
    return [SPARK_INSTALL_HINTS.get(name, f"the Python module {name}") for name in missing]


def require_spark(*modules: str) -> None:
    """Skip the calling test without Java, PySpark or ``modules``; fail it instead when
    ``SR3_REQUIRE_SPARK=1`` (CI), saying what is missing and how to install it."""
    missing = missing_spark_requirements(*modules)
    if not missing:
        return
    if spark_required():
        pytest.fail(
            f"{REQUIRE_SPARK_ENV}=1 but Spark cannot run; missing " + "; ".join(missing),
            pytrace=False,
        )
    pytest.skip("Spark cannot run; missing " + "; ".join(missing))


LARGE_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class HttpProbe:
    """A bare aiohttp session that sends signed or unsigned requests to one cluster."""

    def __init__(self, secret: str) -> None:
        self.signer = Signer(secret, time.time)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30), auto_decompress=False
        )

    async def __aenter__(self) -> HttpProbe:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        """The session itself, for a test that reads an answer as it streams."""
        return self._session

    async def send(
        self,
        address: str,
        method: str,
        path_qs: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """Send exactly these headers (none added) and return the peer's answer."""
        url = URL(f"http://{address}{path_qs}", encoded=True)
        # aiohttp warns (an error under our warning filter) about large raw bytes bodies.
        data = io.BytesIO(body) if body is not None and len(body) > LARGE_BODY_BYTES else body
        async with self._session.request(
            method, url, data=data, headers=dict(headers or {})
        ) as answer:
            return Answer(answer.status, dict(answer.headers), await answer.read())

    async def signed(
        self, address: str, method: str, path_qs: str, *, body: bytes | None = None
    ) -> Answer:
        headers = self.signer.headers(method, path_qs, body, target=address)
        return await self.send(address, method, path_qs, body=body, headers=headers)

    async def info(self, address: str) -> dict[str, Any]:
        answer = await self.signed(address, "GET", "/v1/info")
        assert answer.status == 200, answer
        info: dict[str, Any] = answer.json()
        return info

    async def health(self, address: str) -> int:
        return (await self.send(address, "GET", "/v1/health")).status

    async def metrics(self, address: str) -> str:
        answer = await self.signed(address, "GET", "/metrics")
        assert answer.status == 200, answer
        return answer.body.decode()


async def acceptors_of(probe: HttpProbe, address: str, key: str) -> tuple[str, ...]:
    """A record key's acceptors as the peer at ``address`` computes them (its own
    member table, its R): what a round sent there must name as its ``view``."""
    answer = await probe.signed(address, "GET", api.RING.pattern)
    assert answer.status == 200, answer
    description = api.RingDescription.from_json(answer.json())
    ring = Ring.build(
        (Member(m.peer_id, m.address, m.zone) for m in description.members),
        vnodes=description.vnodes,
        zone_aware=description.zone_aware,
    )
    group = paxos.record_group(description.replication)
    return tuple(m.peer_id for m in ring.preference_list(key, group))


def client_tls(cluster: LocalCluster) -> ClientTls:
    """The client certificate, key and CA of a cluster started with ``tls=True``."""
    tls = cluster.client_tls
    assert tls is not None and tls.cert_file is not None and tls.key_file is not None
    return tls


def wait_until(
    condition: Callable[[], bool], what: str, timeout_s: float, poll_s: float = 0.05
) -> None:
    """Poll ``condition`` until it holds; ``AssertionError`` naming ``what`` once
    ``timeout_s`` passed first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(poll_s)


def peer_address(cluster: LocalCluster, peer_id: str) -> str:
    return cluster.peer(peer_id).address


def chunk_file(cluster: LocalCluster, peer_id: str, chunk_id: str) -> Path:
    """Where ``peer_id`` keeps ``chunk_id`` on disk (whether or not it exists)."""
    return Path(cluster.peer(peer_id).data_dir) / "chunks" / chunk_id[:2] / chunk_id


def chunk_holders(cluster: LocalCluster, chunk_id: str) -> list[str]:
    """Peer ids whose data folder holds a file for ``chunk_id``, found on disk."""
    return [
        peer.peer_id
        for peer in cluster.cluster.peers
        if chunk_file(cluster, peer.peer_id, chunk_id).is_file()
    ]


@contextlib.contextmanager
def frozen(cluster: LocalCluster, peer_id: str) -> Iterator[None]:
    """``peer_id`` stopped (SIGSTOP: its kernel still accepts and buffers) for the block,
    and resumed after it, whatever the block raised."""
    cluster.signal(peer_id, signal.SIGSTOP)
    try:
        yield
    finally:
        cluster.signal(peer_id, signal.SIGCONT)


def log_ends(cluster: LocalCluster) -> dict[str, int]:
    """How far each peer's log reaches now (for ``tracebacks_since``)."""
    return {
        peer.peer_id: Path(peer.log_file).stat().st_size
        for peer in cluster.cluster.peers
        if peer.log_file is not None and Path(peer.log_file).exists()
    }


def tracebacks_since(cluster: LocalCluster, ends: Mapping[str, int]) -> list[str]:
    """Each traceback a peer logged since ``ends`` (``log_ends``): its peer and first
    lines."""
    found = []
    for peer in cluster.cluster.peers:
        if peer.log_file is None or not Path(peer.log_file).exists():
            continue
        with Path(peer.log_file).open("rb") as log:
            log.seek(ends.get(peer.peer_id, 0))
            text = log.read().decode(errors="replace")
        found += [f"{peer.peer_id}: {part[:1500]}" for part in text.split("Traceback")[1:]]
    return found


def metric_value(text: str, name: str) -> float:
    """The value of an unlabelled sample ``name`` in Prometheus text; 0.0 when absent."""
    match = re.search(rf"^{re.escape(name)} ([0-9.eE+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


# A checkpoint as Spark 4.3 lays it out (tests/fixtures), with random bytes of the listed
# sizes, and the files of one more batch.
SPARK_CONF = {"spark.sql.shuffle.partitions": "2"}
LISTING = Path(__file__).parent / "fixtures" / "spark_4_3_listings" / "hdfs_aggregation.txt"


def offsets_file(batch_id: int, size: int) -> bytes:
    """An offsets log entry as Spark writes it (version, metadata with the conf that pins
    the state partitions, source offset), padded to ``size``."""
    metadata = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": batch_id, "conf": SPARK_CONF})
    body = f'v1\n{metadata}\n{{"logOffset":{batch_id}}}'.encode()
    return body + b" " * max(0, size - len(body))


def write_file(root: Path, path: str, size: int, rng: random.Random) -> Path:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    if path.startswith("offsets/") and path.rpartition("/")[2].isdigit():
        target.write_bytes(offsets_file(int(path.rpartition("/")[2]), size))
    else:
        target.write_bytes(rng.randbytes(size))
    return target


def materialize(root: Path, rng: random.Random) -> None:
    for line in LISTING.read_text().splitlines():
        if not line.strip() or line.startswith(("#", "@")):
            continue
        size, path = line.split(" ", 1)
        write_file(root, path, int(size), rng)


def commit_next_batch(root: Path, rng: random.Random) -> list[Path]:
    """Write what Spark writes for batch 20: offsets, state version 21, then the commit."""
    paths = ["offsets/20", "state/0/0/21.delta", "state/0/1/21.delta", "commits/20"]
    return [write_file(root, path, rng.randrange(90, 1200), rng) for path in paths]


@contextlib.contextmanager
def small_disk(mount_point: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``mount_point`` for a test (a disk that fills
    for real); skips without root or when mounting fails."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount_point.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def names_apart_unavailable() -> str | None:
    """Why peers cannot run each in a mount namespace with an ``/etc/hosts`` of its own
    (names that resolve for them and not for the test), or None."""
    if os.geteuid() != 0:
        return "mount namespaces need root"
    if shutil.which("unshare") is None:
        return "`unshare` (util-linux) is missing"
    probe = subprocess.run(
        ["unshare", "-m", "--", "sh", "-c", "mount --bind /etc/hosts /etc/hosts"],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        return f"cannot bind-mount in a mount namespace: {probe.stderr.strip()[:200]}"
    return None


def require_names_apart() -> None:
    """Skip when peers cannot run with names of their own; fail instead under
    ``SR3_REQUIRE_NETLAB=1`` (CI, as root)."""
    reason = names_apart_unavailable()
    if reason is None:
        return
    if os.environ.get("SR3_REQUIRE_NETLAB", "").strip() == "1":
        pytest.fail(f"SR3_REQUIRE_NETLAB=1 but peers cannot run with names apart: {reason}")
    pytest.skip(f"peers cannot run with names apart: {reason}")


def in_own_hosts(hosts_file: Path, command: list[str]) -> list[str]:
    """``command`` run in a mount namespace whose ``/etc/hosts`` is ``hosts_file``."""
    script = f'mount --bind "{hosts_file}" /etc/hosts && exec "$@"'
    return ["unshare", "-m", "--", "sh", "-c", script, "sh", *command]


def stop_processes(processes: list[subprocess.Popen[bytes]], wait_s: float = 15.0) -> list[int]:
    """SIGTERM every process (its whole group when it leads one, as a ``start_new_session``
    process does), then their exit codes; one still running after ``wait_s`` is killed
    (and its code says so): none is left running after a test."""

    def send(process: subprocess.Popen[bytes], signum: int) -> None:
        if process.poll() is not None:
            return
        if os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)

    for process in processes:
        send(process, signal.SIGTERM)
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=wait_s))
        except subprocess.TimeoutExpired:
            send(process, signal.SIGKILL)
            codes.append(process.wait(timeout=5))
    return codes


async def fs_rename(
    fs: FsClient, source: str, target: str, op: str, *, overwrite: bool = False
) -> fs_api.Stat:
    """A rename with a given operation id (every retry of it carries the same)."""
    query = f"?from={quote(source, safe='')}&to={quote(target, safe='')}&op={op}"
    query += "&overwrite=1" if overwrite else ""
    answer = await fs._request("POST", fs_api.FS_RENAME.pattern + query)
    return fs_api.parse_stat(answer.json())


class Cut(Exception):
    """The coordinator stopped here."""


class WritesClient:
    """A ring client whose writes (``put_record``, ``delete_record``) go through
    ``_write``, numbered from 0; everything else goes straight to ``client``."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.writes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def _write(self, index: int, send: Callable[[], Awaitable[int]]) -> int:
        return await send()

    async def _numbered(self, name: str, *args: Any, **kwargs: Any) -> int:
        index = self.writes
        self.writes += 1
        return await self._write(index, lambda: getattr(self._client, name)(*args, **kwargs))

    async def put_record(self, *args: Any, **kwargs: Any) -> int:
        return await self._numbered("put_record", *args, **kwargs)

    async def delete_record(self, *args: Any, **kwargs: Any) -> int:
        return await self._numbered("delete_record", *args, **kwargs)


class CutClient(WritesClient):
    """A ring client that stops at its ``cut_at``-th write (counting from 0): before
    sending it, or ("after") once it landed, as a coordinator that dies before or
    after a write reaches the ring."""

    def __init__(self, client: Client, cut_at: int, when: Literal["before", "after"]) -> None:
        super().__init__(client)
        self._cut_at = cut_at
        self._when = when

    async def _write(self, index: int, send: Callable[[], Awaitable[int]]) -> int:
        if index == self._cut_at and self._when == "before":
            raise Cut(f"cut before write {index}")
        if index > self._cut_at:
            raise Cut(f"write {index} after the cut")
        result = await send()
        if index == self._cut_at:
            raise Cut(f"cut after write {index}")
        return result


async def where_renamed(
    fs: FsClient, source: str, target: str, data: bytes, old: bytes | None = None
) -> tuple[bool, bool]:
    """Whether ``data`` is at the source and at the target, by reads and by listings
    (which must agree); the target holds ``old`` when it does not."""
    at: list[bool] = []
    for path, other in ((source, None), (target, old)):
        try:
            read = await fs.read(path)
        except NotFound:
            read = None
        assert read in (data, other), (path, read)
        parent = path.rsplit("/", 1)[0]
        try:
            listed = path in {entry.path for entry in await fs.list(parent)}
        except NotFound:
            listed = False
        assert (read is not None) == listed, (path, read, listed)
        at.append(read == data)
    return at[0], at[1]


def wall_ms() -> int:
    """The wall clock in milliseconds, as a namespace's coordinator reads it."""
    return int(time.time() * 1000)


async def cut_rename(
    client: Client, source: str, target: str, op: str, *, cut_at: int,
    when: Literal["before", "after"], overwrite: bool = False,
) -> None:  # fmt: skip
    """Rename ``op`` through a namespace whose ring client stops at its ``cut_at``-th
    write (``CutClient``): its coordinator dies there and the client never hears back."""
    namespace = Namespace(CutClient(client, cut_at, when), wall_ms)  # type: ignore[arg-type]
    with pytest.raises(Cut):
        await namespace.rename(source, target, overwrite=overwrite, op=op)


def spark_credential(secret: str) -> str:
    """A credential scoped to ``/spark`` for an hour: what a test's executors get."""
    now = int(time.time())
    return scoped_credential(secret, "/spark", expires_at=now + 3600, issued_at=now)
