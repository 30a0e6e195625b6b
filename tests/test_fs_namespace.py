"""The ``sr3://`` file namespace served by peers (``filesystem``).

What must hold, on the shared 5-peer ring (R=3, W=2), through any peer: a created file
reads back whole and by ranges, inline (small) or in chunks (large); create-if-absent is
exact under concurrency; rename replaces atomically; directories are implied, listed and
stat-ed as directories, deleted recursively; bad paths and bodies are refused with 4xx
and the peer stays up.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest
import xxhash
from aiohttp import web
from support import HttpProbe, MakeCluster, log_ends, tracebacks_since
from yarl import URL

from filesystem.entries import INLINE_BYTES_MAX
from ring import api, fs_api
from ring.errors import AuthError, NotFound, ProtocolError
from spark_connector.fs_checkpoints import (
    FsCheckpoint,
    copy_to_local,
    find_checkpoints,
    forget_checkpoint,
)
from spark_connector.fs_client import FsClient, FsRefused
from sr3.local import LocalCluster


def _root(rng: random.Random) -> str:
    return f"/tests/fs-{rng.randrange(10**12)}"


async def test_files_read_back_whole_and_by_ranges_from_any_peer(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a small file (inline in its record) and a large one (chunks) written
    through one peer. Must hold: every peer reads them back whole and at random ranges;
    stat gives size and a real modification time."""
    root = _root(rng)
    small = rng.randbytes(1000)
    large = rng.randbytes(INLINE_BYTES_MAX * 3 + 12345)
    async with FsClient(ring.cluster.addresses[0], ring.secret) as fs:
        before_ms = (await fs.write(f"{root}/small", small)).mtime_ms
        await fs.write(f"{root}/big/large.bin", large)
    assert before_ms > 1_600_000_000_000
    for address in ring.cluster.addresses:
        async with FsClient(address, ring.secret) as fs:
            assert await fs.read(f"{root}/small") == small
            assert await fs.read(f"{root}/big/large.bin") == large
            stat = await fs.stat(f"{root}/big/large.bin")
            assert (stat.type, stat.size) == ("file", len(large))
            # The content checksum (distcp -update compares them): equal bytes, equal sums.
            assert stat.checksum == xxhash.xxh3_128(large).hexdigest()
            assert (await fs.stat(f"{root}/small")).checksum == xxhash.xxh3_128(small).hexdigest()
            for _ in range(5):
                offset = rng.randrange(len(large))
                length = rng.randrange(1, 300_000)
                got = await fs.read(f"{root}/big/large.bin", offset, length)
                assert got == large[offset : offset + length]
            assert await fs.read(f"{root}/small", 990, 100) == small[990:]


async def test_a_seed_whose_clock_is_off_is_passed_over(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: the client's first seed answers every request 401 ``clock_skew`` (its
    clock is off). Must hold: the client moves on to the next seed, as past one that is
    down: the write and the read go through it."""

    async def refuse(_request: web.Request) -> web.Response:
        body = api.error_body("clock_skew", "signed 600 s ahead")
        return web.json_response(body, status=401)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        path, data = f"{_root(rng)}/through-the-next-seed", rng.randbytes(3000)
        async with FsClient([f"127.0.0.1:{port}", ring.cluster.addresses[0]], ring.secret) as fs:
            await fs.write(path, data)
            assert await fs.read(path) == data
    finally:
        await runner.cleanup()


async def test_a_file_of_many_chunks_reads_back_through_a_recovery_plan(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a file of 5 chunks (4 MiB each; reads of 4 or more go through recovery's
    executor) read whole and across chunk boundaries. Must hold: byte-identical."""
    path = f"{_root(rng)}/sst/000001.sst"
    data = rng.randbytes(4 * 1024 * 1024 * 4 + 777)
    async with FsClient(ring.cluster.addresses[3], ring.secret) as fs:
        await fs.write(path, data)
        assert await fs.read(path) == data
        offset = 4 * 1024 * 1024 - 10
        assert (
            await fs.read(path, offset, 9 * 1024 * 1024) == data[offset : offset + 9 * 1024 * 1024]
        )


