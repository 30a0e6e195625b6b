"""The public Python API: what a user stores is named and kept until deleted, ``Client()``
finds the ring the way the command line does, and the README's example runs as written.

What it breaks: the peers collect unreferenced chunks after a grace of seconds, and the
test waits past it; the README's example runs in a fresh process that knows only the
cluster file of a running cluster.

What must hold: files and bytes stored through ``put_file``/``put_bytes`` read back
byte-identical after any number of collection rounds; only an unnamed upload (the
internal ``client.chunks``) or a deleted file's chunks are collected; the README's
Python block exits 0 and leaves what it says it stores.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import MakeCluster, chunk_holders, wait_until

from ring.blobs import BlobRef
from ring.client import client as client_module
from ring.errors import ConfigError, NotFound
from sr3 import Client, FileInfo, SyncClient
from sr3.local import LocalCluster

README = Path(__file__).resolve().parents[1] / "README.md"
GRACE_S = 2.0
GC_FLAGS = ["--scrub-rate", "0", "--repair-interval", "3600",
            "--gc-interval", "0.3", "--gc-grace", str(GRACE_S)]  # fmt: skip
WAIT_S_MAX = 60.0
POLL_S = 0.2


def held_anywhere(cluster: LocalCluster, chunk_ids: list[str]) -> set[str]:
    return {chunk_id for chunk_id in chunk_ids if chunk_holders(cluster, chunk_id)}


def readme_python_example() -> str:
    """The first ``python`` block under the README's "### Python" heading."""
    text = README.read_text()
    section = text[text.index("### Python\n") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "README has no Python example"
    return match.group(1)


def test_readme_python_example_runs_as_written(make_cluster: MakeCluster, tmp_path: Path) -> None:
    """Breaks: a fresh process that knows only ``SR3_CLUSTER_FILE``/``SR3_HOME`` (as after
    ``sr3 cluster up``) runs the README's block in an empty folder. Holds: it exits 0
    without warnings, and what it stored is on the ring under the names it used."""
    cluster = make_cluster(3)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"SR3_RING", "SR3_SECRET"}}
    env |= {
        "SR3_CLUSTER_FILE": str(cluster.cluster_file),
        "SR3_HOME": str(tmp_path / "home"),
        "PYTHONWARNINGS": "error",
    }
    done = subprocess.run(
        [sys.executable, "-c", readme_python_example()],
        cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Unclosed" not in done.stderr, done.stderr
    assert "b'offset=42'" in done.stdout
    assert "['job1/offset', 'job1/state']" in done.stdout
    state = (work / "state.bin").read_bytes()
    assert (work / "restored.bin").read_bytes() == state
    assert (work / "again.bin").read_bytes() == state
    with SyncClient(cluster.ring, cluster.secret) as client:
        assert client.get_bytes("job1/state") == state
        assert list(client.list_files()) == ["job1/state"]  # job1/offset was deleted


def test_client_finds_the_ring_like_the_cli_or_says_how_to_give_it(
    make_cluster: MakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SR3_RING", "SR3_SECRET", "SR3_CLUSTER_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SR3_HOME", str(tmp_path / "empty-home"))
    with pytest.raises(ConfigError, match=r"ring=.*SR3_RING.*sr3 cluster up"):
        Client()
    with pytest.raises(ConfigError, match=r"ring=.*SR3_RING.*sr3 cluster up"):
        SyncClient()
    monkeypatch.setenv("SR3_RING", "127.0.0.1:7401")
    with pytest.raises(ConfigError, match=r"secret=.*SR3_SECRET"):
        Client()
    monkeypatch.delenv("SR3_RING")
    cluster = make_cluster(3)
    monkeypatch.setenv("SR3_CLUSTER_FILE", str(cluster.cluster_file))
    with SyncClient() as client:
        assert client.put_bytes(b"found", "found/it").version == 1
    monkeypatch.delenv("SR3_CLUSTER_FILE")
    monkeypatch.setenv("SR3_RING", cluster.ring)
    monkeypatch.setenv("SR3_SECRET", cluster.secret)

    async def read() -> bytes:
        async with Client() as client:
            return await client.get_bytes("found/it")

    assert asyncio.run(read()) == b"found"


def test_named_files_replace_list_and_delete(ring: LocalCluster, rng: random.Random) -> None:
    prefix = f"api-{rng.randrange(10**9)}/"
    first, second = rng.randbytes(200_000), rng.randbytes(300)
    with SyncClient(ring.ring, ring.secret) as client:
        stored = client.put_bytes(first, prefix + "a")
        assert isinstance(stored, FileInfo) and (stored.size, stored.version) == (200_000, 1)
        assert client.put_bytes(second, prefix + "a").version == 2  # replaces
        assert client.get_bytes(prefix + "a") == second
        client.put_bytes(first, prefix + "b")
        listed = client.list_files(prefix)
        assert list(listed) == [prefix + "a", prefix + "b"]
        assert (listed[prefix + "a"].size, listed[prefix + "b"].size) == (300, 200_000)
        client.delete_file(prefix + "a")
        assert list(client.list_files(prefix)) == [prefix + "b"]
        with pytest.raises(NotFound):
            client.get_bytes(prefix + "a")
        with pytest.raises(NotFound):
            client.delete_file(prefix + "a")
        assert client.put_bytes(first, prefix + "a").version == 4  # over the tombstone


@pytest.mark.slow
def test_what_the_public_api_stores_outlives_the_grace_and_unnamed_chunks_do_not(
    make_cluster: MakeCluster, tmp_path: Path, rng: random.Random
) -> None:
    """Breaks: collection every 0.3 s with a 2 s grace, waited out several times over.
    Holds: a file and bytes stored through the public API read back byte-identical; an
    unnamed upload of the same kind (the internal ``client.chunks``) is collected, so
    collection did run; a deleted file's chunks are collected after the grace."""
    cluster = make_cluster(4, peer_flags=GC_FLAGS)
    path = tmp_path / "state.bin"
    path.write_bytes(rng.randbytes(3 * 1024 * 1024))
    data, loose, doomed = (rng.randbytes(1024 * 1024) for _ in range(3))

    async def store() -> tuple[list[str], list[str], list[str]]:
        async with Client(cluster.ring, cluster.secret) as client:
            kept = [(await client.put_file(path, "kept/file")).ref]
            kept.append((await client.put_bytes(data, "kept/bytes")).ref)
            gone = (await client.put_bytes(doomed, "deleted/bytes")).ref
            orphan = await client.chunks.put_blob(loose)
        ids = [e.chunk_id for ref in kept for e in ref.extents]
        return ids, [e.chunk_id for e in orphan.extents], [e.chunk_id for e in gone.extents]

    kept_ids, orphan_ids, doomed_ids = asyncio.run(store())
    wait_until(
        lambda: not held_anywhere(cluster, orphan_ids),
        "unnamed chunks collected",
        WAIT_S_MAX,
        POLL_S,
    )
    time.sleep(2 * GRACE_S)
    with SyncClient(cluster.ring, cluster.secret) as client:
        client.get_file("kept/file", tmp_path / "restored.bin")
        assert (tmp_path / "restored.bin").read_bytes() == path.read_bytes()
        assert client.get_bytes("kept/bytes") == data
        assert client.get_bytes("deleted/bytes") == doomed
        client.delete_file("deleted/bytes")
    assert held_anywhere(cluster, kept_ids) == set(kept_ids)
    wait_until(
        lambda: not held_anywhere(cluster, doomed_ids),
        "a deleted file's chunks",
        WAIT_S_MAX,
        POLL_S,
    )
    with SyncClient(cluster.ring, cluster.secret) as client:
        assert client.get_bytes("kept/bytes") == data
        assert sorted(client.list_files()) == ["kept/bytes", "kept/file"]


@pytest.mark.slow
def test_an_upload_that_outlasts_the_grace_is_stored_again_once_named(
    make_cluster: MakeCluster, rng: random.Random, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaks: a put's chunks are collected before the record naming them is written (the
    upload outlasted the grace: here naming waits until the peers collected them).
    Holds: the stored bytes read back, every chunk on at least W=2 peers."""
    cluster = make_cluster(4, peer_flags=GC_FLAGS)
    monkeypatch.setattr(client_module, "RESTORE_AFTER_S", GRACE_S)
    name = Client._name
    collected: list[str] = []

    async def name_late(self: Client, key: str, ref: BlobRef) -> FileInfo:
        ids = [extent.chunk_id for extent in ref.extents]

        def gone() -> bool:
            return not held_anywhere(cluster, ids)

        await asyncio.to_thread(wait_until, gone, "unnamed chunks collected", WAIT_S_MAX, POLL_S)
        collected.extend(ids)
        return await name(self, key, ref)

    monkeypatch.setattr(Client, "_name", name_late)
    data = rng.randbytes(1024 * 1024 + 5)
    with SyncClient(cluster.ring, cluster.secret) as client:
        client.put_bytes(data, "slow/bytes")
        assert collected
        assert client.get_bytes("slow/bytes") == data
    assert all(len(chunk_holders(cluster, chunk_id)) >= 2 for chunk_id in collected)
