"""Fenced writes to the ``sr3://`` namespace (``lease=&fence=``, ``ring.fs_api``), for a
hot-standby Spark driver: a driver writes its offset and commit logs under a lease
(``ring.lease``), and once another driver takes the lease over, its writes are refused.

What must hold, on the shared 5-peer ring: a PUT, rename or delete fenced by the fence
that holds its lease goes through; once the lease is taken over (fence + 1), or when its
record is absent, released or not a lease, the same request is refused with 409
"fenced" (``Fenced`` in Python, a message naming the holder) and changes nothing; a
malformed fence is a 400, never a 5xx; unfenced requests are unaffected. Through Spark's
JVM (``sr3.hadoop.Sr3Fence``, called by py4j): a held checkpoint's offset and commit log
writes go through, are refused after a takeover made in Python, its other files are not
fenced, and a hold whose validity has passed refuses locally, sending nothing.

Run as a script, this module is that Spark driver (one SparkSession of its own, with the
``sr3://`` conf and jar; the session shared by other tests has neither).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import quote

import pytest
from support import HttpProbe, log_ends, require_spark, tracebacks_since

from ring import api, fs_api
from ring.client import Client
from ring.errors import Fenced, NotFound
from ring.lease import LEASE_BYTES_MAX, first_lease, parse_lease
from spark_connector.fs_client import FsClient
from sr3.local import LocalCluster

LEASE_TIMEOUT_S = 3.0
DRIVER_TIMEOUT_S = 300
VALID_MS = 600_000


def _names(rng: random.Random) -> tuple[str, str]:
    """A checkpoint's namespace path and its lease's record key."""
    query = f"fence-{rng.randrange(10**12)}"
    return f"/spark/tests/{query}", f"spark/tests/{query}/lease"


async def _first_lease(client: Client, key: str, holder: str = "driver-a") -> None:
    await client.put_record(
        key, first_lease(holder, LEASE_TIMEOUT_S, time.time()).encode(), expected_version=0
    )


async def _take_over(client: Client, key: str, holder: str = "driver-b") -> int:
    """The lease taken by ``holder`` (compare-and-set on its version); its new fence."""
    record = await client.get_record(key)
    assert record is not None
    taken = parse_lease(record.value).taken_by(holder, LEASE_TIMEOUT_S, time.time())
    await client.put_record(key, taken.encode(), expected_version=record.version)
    return taken.fence


async def test_a_taken_over_lease_refuses_its_old_holders_writes_renames_and_deletes(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: the lease a writer holds (fence 1) is taken over (fence 2). Must hold:
    before, fence 1 writes, renames and deletes; after, each of them with fence 1 is
    refused (``Fenced``, naming the new holder) and the files are as they were; fence 2
    and unfenced requests go through."""
    root, key = _names(rng)
    async with Client(ring.ring, ring.secret) as client, FsClient(ring.ring, ring.secret) as fs:
        await _first_lease(client, key)
        old = (key, 1)
        await fs.write(f"{root}/commits/0", b"commit 0", fence=old)
        await fs.write(f"{root}/offsets/0", b"offset 0", fence=old)
        await fs.write(f"{root}/offsets/1.tmp", b"offset 1", fence=old)
        await fs.rename(f"{root}/offsets/1.tmp", f"{root}/offsets/1", fence=old)
        await fs.write(f"{root}/commits/gone", b"x", fence=old)
        assert await fs.delete(f"{root}/commits/gone", fence=old) == 1

        assert await _take_over(client, key) == 2
        with pytest.raises(Fenced) as refused:
            await fs.write(f"{root}/commits/1", b"late commit", fence=old)
        message = str(refused.value)
        assert message.startswith(f"fenced: lease {key} is held by driver-b with fence 2"), message
        assert "fence 1 was taken over" in message and "must stop" in message, message
        with pytest.raises(Fenced):
            await fs.write(f"{root}/commits/0", b"overwritten", overwrite=True, fence=old)
        with pytest.raises(Fenced):
            await fs.rename(f"{root}/offsets/0", f"{root}/offsets/9", fence=old)
        with pytest.raises(Fenced):
            await fs.delete(f"{root}/offsets/1", fence=old)
        with pytest.raises(Fenced):
            await fs.delete(f"{root}", recursive=True, fence=old)

        assert not await fs.exists(f"{root}/commits/1")
        assert await fs.read(f"{root}/commits/0") == b"commit 0"
        assert await fs.read(f"{root}/offsets/0") == b"offset 0"
        assert not await fs.exists(f"{root}/offsets/9")
        assert await fs.read(f"{root}/offsets/1") == b"offset 1"

        new = (key, 2)
        await fs.write(f"{root}/commits/1", b"commit 1", fence=new)
        await fs.rename(f"{root}/offsets/1", f"{root}/offsets/2", fence=new)
        await fs.write(f"{root}/state/0/1.delta", b"unfenced")
        await fs.rename(f"{root}/state/0/1.delta", f"{root}/state/0/2.delta")
        assert await fs.delete(f"{root}/state", recursive=True) >= 1
        assert not await fs.exists(f"{root}/state")
        assert await fs.read(f"{root}/commits/1") == b"commit 1"
        assert [entry.name for entry in await fs.list(f"{root}/offsets")] == ["0", "2"]