async def test_create_if_absent_has_exactly_one_winner(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: 12 writers create one path at once, without overwrite, through different
    peers. Must hold: exactly one succeeds, the others get 409 "exists", and the file
    holds the winner's bytes."""
    path = f"{_root(rng)}/once"
    addresses = ring.cluster.addresses
    clients = [FsClient(addresses[i % len(addresses)], ring.secret) for i in range(12)]

    async def create(i: int) -> str:
        try:
            await clients[i].write(path, f"writer {i}".encode())
        except FsRefused as exc:
            return exc.code
        return f"won {i}"

    try:
        results = await asyncio.gather(*(create(i) for i in range(12)))
    finally:
        for client in clients:
            await client.close()
    winners = [r for r in results if r.startswith("won")]
    assert len(winners) == 1, results
    assert sorted(set(results) - set(winners)) == ["exists"], results
    async with FsClient(addresses[0], ring.secret) as fs:
        assert await fs.read(path) == f"writer {winners[0].split()[1]}".encode()


async def test_rename_replaces_atomically_and_refuses_without_overwrite(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Must hold: rename onto an existing file without overwrite is refused and changes
    nothing; with overwrite the target holds the source's bytes and the source is gone;
    renaming a missing file is 404."""
    root = _root(rng)
    async with FsClient(ring.cluster.addresses[1], ring.secret) as fs:
        await fs.write(f"{root}/tmp", b"new")
        await fs.write(f"{root}/final", b"old")
        with pytest.raises(FsRefused) as refused:
            await fs.rename(f"{root}/tmp", f"{root}/final")
        assert refused.value.code == "exists"
        assert await fs.read(f"{root}/final") == b"old"
        assert await fs.read(f"{root}/tmp") == b"new"
        await fs.rename(f"{root}/tmp", f"{root}/final", overwrite=True)
        assert await fs.read(f"{root}/final") == b"new"
        assert not await fs.exists(f"{root}/tmp")
        await fs.rename(f"{root}/final", f"{root}/moved/here")
        assert await fs.read(f"{root}/moved/here") == b"new"
        with pytest.raises(NotFound):
            await fs.rename(f"{root}/final", f"{root}/other")


async def test_directories_are_implied_listed_and_deleted_recursively(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Must hold: a directory exists when a file is under it or mkdirs made it; listing
    gives direct children only (subdirectories as directories); stat and list of a
    missing path are 404; a non-empty directory is deleted only recursively."""
    root = _root(rng)
    async with FsClient(ring.cluster.addresses[2], ring.secret) as fs:
        with pytest.raises(NotFound):
            await fs.stat(root)
        with pytest.raises(NotFound):
            await fs.list(root)
        await fs.write(f"{root}/state/0/1.delta", b"a")
        await fs.write(f"{root}/state/0/2.delta", b"bb")
        await fs.write(f"{root}/metadata", b"{}")
        assert await fs.mkdirs(f"{root}/offsets") is True
        assert await fs.mkdirs(f"{root}/offsets") is False
        assert (await fs.stat(f"{root}/state")).type == "directory"
        assert (await fs.stat(f"{root}/offsets")).type == "directory"
        listed = {(s.name, s.type, s.size) for s in await fs.list(root)}
        assert listed == {
            ("metadata", "file", 2),
            ("offsets", "directory", 0),
            ("state", "directory", 0),
        }
        assert [s.name for s in await fs.list(f"{root}/state/0")] == ["1.delta", "2.delta"]
        with pytest.raises(FsRefused) as refused:
            await fs.write(f"{root}/metadata/inner", b"x")
        assert refused.value.code == "parent_is_file"
        with pytest.raises(FsRefused) as refused:
            await fs.write(f"{root}/state", b"x")
        assert refused.value.code == "is_directory"
        with pytest.raises(FsRefused) as refused:
            await fs.delete(f"{root}/state")
        assert refused.value.code == "not_empty"
        assert await fs.delete(f"{root}/state", recursive=True) >= 2
        assert not await fs.exists(f"{root}/state/0/1.delta")
        assert not await fs.exists(f"{root}/state")
        assert await fs.delete(f"{root}/nothing") == 0
        assert {s.name for s in await fs.list(root)} == {"metadata", "offsets"}


async def test_any_utf8_name_is_a_path_stored_listed_renamed_and_deleted(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: names a key cannot hold as they are: spaces, Spark's %XX escapes, "=",
    ":", non-ASCII letters, and a name that looks like an escape (":3A"). Must hold:
    each is written, read back, listed under its own name (paged too), renamed and
    deleted; names that differ only where they are escaped stay apart."""
    root = f"{_root(rng)}/tbl"
    names = [
        "day=2026-11-27 10%3A00",
        "city=S%C3%A3o Paulo",
        "a b",
        "a:b",
        "a:3Ab",
        "é",
        "日本語.parquet",
        "100%",
    ]
    async with FsClient(ring.cluster.addresses[1], ring.secret) as fs:
        for index, name in enumerate(names):
            await fs.write(f"{root}/{name}/part-{index}", name.encode())
        for address in ring.cluster.addresses:
            async with FsClient(address, ring.secret) as other:
                assert sorted(s.name for s in await other.list(root)) == sorted(names)
                paged = await other.list(root, page_entries=3)
                assert sorted(s.name for s in paged) == sorted(names)
        for index, name in enumerate(names):
            child = f"{root}/{name}/part-{index}"
            assert await fs.read(child) == name.encode()
            assert [s.path for s in await fs.list(f"{root}/{name}")] == [child]
        await fs.rename(f"{root}/a b/part-2", f"{root}/a:b/moved %20")
        assert await fs.read(f"{root}/a:b/moved %20") == b"a b"
        assert {s.name for s in await fs.list(f"{root}/a:b")} == {"part-3", "moved %20"}
        assert await fs.read(f"{root}/a:3Ab/part-4") == b"a:3Ab"
        assert await fs.delete(f"{root}/é", recursive=True) == 2
        assert "é" not in {s.name for s in await fs.list(root)}


@pytest.mark.parametrize("escape", ["%FF", "%ED%A0%80", "%C0%AF", "%E2%82"])
async def test_a_path_whose_escapes_are_not_utf8_is_refused_on_every_route(
    ring: LocalCluster, rng: random.Random, escape: str
) -> None:
    """Breaks: a path's percent-escape that is no UTF-8 (a lone byte, an encoded
    surrogate, an overlong "/", a sequence cut short) on every namespace route, in the
    URL's path and in a rename's query (was: the path stored under the escape's literal
    text, so ``a%FF`` and ``a%25FF`` named one file; the query's turned into U+FFFD).
    Must hold: each is 400, and the file whose name is the escape's text (and the one
    named U+FFFD) are untouched; no peer logs a traceback."""
    root = _root(rng)
    literal, replaced = f"{root}/a{escape}", f"{root}/a\ufffd"
    in_path = "/".join(quote(part, safe="") for part in fs_api.components(root)) + "/a" + escape
    in_query, moved = quote(f"{root}/a", safe="") + escape, quote(f"{root}/moved", safe="")
    routes = (fs_api.FS_WRITE, fs_api.FS_READ, fs_api.FS_STAT, fs_api.FS_LIST,
              fs_api.FS_DELETE, fs_api.FS_MKDIRS, fs_api.FS_USAGE)  # fmt: skip
    requests = [(route.method, route.pattern.replace("{path:.*}", in_path)) for route in routes]
    rename = fs_api.FS_RENAME.pattern
    requests += [("POST", f"{rename}?from={in_query}&to={moved}"),
                 ("POST", f"{rename}?from={moved}&to={in_query}")]  # fmt: skip
    address = ring.cluster.addresses[2]
    async with FsClient(address, ring.secret) as fs:
        await fs.write(literal, b"literal")
        await fs.write(replaced, b"replaced")
        await fs.write(f"{root}/moved", b"moved")
    ends = log_ends(ring)
    async with HttpProbe(ring.secret) as probe:
        for method, path in requests:
            body = b"overwritten" if method == "PUT" else None
            query = "?overwrite=1" if method == "PUT" else ""
            answer = await probe.signed(address, method, path + query, body=body)
            assert answer.status == 400, (method, path, answer.status, answer.body[:200])
            assert "not UTF-8" in answer.json()["message"], answer.body[:200]
    async with FsClient(address, ring.secret) as fs:
        assert await fs.read(literal) == b"literal"
        assert await fs.read(replaced) == b"replaced"
        assert await fs.read(f"{root}/moved") == b"moved"
        names = sorted(stat.name for stat in await fs.list(root))
        assert names == sorted([f"a{escape}", "a\ufffd", "moved"]), names
    assert tracebacks_since(ring, ends) == []


def test_a_name_and_its_key_form_are_one_to_one() -> None:
    """Must hold: every name's key form holds only key characters, reads back as the
    name, and no other text reads as that name (one key per path)."""
    for name in ["plain-name_1.txt", "a b", "%", ":", ":3A", "é", "日本", "k=v%2F", "a/b c"]:
        key = fs_api.key_name(name)
        assert re.fullmatch(r"[A-Za-z0-9._:=/-]*", key), key
        assert fs_api.name_of_key(key) == name
    for not_a_key in [":3a", ":41", ":", ":C3", "a:Z0"]:  # lowercase, escaped safe, cut
        with pytest.raises(ProtocolError):
            fs_api.name_of_key(not_a_key)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/fs/stat/a//b",
        "/v1/fs/stat/a/../b",
        "/v1/fs/stat/a/%2e%2e/b",
        "/v1/fs/stat/a%2Fb/..",
        "/v1/fs/stat/ctrl%01char",
        "/v1/fs/stat/bad%FFutf8",
        "/v1/fs/list/" + "x" * 600,
        "/v1/fs/list/" + "%C3%A9" * 100,  # 200 characters, 600 on the ring
        "/v1/fs/list/a?after=" + "x" * 600,
        "/v1/fs/files/a?offset=-1",
        "/v1/fs/files/a?length=99999999999999999999",
    ],
)
async def test_bad_paths_and_numbers_are_refused(ring: LocalCluster, path: str) -> None:
    """Must hold: malformed paths and numbers get 400 (or 404 for a route that does not
    match), never 5xx, and the peer keeps answering."""
    async with HttpProbe(ring.secret) as probe:
        address = ring.cluster.addresses[0]
        answer = await probe.signed(address, "GET", path)
        assert answer.status in (400, 404), (path, answer.status, answer.body[:200])
        assert (await probe.send(address, "GET", api.HEALTH.pattern)).status == 200


async def test_a_body_that_does_not_match_its_signature_stores_nothing(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: a PUT whose body differs from the one it signed (the digest covers the
    body; it is streamed to the peer, not buffered before the check). Must hold: 401,
    and no file appears."""
    path = f"{_root(rng)}/forged"
    address = ring.cluster.addresses[0]
    async with HttpProbe(ring.secret) as probe:
        path_qs = fs_api.fs_path(fs_api.FS_WRITE, path)
        signed_for = b"y" * (INLINE_BYTES_MAX + 10)
        headers = probe.signer.headers("PUT", path_qs, signed_for, target=address)
        sent = b"x" * len(signed_for)
        answer = await probe.send(address, "PUT", path_qs, body=sent, headers=headers)
        assert answer.status == 401, answer.body[:200]
    async with FsClient(address, ring.secret) as fs:
        assert not await fs.exists(path)
    with pytest.raises(AuthError):
        async with FsClient(address, "a-wrong-secret-of-enough-length") as fs:
            await fs.stat("/")


async def test_checkpoints_are_found_copied_to_a_local_directory_and_forgotten(
    ring: LocalCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Must hold: a directory with an offsets log is found as a checkpoint with its
    newest committed batch; a copy holds every file byte-identical but Spark's temporary
    ones; forgetting removes everything under it."""
    root = _root(rng)
    files = {
        "metadata": b'{"id":"q"}',
        "offsets/0": b"v1 0",
        "offsets/1": b"v1 1",
        "offsets/2": b"v1 2",
        "commits/0": b"c0",
        "commits/1": b"c1",
        "state/0/0/1.delta": rng.randbytes(5000),
        "state/0/1/2.delta": rng.randbytes(300_000),
        "state/0/1/.2.delta.5b3c.tmp": b"half",
    }
    async with FsClient(ring.cluster.addresses[4], ring.secret) as fs:
        for name, data in files.items():
            await fs.write(f"{root}/q1/{name}", data)
        await fs.write(f"{root}/other/readme", b"not a checkpoint")
        found = await find_checkpoints(fs, f"sr3://{root}")
        assert found == [FsCheckpoint(f"{root}/q1", 1, 2)]
        copied, _size = await copy_to_local(fs, f"sr3://{root}/q1", tmp_path / "q1")
        assert copied == len(files) - 1
        for name, data in files.items():
            local = tmp_path / "q1" / name
            assert (local.read_bytes() == data) if not name.endswith(".tmp") else not local.exists()
        assert await forget_checkpoint(fs, f"sr3://{root}/q1") >= len(files)
        assert await find_checkpoints(fs, root) == []


async def test_a_coordinator_killed_mid_write_leaves_the_file_whole(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    """Breaks: the peer coordinating a 40 MiB write is SIGKILLed while the body is on its
    way. Must hold: the client finishes through the next seed (the retry carries the
    same operation id, so it is not refused as "exists" if the first got through), and
    the file reads back byte-identical."""
    cluster = make_cluster(4)
    first, second = cluster.cluster.addresses[:2]
    path = f"{_root(rng)}/big.bin"
    data = rng.randbytes(40 * 1024 * 1024)
    async with FsClient([first, second], cluster.secret) as fs:
        task = asyncio.ensure_future(fs.write(path, data))
        await asyncio.sleep(0.15)
        assert not task.done(), "the write ended before the kill: make it bigger"
        await asyncio.to_thread(cluster.kill, cluster.cluster.peers[0].peer_id)
        await task
        assert await fs.read(path) == data


async def test_a_coordinator_killed_mid_read_cuts_the_answer_short_never_silently(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    """Breaks: the peer answering a 40 MiB read is SIGKILLed after the first MiB went
    out. Must hold: the reader gets an error for the rest (the answer's length is
    declared up front), never a short body taken as the file; a client with a second
    seed reads it whole."""
    cluster = make_cluster(4)
    first, second = cluster.cluster.addresses[:2]
    path = f"{_root(rng)}/big.bin"
    data = rng.randbytes(40 * 1024 * 1024)
    async with FsClient(second, cluster.secret) as fs:
        await fs.write(path, data)
    path_qs = fs_api.fs_path(fs_api.FS_READ, path)
    async with HttpProbe(cluster.secret) as probe:
        headers = probe.signer.headers("GET", path_qs, None, target=first)
        url = URL(f"http://{first}{path_qs}", encoded=True)
        async with probe.session.get(url, headers=headers) as answer:
            assert answer.status == 200
            assert answer.content_length == len(data)
            head = await answer.content.readexactly(1024 * 1024)
            await asyncio.to_thread(cluster.kill, cluster.cluster.peers[0].peer_id)
            with pytest.raises((aiohttp.ClientPayloadError, asyncio.IncompleteReadError)):
                await answer.content.readexactly(len(data) - len(head))
    assert head == data[: len(head)]
    async with FsClient([first, second], cluster.secret) as fs:
        assert await fs.read(path) == data


def _sr3(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    hidden = ("SR3_RING", "SR3_SECRET", "SR3_CLUSTER_FILE")
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    env["SR3_CLUSTER_FILE"] = str(cluster.cluster_file)
    return subprocess.run(
        [sys.executable, "-m", "sr3", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


async def test_sr3_spark_list_restore_and_forget_see_sr3_checkpoints(
    ring: LocalCluster, rng: random.Random, tmp_path: Path
) -> None:
    """Must hold: ``sr3 spark list`` shows an sr3:// checkpoint with its newest committed
    batch, ``restore --from`` copies it into a local directory, ``forget --checkpoint``
    deletes it; naming both kinds at once is a one-line error."""
    name = f"q{rng.randrange(10**9)}"
    root = f"/spark/cli-{name}"
    async with FsClient(ring.ring, ring.secret) as fs:
        for file in ("offsets/0", "offsets/1", "commits/0", "state/0/0/1.delta"):
            await fs.write(f"{root}/{file}", file.encode())
    listed = await asyncio.to_thread(_sr3, ring, "spark", "list", "--fs-root", root)
    assert listed.returncode == 0, listed.stderr
    assert f"sr3://{root}  latest committed 0" in listed.stdout, listed.stdout
    copied = await asyncio.to_thread(
        _sr3, ring, "spark", "restore", "--from", f"sr3://{root}", "--to", str(tmp_path / "c")
    )
    assert copied.returncode == 0, copied.stderr
    assert (tmp_path / "c" / "state/0/0/1.delta").read_bytes() == b"state/0/0/1.delta"
    both = await asyncio.to_thread(
        _sr3, ring, "spark", "restore", "--query", name, "--from", f"sr3://{root}", "--to", "x"
    )
    assert both.returncode == 1 and "exactly one" in both.stderr, both.stderr
    gone = await asyncio.to_thread(_sr3, ring, "spark", "forget", "--checkpoint", f"sr3://{root}")
    assert gone.returncode == 0, gone.stderr
    async with FsClient(ring.ring, ring.secret) as fs:
        assert not await fs.exists(root)


async def test_deleted_entries_neither_hide_a_directorys_files_nor_empty_it(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: most entries of a directory are deleted (as Spark prunes old versions),
    then it is listed in small pages and deleted without ``recursive``. Must hold: every
    live file is listed, page after page, past the deleted ones; the non-recursive
    delete is refused and leaves the directory whole; a recursive one empties it."""
    root = _root(rng)
    async with FsClient(ring.ring, ring.secret) as fs:
        for number in range(30):
            await fs.write(f"{root}/d/{number:02d}.delta", b"x")
        for number in range(25):
            assert await fs.delete(f"{root}/d/{number:02d}.delta") == 1
        listed = [s.name for s in await fs.list(f"{root}/d", page_entries=2)]
        assert listed == [f"{n}.delta" for n in range(25, 30)]
        with pytest.raises(FsRefused) as refused:
            await fs.delete(f"{root}/d")
        assert refused.value.code == "not_empty"
        assert len(await fs.list(f"{root}/d")) == 5
        assert await fs.delete(f"{root}/d", recursive=True) == 6
        assert not await fs.exists(f"{root}/d")
