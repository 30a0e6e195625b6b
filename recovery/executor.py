"""The requester side of recovery: locate chunks, run a plan, verify, deliver.

    result = await recover_blob(client, ref, Path("state.bin"), "tree", fan_in=4)

``locate`` asks every reachable peer which of the chunks it holds (batched
``POST /v1/chunks/exists`` with sizes) and orders each chunk's holders by the ring's
preference. ``recover`` builds a plan (``recovery.plan``) and opens one stream per plan
root (``POST /v1/recovery/stream`` on the root, see ``recovery.relay``): star opens one
per holder, at most ``connections_max`` at once; line and tree open one. Every chunk is
verified end to end (decompressed, content address checked) and handed to the sink once.

Failures are routed around, never restarted: a chunk that arrives corrupt or as a missing
frame, or that a broken root stream did not deliver, is fetched directly along its
replicas (``Client.fetch_chunk``) and reported in ``RecoveryResult.rerouted``, as are the
chunks relays fetched around a failed upstream (rerouted frames). A chunk that nobody can
serve ends the recovery with ``DataUnavailable`` naming every such chunk: never partial
data presented as whole.

``ingress_bytes_s`` emulates a narrow requester link: a token bucket on received bytes.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import xxhash

from recovery import frames
from recovery.auto import choose_for, measured, timed_decode, verify_rate
from recovery.cost import Network
from recovery.frames import Frame, FrameParser
from recovery.plan import ChunkSpec, Plan, PlanNode, Topology, build_plan, parse_topology
from ring import api, codec
from ring.blobs import BlobRef
from ring.client import Client
from ring.errors import AuthError, ChunkCorrupt, DataUnavailable, PeerError, ProtocolError
from ring.files import fsync_dir
from ring.placement import Member
from ring.ratelimit import TokenBucket

__all__ = ["RecoveryResult", "Sink", "locate", "recover", "recover_blob"]

log = logging.getLogger(__name__)

# Raw chunk bytes: a view into the received frame when the chunk was stored uncompressed.
Sink = Callable[[str, bytes | memoryview], Awaitable[None]]
FAN_IN_DEFAULT = 4
CONNECTIONS_MAX_DEFAULT = 8
INGRESS_BURST_BYTES = 64 * 1024
READ_BYTES = 4 * 1024 * 1024
# Failures of a root stream after which its undelivered chunks are fetched directly.
_STREAM_FAILURES = (PeerError, ProtocolError, AuthError)


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    topology: str
    chunks: int
    raw_bytes: int
    stored_bytes: int
    seconds: float
    # Most streams any receiver took at once (the requester included).
    max_fan_in: int
    # Chunk ids that came around a holder that could not serve them.
    rerouted: tuple[str, ...]
    # Holders seen failing during this recovery (by the requester or by relays).
    failed_peers: tuple[str, ...]
    # Chunk frames that arrived for a chunk already delivered (dropped).
    duplicate_frames: int = 0
    # Why this topology, when the caller asked for "auto".
    reason: str = ""


# -- locating -------------------------------------------------------------------------------


async def locate(client: Client, chunk_ids: Sequence[str]) -> list[ChunkSpec]:
    """Each chunk's live holders (in the ring's preference order) and stored size.

    Every peer the member table does not show down is asked, in batches; a peer that
    cannot be reached (or answers nonsense) is skipped. When some chunk has no holder,
    the members a wider table adds (``Client.wider_ring``) are asked too; a chunk nobody
    holds then gets no holders."""
    ids = list(dict.fromkeys(chunk_ids))
    view = await client.ring()
    held = await _held_by_members(client, view.ring.members, view.states, ids)
    if any(all(chunk_id not in chunks for chunks in held.values()) for chunk_id in ids):
        wider = await client.wider_ring(view)
        if wider is not None:
            added = [m for m in wider.ring.members if m.peer_id not in held]
            held |= await _held_by_members(client, added, wider.states, ids)
            view = wider
    specs: list[ChunkSpec] = []
    for chunk_id in ids:
        order = view.ring.candidates(chunk_id, view.replication)
        holders = tuple(m.peer_id for m in order if chunk_id in held.get(m.peer_id, {}))
        sizes = [held[holder][chunk_id] for holder in holders]
        specs.append(ChunkSpec(chunk_id, max(sizes, default=0), holders))
    return specs


async def _held_by_members(
    client: Client, members: Sequence[Member], states: Mapping[str, str], ids: Sequence[str]
) -> dict[str, dict[str, int]]:
    """Per member not shown down, what it holds of ``ids``; unreachable peers hold nothing
    (members shown down are left out)."""
    asked = [member for member in members if states.get(member.peer_id) != "down"]
    async with asyncio.TaskGroup() as group:
        tasks = {m.peer_id: group.create_task(_held_by(client, m, ids)) for m in asked}
    return {peer_id: task.result() for peer_id, task in tasks.items()}


async def _held_by(client: Client, member: Member, ids: Sequence[str]) -> dict[str, int]:
    """Chunk id -> stored bytes of the chunks ``member`` holds; empty if unreachable."""
    held: dict[str, int] = {}
    route = api.CHUNKS_EXIST
    for start in range(0, len(ids), api.EXISTS_IDS_MAX):
        body = api.exists_request(ids[start : start + api.EXISTS_IDS_MAX], sizes=True)
        try:
            answer = await client.transport.request(
                member.address, route.method, route.pattern, body=body
            )
            held.update(api.parse_exists_answer(answer.json()))
        except (PeerError, ProtocolError, AuthError) as exc:
            log.info("locate: skipping %s: %s", member.peer_id, exc)
            return {}
    return held


# -- recovering -----------------------------------------------------------------------------


async def recover(
    client: Client,
    chunk_ids: Sequence[str],
    topology: Topology | Literal["auto"],
    sink: Sink,
    *,
    fan_in: int = FAN_IN_DEFAULT,
    connections_max: int = CONNECTIONS_MAX_DEFAULT,
    ingress_bytes_s: float | None = None,
    network: Network | None = None,
) -> RecoveryResult:
    """Fetch every chunk along ``topology``; ``sink(chunk_id, raw)`` once per chunk, in
    any order. Raises ``DataUnavailable`` naming every chunk no one could serve.

    ``"auto"`` lets the cost model choose from the holders found and ``network`` (None:
    measured from the client's recent transfers)."""
    if connections_max < 1:
        raise ValueError("connections_max must be at least 1")
    started = time.monotonic()
    specs = await locate(client, chunk_ids)
    run = _Run(client, specs, sink, ingress_bytes_s)
    # Chunks without a live holder: tried directly first, so that a lost state fails
    # before anything big moves.
    await run.fetch_directly([spec.chunk_id for spec in specs if not spec.holders])
    run.raise_if_unavailable()
    held = [spec for spec in specs if spec.holders]
    reason = ""
    if topology == "auto":
        base = network or Network(connections_max=connections_max, tree_fan_in=fan_in)
        choice = choose_for(client, held, network or measured(client, base))
        topology, reason = parse_topology(choice.topology), choice.reason
    plan = build_plan(topology, held, fan_in=fan_in)
    slots = asyncio.Semaphore(connections_max)
    try:
        async with asyncio.TaskGroup() as group:
            for root in plan.roots:
                group.create_task(run.root(root, slots))
    except BaseExceptionGroup as group_error:
        raise _first_error(group_error) from None
    run.raise_if_unavailable()
    result = run.result(topology, _fan_in(plan, connections_max), time.monotonic() - started)
    return replace(result, reason=reason)


def _fan_in(plan: Plan, connections_max: int) -> int:
    requester = min(len(plan.roots), connections_max)
    return max([requester, *(root.max_fan_in() for root in plan.roots)])


def _first_error(group: BaseExceptionGroup[Any]) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


class _Run:
    """The state of one recovery: what was delivered, rerouted, seen failing."""

    def __init__(
        self,
        client: Client,
        specs: Sequence[ChunkSpec],
        sink: Sink,
        ingress_bytes_s: float | None,
    ) -> None:
        self.client = client
        self.sink = sink
        self.stored_sizes = {spec.chunk_id: spec.stored_bytes for spec in specs}
        self.ingress = (
            TokenBucket(ingress_bytes_s, INGRESS_BURST_BYTES, time.monotonic)
            if ingress_bytes_s
            else None
        )
        self.direct_slots = asyncio.Semaphore(client.options.transfers_max)
        self.rate = verify_rate(client)
        self.delivered: set[str] = set()
        self.rerouted: dict[str, None] = {}
        self.failed: dict[str, None] = {}
        self.unavailable: list[str] = []
        self.raw_bytes = 0
        self.stored_bytes = 0
        self.duplicate_frames = 0

    def result(self, topology: str, max_fan_in: int, seconds: float) -> RecoveryResult:
        return RecoveryResult(
            topology, len(self.stored_sizes), self.raw_bytes, self.stored_bytes, seconds,
            max_fan_in, tuple(self.rerouted), tuple(self.failed), self.duplicate_frames,
        )  # fmt: skip

    def raise_if_unavailable(self) -> None:
        if self.unavailable:
            order = {chunk_id: index for index, chunk_id in enumerate(self.stored_sizes)}
            missing = sorted(set(self.unavailable), key=lambda c: order.get(c, len(order)))
            raise DataUnavailable(missing, [f"failed peers: {', '.join(self.failed) or 'none'}"])

    async def _take(self, amount: int) -> None:
        if self.ingress is not None:
            await self.ingress.acquire(amount)

    async def _deliver(self, chunk_id: str, raw: bytes | memoryview, stored_bytes: int) -> None:
        if chunk_id in self.delivered:
            self.duplicate_frames += 1
            return
        self.delivered.add(chunk_id)
        self.raw_bytes += len(raw)
        self.stored_bytes += stored_bytes
        await self.sink(chunk_id, raw)

    # -- one root stream ----------------------------------------------------------------

    async def root(self, root: PlanNode, slots: asyncio.Semaphore) -> None:
        """Receive one root's stream; then fetch directly whatever it did not deliver."""
        async with slots:
            try:
                await self._receive(root)
            except _STREAM_FAILURES as exc:
                log.warning("recovery: stream from %s failed: %s", root.peer_id, exc)
                self.failed[root.peer_id] = None
        await self.fetch_directly([c for c in root.chunk_ids() if c not in self.delivered])

    async def _receive(self, root: PlanNode) -> None:
        view = await self.client.ring()
        try:
            address = view.ring.member(root.peer_id).address
        except KeyError as exc:
            raise ProtocolError(f"{root.peer_id} is no longer in the ring") from exc
        body = codec.compact_json(root.to_json())
        expected = frozenset(root.chunk_ids())
        parser = FrameParser()
        async with self.client.transport.stream(
            address, api.RECOVERY_STREAM.method, api.RECOVERY_STREAM.pattern, body=body
        ) as pieces:
            async for piece in pieces:
                await self._take(len(piece))
                for frame in parser.feed(piece):
                    await self._accept(frame, expected)
        if not parser.ended:
            raise ProtocolError(f"{root.peer_id}: recovery stream ended without its end")

    async def _accept(self, frame: Frame, expected: frozenset[str]) -> None:
        if frame.kind == frames.KIND_END:
            return
        if frame.chunk_id not in expected:
            raise ProtocolError(f"recovery stream sent chunk {frame.chunk_id}, not in its plan")
        if frame.kind == frames.KIND_REROUTED:
            self.rerouted[frame.chunk_id] = None
            if frame.note:
                self.failed[frame.note] = None
        elif frame.kind == frames.KIND_MISSING:
            log.info("recovery: %s missing upstream: %s", frame.chunk_id, frame.note)
        elif frame.chunk_id in self.delivered:
            self.duplicate_frames += 1
        else:
            try:
                raw = await asyncio.to_thread(
                    timed_decode, self.rate, frame.payload, frame.chunk_id
                )
            except ChunkCorrupt as exc:
                log.warning("recovery: chunk failed end-to-end verification: %s", exc)
                return
            await self._deliver(frame.chunk_id, raw, len(frame.payload))

    # -- around failures ----------------------------------------------------------------

    async def fetch_directly(self, chunk_ids: Sequence[str]) -> None:
        """Fetch chunks along their replicas (``Client.fetch_chunk``), a bounded number
        at once; those nobody can serve are remembered as unavailable."""

        async def one(chunk_id: str) -> None:
            async with self.direct_slots:
                try:
                    raw = await self.client.fetch_chunk(chunk_id)
                except DataUnavailable:
                    self.unavailable.append(chunk_id)
                    return
                stored_bytes = self.stored_sizes.get(chunk_id) or len(raw)
                await self._take(stored_bytes)
                self.rerouted[chunk_id] = None
                await self._deliver(chunk_id, raw, stored_bytes)

        try:
            async with asyncio.TaskGroup() as group:
                for chunk_id in chunk_ids:
                    group.create_task(one(chunk_id))
        except BaseExceptionGroup as group_error:
            raise _first_error(group_error) from None


# -- into a file ----------------------------------------------------------------------------


async def recover_blob(
    client: Client,
    ref: BlobRef,
    path: Path,
    topology: Topology | Literal["auto"],
    *,
    fan_in: int = FAN_IN_DEFAULT,
    connections_max: int = CONNECTIONS_MAX_DEFAULT,
    ingress_bytes_s: float | None = None,
) -> RecoveryResult:
    """Recover a blob into ``path``, byte-identical, atomically.

    Chunks arrive in any order: each is written at its extents' offsets into a
    preallocated temporary file next to ``path``; then the whole file is checked against
    the blob's digest, fsynced and renamed into place. On any error ``path`` is left as
    it was and the temporary file removed."""
    placements = _placements(ref)
    tmp = path.with_name(f".{path.name}.sr3-recovering")
    fd = await asyncio.to_thread(_open_preallocated, tmp, ref.size)
    try:

        async def sink(chunk_id: str, raw: bytes | memoryview) -> None:
            await asyncio.to_thread(_write_extents, fd, raw, placements[chunk_id])

        result = await recover(
            client, list(placements), topology, sink,
            fan_in=fan_in, connections_max=connections_max, ingress_bytes_s=ingress_bytes_s,
        )  # fmt: skip
        digest = await asyncio.to_thread(_digest, fd, ref.size)
        if digest != ref.digest:
            raise ChunkCorrupt(f"recovered blob does not match its digest {ref.digest}")
        await asyncio.to_thread(os.fsync, fd)
        os.replace(tmp, path)
        await asyncio.to_thread(fsync_dir, path.parent)
    finally:
        os.close(fd)
        tmp.unlink(missing_ok=True)
    return result


# (blob offset, offset in the chunk, length) of each extent, per chunk id in blob order.
_Placement = tuple[int, int, int]


def _placements(ref: BlobRef) -> dict[str, list[_Placement]]:
    placements: dict[str, list[_Placement]] = {}
    position = 0
    for extent in ref.extents:
        placements.setdefault(extent.chunk_id, []).append((position, extent.offset, extent.length))
        position += extent.length
    return placements


def _open_preallocated(path: Path, size: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, size)
        if size > 0:
            try:
                os.posix_fallocate(fd, 0, size)  # reserve the space: ENOSPC now, not later
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    return fd


def _write_extents(fd: int, raw: bytes | memoryview, placements: Sequence[_Placement]) -> None:
    view = memoryview(raw)
    for blob_offset, chunk_offset, length in placements:
        if chunk_offset + length > len(raw):
            raise ChunkCorrupt("a chunk is shorter than the extent naming it")
        done = 0
        while done < length:
            start = chunk_offset + done
            done += os.pwrite(fd, view[start : chunk_offset + length], blob_offset + done)


def _digest(fd: int, size: int) -> str:
    hasher = xxhash.xxh3_128()
    for offset in range(0, size, READ_BYTES):
        data = os.pread(fd, min(READ_BYTES, size - offset), offset)
        if not data:
            break
        hasher.update(data)
    return hasher.hexdigest()