async def test_an_absent_released_or_foreign_lease_refuses_fenced_writes(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: fenced writes naming a lease record that does not exist, holds something
    other than a lease, was released, or holds an older fence than the writer names.
    Must hold: each is refused (``Fenced``, saying which) and writes nothing."""
    root, key = _names(rng)
    cases: list[tuple[str, bytes | None, int, str]] = [
        ("absent", None, 1, f"no lease record {key}"),
        ("foreign", b'{"not": "a lease"}', 1, f"record {key} is not a lease"),
        (
            "released",
            dataclasses.replace(
                first_lease("driver-a", LEASE_TIMEOUT_S, 1.0), released=True
            ).encode(),
            1,
            f"lease {key} was released by driver-a (fence 1)",
        ),
        (
            "ahead",
            first_lease("driver-a", LEASE_TIMEOUT_S, 1.0).encode(),
            3,
            f"lease {key} is held by driver-a with fence 1; "
            "this writer's fence 3 was never granted",
        ),
    ]
    async with Client(ring.ring, ring.secret) as client, FsClient(ring.ring, ring.secret) as fs:
        for name, value, fence, message in cases:
            case_key = f"{key}-{name}"
            if value is not None:
                await client.put_record(case_key, value, expected_version=0)
            expected = message.replace(key, case_key)
            path = f"{root}/{name}/commits/0"
            with pytest.raises(Fenced) as refused:
                await fs.write(path, b"x", fence=(case_key, fence))
            assert str(refused.value).startswith(f"fenced: {expected}"), (name, refused.value)
            assert not await fs.exists(path), name
            with pytest.raises(NotFound):
                await fs.stat(f"{root}/{name}")


async def test_a_lease_record_nested_deep_or_huge_refuses_fenced_writes_without_a_5xx(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: the record a fenced PUT, rename and delete name holds JSON nested 100 000
    deep, a number of 5 000 digits, or a lease padded past ``LEASE_BYTES_MAX`` (was: 500
    ``RecursionError`` and a traceback at every fenced write naming it). Must hold: each
    is refused 409 "fenced" (the record is not a lease), writes nothing, and no peer
    logs a traceback."""
    root, key = _names(rng)
    lease = first_lease("driver-a", LEASE_TIMEOUT_S, 1.0)
    values = {
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "digits": lease.encode().replace(b'"fence":1', b'"fence":' + b"1" * 5000),
        "huge": lease.encode()[:-1] + b',"pad":"' + b"x" * LEASE_BYTES_MAX + b'"}',
    }
    ends = log_ends(ring)
    async with Client(ring.ring, ring.secret) as client, FsClient(ring.ring, ring.secret) as fs:
        await fs.write(f"{root}/commits/0", b"kept")
        for name, value in values.items():
            case_key = f"{key}-{name}"
            await client.put_record(case_key, value, expected_version=0)
            fence = (case_key, 1)
            attempts: list[Callable[[], Awaitable[object]]] = [
                partial(fs.write, f"{root}/commits/1", b"x", fence=fence),
                partial(fs.rename, f"{root}/commits/0", f"{root}/commits/9", fence=fence),
                partial(fs.delete, f"{root}/commits/0", fence=fence),
            ]
            for attempt in attempts:
                with pytest.raises(Fenced, match=f"record {case_key} is not a lease"):
                    await attempt()
        assert [entry.name for entry in await fs.list(f"{root}/commits")] == ["0"]
    assert tracebacks_since(ring, ends) == []


@pytest.mark.parametrize(
    "query",
    [
        "lease=spark%2Fq%2Flease",
        "fence=1",
        # Digits str.isdigit takes: superscript two and five and a circled five made
        # int() raise (a 500); a fullwidth and an Arabic-Indic five were taken as 5.
        "lease=spark%2Fq%2Flease&fence=%C2%B2",
        "lease=spark%2Fq%2Flease&fence=%E2%81%B5",
        "lease=spark%2Fq%2Flease&fence=%E2%91%A4",
        "lease=spark%2Fq%2Flease&fence=%EF%BC%95",
        "lease=spark%2Fq%2Flease&fence=%D9%A5",
        "lease=spark%2Fq%2Flease&fence=1%FF",
        "lease=spark%2Fq%2Flease&fence=+1",
        "lease=spark%2Fq%2Flease&fence=1_0",
        # A file's record is never a lease (and would tell whether the file exists).
        "lease=fs%2Fspark%2Ftests&fence=1",
        "lease=spark%2Fq%2Flease&fence=0",
        "lease=spark%2Fq%2Flease&fence=-1",
        "lease=spark%2Fq%2Flease&fence=abc",
        f"lease=spark%2Fq%2Flease&fence={2**53}",
        "lease=spark%2Fq%2Flease&fence=99999999999999999999",
        "lease=spark%2F%2Flease&fence=1",
        "lease=%2Fspark&fence=1",
        "lease=sp%20ark&fence=1",
        "lease=&fence=1",
    ],
)
async def test_a_malformed_fence_is_a_400_and_changes_nothing(
    ring: LocalCluster, rng: random.Random, query: str
) -> None:
    """Must hold: a fenced PUT, rename or delete whose fence is malformed (one half
    missing, not a number of ASCII digits in range, an invalid record key, a file's
    record) is a 400, never a 5xx; it writes, renames and deletes nothing; the peer
    keeps answering and logs no traceback."""
    root, _key = _names(rng)
    address = ring.cluster.addresses[1]
    ends = log_ends(ring)
    async with FsClient(address, ring.secret) as fs:
        await fs.write(f"{root}/commits/0", b"kept")
    async with HttpProbe(ring.secret) as probe:
        put = fs_api.fs_path(fs_api.FS_WRITE, f"{root}/commits/1") + "?" + query
        answer = await probe.signed(address, "PUT", put, body=b"x")
        assert answer.status == 400, (query, answer.status, answer.body[:200])
        source, target = quote(f"{root}/commits/0", safe=""), quote(f"{root}/moved", safe="")
        rename = f"{fs_api.FS_RENAME.pattern}?from={source}&to={target}&{query}"
        answer = await probe.signed(address, "POST", rename)
        assert answer.status == 400, (query, answer.status, answer.body[:200])
        delete = fs_api.fs_path(fs_api.FS_DELETE, f"{root}/commits/0") + "?" + query
        answer = await probe.signed(address, "DELETE", delete)
        assert answer.status == 400, (query, answer.status, answer.body[:200])
        assert (await probe.send(address, "GET", api.HEALTH.pattern)).status == 200
    async with FsClient(address, ring.secret) as fs:
        assert [entry.name for entry in await fs.list(f"{root}/commits")] == ["0"]
        assert not await fs.exists(f"{root}/moved")
    assert tracebacks_since(ring, ends) == []


# -- through Spark's JVM ---------------------------------------------------------------


@pytest.mark.slow
async def test_spark_offset_and_commit_logs_are_fenced_through_the_jvm(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a Spark driver (its own SparkSession, the sr3:// conf) holds a checkpoint
    with ``Sr3Fence.hold`` and writes its logs through Spark's checkpoint file manager
    and Hadoop's FileSystem; then the lease is taken over in Python; then its hold lapses
    on its own clock. Must hold: the logs go through while held; after the takeover each
    log write, rename and delete fails with "sr3: <path>: fenced:" and changes nothing;
    a state file is not fenced; a lapsed hold fails locally ("lapsed"; the file would
    have been accepted with that fence); the new fence and a dropped hold write."""
    require_spark()
    if shutil.which("javac") is None:
        pytest.skip("no javac")
    checkpoint, key = _names(rng)
    async with Client(ring.ring, ring.secret) as client:
        await _first_lease(client, key)
    env = {**os.environ, "SR3_RING": ring.ring, "SR3_SECRET": ring.secret}
    job = json.dumps({"checkpoint": checkpoint, "lease": key})
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, __file__, job],
        env=env, capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S, check=False,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    outcomes: dict[str, str] = json.loads(lines[-1].removeprefix("RESULT "))

    def fenced(path: str) -> str:
        return f"java.io.IOException: sr3: {checkpoint}/{path}: fenced: "

    assert outcomes.pop("commit 0") == "ok"
    assert outcomes.pop("offset 0") == "ok"
    assert outcomes.pop("take over") == "ok"
    after_takeover = {
        "commit 1": "commits/1",
        "offset 1": "offsets/1",
        "rename offset 0": "offsets/0",
        "delete commit 0": "commits/0",
        "manager delete commit 0": "commits/0",
    }
    for step, path in after_takeover.items():
        outcome = outcomes.pop(step)
        assert outcome.startswith(fenced(path) + f"lease {key} is held by driver-b"), outcome
    assert outcomes.pop("state file") == "ok"
    lapsed = outcomes.pop("commit 2 lapsed")
    assert lapsed.startswith(fenced("commits/2") + f"the lease {key} (fence 2) lapsed"), lapsed
    assert outcomes.pop("commit 3 new fence") == "ok"
    assert outcomes.pop("commit 4 dropped") == "ok"
    assert not outcomes, outcomes

    async with FsClient(ring.ring, ring.secret) as fs:
        assert await fs.read(f"{checkpoint}/commits/0") == b"commit 0"
        assert await fs.read(f"{checkpoint}/offsets/0") == b"offset 0"
        assert await fs.read(f"{checkpoint}/state/0/0/1.delta") == b"state"
        commits = [entry.name for entry in await fs.list(f"{checkpoint}/commits")]
        assert commits == ["0", "3", "4"], commits
        offsets = [entry.name for entry in await fs.list(f"{checkpoint}/offsets")]
        assert offsets == ["0"], offsets


def _spark_session() -> Any:
    """A local SparkSession with the sr3:// conf (a credential scoped to /spark)."""
    from pyspark.sql import SparkSession

    from spark_connector.conf import spark_conf

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master("local[1]").appName("sr3-fence-tests")
    settings = {
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        **spark_conf(os.environ["SR3_RING"], os.environ["SR3_SECRET"], prefix="spark/"),
    }
    for name, value in settings.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _take_over_now(key: str) -> None:
    from ring.sync_client import SyncClient

    with SyncClient(os.environ["SR3_RING"], os.environ["SR3_SECRET"]) as client:
        record = client.get_record(key)
        assert record is not None
        taken = parse_lease(record.value).taken_by("driver-b", LEASE_TIMEOUT_S, time.time())
        client.put_record(key, taken.encode(), expected_version=record.version)


def _driver(checkpoint: str, key: str) -> dict[str, str]:
    """The Spark side of the test above: each step's outcome, "ok" or the Java error."""
    from py4j.protocol import Py4JJavaError

    spark = _spark_session()
    jvm: Any = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    fences = jvm.sr3.hadoop.Sr3Fence
    uri = f"sr3://{checkpoint}"
    manager = jvm.sr3.hadoop.Sr3CheckpointFileManager(jvm.org.apache.hadoop.fs.Path(uri), conf)
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("sr3:///"), conf)

    def path(name: str) -> Any:
        return jvm.org.apache.hadoop.fs.Path(f"{uri}/{name}")

    def atomic(name: str, data: bytes) -> None:
        stream = manager.createAtomic(path(name), False)
        stream.write(bytearray(data))
        stream.close()

    def create(name: str, data: bytes) -> None:
        stream = fs.create(path(name), False)
        stream.write(bytearray(data))
        stream.close()

    outcomes: dict[str, str] = {}

    def step(name: str, action: Callable[[], object]) -> None:
        try:
            action()
            outcomes[name] = "ok"
        except Py4JJavaError as exc:
            outcomes[name] = str(exc.java_exception.toString())

    fences.hold(uri, key, 1, VALID_MS)
    step("commit 0", lambda: atomic("commits/0", b"commit 0"))
    step("offset 0", lambda: create("offsets/0", b"offset 0"))
    step("take over", lambda: _take_over_now(key))
    step("commit 1", lambda: atomic("commits/1", b"late commit"))
    step("offset 1", lambda: create("offsets/1", b"late offset"))
    step("rename offset 0", lambda: fs.rename(path("offsets/0"), path("moved")))
    step("delete commit 0", lambda: fs.delete(path("commits/0"), False))
    step("manager delete commit 0", lambda: manager.delete(path("commits/0")))
    step("state file", lambda: atomic("state/0/0/1.delta", b"state"))
    fences.hold(checkpoint, key, 2, 0)
    step("commit 2 lapsed", lambda: atomic("commits/2", b"lapsed commit"))
    fences.hold(checkpoint + "/", key, 2, VALID_MS)
    step("commit 3 new fence", lambda: atomic("commits/3", b"commit 3"))
    fences.drop(uri)
    step("commit 4 dropped", lambda: atomic("commits/4", b"commit 4"))
    spark.stop()
    return outcomes


if __name__ == "__main__":
    arguments = json.loads(sys.argv[1])
    print("RESULT " + json.dumps(_driver(arguments["checkpoint"], arguments["lease"])))
