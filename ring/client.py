"""The sr3 client: blobs and records on the ring, replicated, verified and bounded.

    async with Client(ring="127.0.0.1:7401", secret=secret) as client:
        ref = await client.put_file(path)           # chunks stored on W..R replicas each
        await client.get_file(ref, out_path)        # verified end to end, byte-identical
        await client.put_record("blob/x", value, expected_version=0)

The client learns the member table from any reachable seed (``GET /v1/ring``) and places
every chunk and record with ``ring.placement``. A write goes to the first R reachable
peers in the key's clockwise walk (a peer that cannot be reached is replaced by the next
one) and succeeds when W acknowledge. A read tries the same walk in order and falls back
when a peer is down, lacks the chunk, or serves bytes that fail verification.

Concurrency is bounded: at most ``transfers_max`` chunks in flight per call, at most
``CONNECTIONS_PER_PEER_MAX`` connections per peer, connect and read timeouts on each
request. ``SyncClient`` is the blocking facade for scripts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import xxhash

from ring import codec
from ring.auth import SECRET_CHARS_MIN
from ring.blobs import (
    CHUNK_BYTES_DEFAULT,
    PACK_BELOW_BYTES_DEFAULT,
    BlobRef,
    ChunkPlan,
    Extent,
    plan_chunks,
)
from ring.errors import (
    ChunkCorrupt,
    ConfigError,
    DataUnavailable,
    NotFound,
    PeerError,
    PeerRejected,
    PeerUnavailable,
    ProtocolError,
    QuorumError,
    RecordConflict,
    SR3Error,
)
from ring.placement import Member, Ring
from ring.transport import Timeouts, Transport

__all__ = [
    "BLOB_KEY_PREFIX",
    "Client",
    "ClientOptions",
    "PeerStatus",
    "RecordValue",
    "RingStatus",
    "Source",
]

T = TypeVar("T")
log = logging.getLogger(__name__)

Progress = Callable[[int], None]
BLOB_KEY_PREFIX = "blob/"
TRANSFERS_MAX_DEFAULT = 8
STATUS_TIMEOUT_S = 3.0
# Widening the member table after a miss (``Client.wider_ring``): at most once per
# interval, at most this many peers asked at once, each within STATUS_TIMEOUT_S.
WIDEN_INTERVAL_S = 1.0
WIDEN_CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """Client limits. ``replication``/``write_quorum`` default to what the ring says."""

    replication: int | None = None
    write_quorum: int | None = None
    chunk_bytes: int = CHUNK_BYTES_DEFAULT
    pack_below_bytes: int = PACK_BELOW_BYTES_DEFAULT
    transfers_max: int = TRANSFERS_MAX_DEFAULT
    timeouts: Timeouts = field(default_factory=Timeouts)
    # After a peer could not be reached, it is tried last for this long.
    down_retry_s: float = 5.0
    # How long a fetched member table is used before it is fetched again.
    ring_refresh_s: float = 5.0
    # How long a peer believed down gets to answer when it must be asked anyway.
    down_probe_s: float = 2.0


@dataclass(frozen=True, slots=True)
class Source:
    """``size`` bytes that ``read(offset, length)`` returns (called in a worker thread)."""

    size: int
    read: Callable[[int, int], bytes]


@dataclass(frozen=True, slots=True)
class RecordValue:
    key: str
    version: int
    value: bytes
    # True when replicas hold different values at the newest version (concurrent writers).
    conflict: bool = False
    # True when the newest version is a delete (a tombstone: no value).
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class PeerStatus:
    peer_id: str
    address: str
    zone: str
    # "up" or "down" as this client reaches it; "removed"/"left" for peers out of the ring
    state: str
    ownership: float
    stored_bytes: int | None
    chunk_count: int | None
    record_count: int | None
    error: str | None = None
    # up / down / removed / left, as the ring's member table has it
    ring_state: str = "up"
    epoch: int | None = None
    chunks_under_replicated: int | None = None
    chunks_lost: int | None = None
    hints_pending: int | None = None
    repair_rounds: int | None = None


@dataclass(frozen=True, slots=True)
class RingStatus:
    replication: int
    write_quorum: int
    peers: tuple[PeerStatus, ...]
    chunks_under_replicated: int = 0
    chunks_lost: int = 0


@dataclass(frozen=True, slots=True)
class _RingView:
    ring: Ring
    replication: int
    write_quorum: int
    # peer id -> "up" / "down", as the answering peer sees it
    states: Mapping[str, str]
    fetched_at: float


def parse_seeds(ring: str | Sequence[str]) -> tuple[str, ...]:
    seeds = ring.split(",") if isinstance(ring, str) else list(ring)
    cleaned = tuple(seed.strip() for seed in seeds if seed.strip())
    if not cleaned:
        raise ConfigError("no ring address given (host:port of any peer)")
    for seed in cleaned:
        host, _, port = seed.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"ring address {seed!r} is not host:port")
    return cleaned


def _union(views: Sequence[_RingView], fetched_at: float) -> _RingView:
    """One view naming every member any of ``views`` names; a member is up if any view
    has it up. Replication, quorum and vnodes are the first view's."""
    members: dict[str, Member] = {}
    states: dict[str, str] = {}
    for view in views:
        for member in view.ring.members:
            members.setdefault(member.peer_id, member)
            state = view.states.get(member.peer_id, "up")
            if states.get(member.peer_id) != "up":
                states[member.peer_id] = state
    first = views[0]
    ring = Ring.build(members.values(), vnodes=first.ring.vnodes, zone_aware=first.ring.zone_aware)
    return _RingView(ring, first.replication, first.write_quorum, states, fetched_at)


def _added(seen: _RingView, wider: _RingView, key: str) -> list[Member]:
    """``key``'s candidates in ``wider`` that ``seen`` does not name, in walk order."""
    named = {member.peer_id for member in seen.ring.members}
    candidates = wider.ring.candidates(key, wider.replication)
    return [member for member in candidates if member.peer_id not in named]


def _first_error(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first leaf of an exception group, so callers see one sr3 error."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


class Client:
    """Async client of one ring. Use it on one event loop; close it when done."""

    def __init__(
        self,
        ring: str | Sequence[str],
        secret: str,
        *,
        options: ClientOptions = ClientOptions(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seeds = parse_seeds(ring)
        if not secret:
            raise ConfigError("no cluster secret given")
        if len(secret) < SECRET_CHARS_MIN:
            raise ConfigError(f"the cluster secret must be at least {SECRET_CHARS_MIN} characters")
        self.options = options
        self._clock = clock
        self._transport = Transport(secret, timeouts=options.timeouts)
        self._view: _RingView | None = None
        self._down_until: dict[str, float] = {}
        self._widening = asyncio.Lock()
        self._widened_at = float("-inf")

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._transport.close()

    @property
    def transport(self) -> Transport:
        """The signed, pooled transport to peers (recovery streams use it directly)."""
        return self._transport

    # -- ring ---------------------------------------------------------------------------

    async def ring(self, *, refresh: bool = False) -> _RingView:
        """The member table, from the first seed or known peer that answers; cached for
        ``ring_refresh_s`` so that a long-lived client follows membership changes."""
        view = self._view
        if (
            view is not None
            and not refresh
            and self._clock() - view.fetched_at < self.options.ring_refresh_s
        ):
            return view
        known = [member.address for member in view.ring.members] if view is not None else []
        causes: list[str] = []
        for address in dict.fromkeys([*self.seeds, *known]):
            try:
                self._view = await self._ring_from(address)
                return self._view
            except PeerError as exc:
                causes.append(str(exc))
        raise PeerUnavailable(",".join(self.seeds), "no peer answered: " + "; ".join(causes))

    async def wider_ring(self, seen: _RingView) -> _RingView | None:
        """After data was on no member of ``seen``: the union of the member tables that
        the seeds and every member of ``seen`` serve, if it names members ``seen`` lacks.

        One peer's table can be partial (a peer that joined moments ago has not heard of
        every member yet), and a read that walks only those members misses data that sits
        on the others. The union becomes this client's view. Widening asks every peer, so
        it runs at most once per ``WIDEN_INTERVAL_S``; calls in between get its result."""
        async with self._widening:
            if self._clock() - self._widened_at >= WIDEN_INTERVAL_S:
                addresses = [*self.seeds, *(member.address for member in seen.ring.members)]
                views = await self._ring_answers(list(dict.fromkeys(addresses)))
                self._widened_at = self._clock()
                if views:
                    self._view = _union(views, self._clock())
            view = self._view
        if view is None:
            return None
        known = {member.peer_id for member in seen.ring.members}
        return view if any(m.peer_id not in known for m in view.ring.members) else None

    async def _ring_answers(self, addresses: Sequence[str]) -> list[_RingView]:
        slots = asyncio.Semaphore(WIDEN_CONCURRENCY)

        async def ask(address: str) -> _RingView | None:
            async with slots:
                try:
                    async with asyncio.timeout(STATUS_TIMEOUT_S):
                        return await self._ring_from(address)
                except (PeerError, ProtocolError, TimeoutError) as exc:
                    log.info("widening the member table: %s did not answer: %s", address, exc)
                    return None

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(ask(address)) for address in addresses]
        return [view for task in tasks if (view := task.result()) is not None]

    async def _ring_from(self, address: str) -> _RingView:
        """The member table that the peer at ``address`` serves."""
        answer = await self._transport.request(address, "GET", "/v1/ring", any_target=True)
        return self._parse_ring(answer.json())

    def _parse_ring(self, answer: Any) -> _RingView:
        try:
            entries = answer["members"]
            members = [
                Member(str(m["peer_id"]), str(m["address"]), str(m.get("zone", "")))
                for m in entries
            ]
            states = {str(m["peer_id"]): str(m.get("state", "up")) for m in entries}
            ring = Ring.build(
                members, vnodes=int(answer["vnodes"]), zone_aware=bool(answer["zone_aware"])
            )
            replication = self.options.replication or int(answer["replication"])
            write_quorum = self.options.write_quorum or int(answer["write_quorum"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed ring description: {exc!r}") from exc
        if not 1 <= write_quorum <= replication:
            raise ConfigError(f"write quorum {write_quorum} must be in 1..R={replication}")
        return _RingView(ring, replication, write_quorum, states, self._clock())

    def _mark_down(self, member: Member) -> None:
        self._down_until[member.peer_id] = self._clock() + self.options.down_retry_s

    def _is_down(self, member: Member) -> bool:
        if self._down_until.get(member.peer_id, 0.0) > self._clock():
            return True
        view = self._view
        return view is not None and view.states.get(member.peer_id) == "down"

    def _live_first(self, members: Sequence[Member]) -> list[Member]:
        return [m for m in members if not self._is_down(m)] + [
            m for m in members if self._is_down(m)
        ]

    async def _fan_out(
        self,
        candidates: Sequence[Member],
        count: int,
        op: Callable[[Member, Member | None], Awaitable[T]],
        *,
        strict: bool = False,
    ) -> tuple[list[tuple[Member, T]], list[str]]:
        """Run ``op`` on the first ``count`` candidates at once. A lane whose peer is
        known down, or fails (PeerError), moves on to the next unused candidate, live ones
        first, and passes ``op`` the peer it stands in for (writes leave a hint for it).
        Returns the answers and the failures."""
        preferred = list(candidates[:count])
        last_resort = [member for member in preferred if self._is_down(member)]
        spares = iter(self._live_first(candidates[count:]) + last_resort)
        if strict:
            # Only the preferred peers, each tried whatever the client believes of it.
            last_resort, spares = [], iter(())
        answers: list[tuple[Member, T]] = []
        causes: list[str] = []

        async def lane(original: Member) -> None:
            member: Member | None = original
            if self._is_down(original) and not strict:
                member = next(spares, None)
            while member is not None:
                # A peer believed down is still asked in strict mode, but only briefly:
                # it may have come back, or it may be frozen and never answer.
                limit_s = self.options.down_probe_s if self._is_down(member) else None
                try:
                    stand_in_for = None if member is original else original
                    async with asyncio.timeout(limit_s):
                        answers.append((member, await op(member, stand_in_for)))
                    return
                except TimeoutError:
                    causes.append(f"{member.address}: no answer within {limit_s} s")
                    self._mark_down(member)
                except PeerError as exc:
                    causes.append(str(exc))
                    if isinstance(exc, PeerUnavailable):
                        self._mark_down(member)
                member = next(spares, None)

        async with asyncio.TaskGroup() as group:
            for member in preferred:
                group.create_task(lane(member))
        return answers, causes

    # -- chunks -------------------------------------------------------------------------

    async def _put_chunk_to(
        self, member: Member, chunk_id: str, stored: bytes, hint: Member | None
    ) -> None:
        path = f"/v1/chunks/{chunk_id}"
        if hint is not None:
            path += f"?hint={_quote(hint.peer_id)}"
        await self._transport.request(member.address, "PUT", path, body=stored)

    async def _store_raw_chunk(self, raw: bytes) -> str:
        chunk_id, stored = await asyncio.to_thread(codec.encode, raw)
        view = await self.ring()
        answers, causes = await self._fan_out(
            view.ring.candidates(chunk_id, view.replication),
            view.replication,
            lambda member, hint: self._put_chunk_to(member, chunk_id, stored, hint),
        )
        if len(answers) < view.write_quorum:
            raise QuorumError(f"chunk {chunk_id}", len(answers), view.write_quorum, causes)
        return chunk_id

    async def _get_chunk_from(self, member: Member, chunk_id: str) -> bytes:
        answer = await self._transport.request(
            member.address,
            "GET",
            f"/v1/chunks/{chunk_id}",
            body_bytes_max=codec.STORED_BYTES_MAX,
        )
        try:
            return await asyncio.to_thread(codec.decode, answer.body, chunk_id)
        except ChunkCorrupt as exc:
            # Corrupt in transit or undetected at rest: try the next replica.
            raise PeerRejected(member.address, 200, "chunk_corrupt", str(exc)) from exc

    async def fetch_chunk(self, chunk_id: str) -> bytes:
        """A chunk's raw bytes, verified; from the first replica in the walk that has it.

        When no member of the view has it, the members a wider view adds are tried too
        (``wider_ring``): the view may have come from a peer that knows part of the ring."""
        view = await self.ring()

        def fetch(member: Member, _hint: Member | None) -> Awaitable[bytes]:
            return self._get_chunk_from(member, chunk_id)

        answers, causes = await self._fan_out(
            view.ring.candidates(chunk_id, view.replication), 1, fetch
        )
        if not answers:
            wider = await self.wider_ring(view)
            if wider is not None:
                answers, more = await self._fan_out(_added(view, wider, chunk_id), 1, fetch)
                causes += more
        if not answers:
            raise DataUnavailable([chunk_id], causes)
        return answers[0][1]

    # -- blobs --------------------------------------------------------------------------

    async def put_sources(
        self, sources: Sequence[Source], *, progress: Progress | None = None
    ) -> list[BlobRef]:
        """Store many sources, packing small ones; one ``BlobRef`` per source, in order."""
        plans = plan_chunks(
            [source.size for source in sources],
            chunk_bytes=self.options.chunk_bytes,
            pack_below_bytes=self.options.pack_below_bytes,
        )
        hashers = [xxhash.xxh3_128() for _ in sources]
        chunk_ids: list[str] = [""] * len(plans)
        slots = asyncio.Semaphore(self.options.transfers_max)

        async def store(index: int, raw: bytes) -> None:
            try:
                chunk_ids[index] = await self._store_raw_chunk(raw)
                if progress is not None:
                    progress(len(raw))
            finally:
                slots.release()

        try:
            async with asyncio.TaskGroup() as group:
                for index, plan in enumerate(plans):
                    await slots.acquire()
                    raw = await asyncio.to_thread(_build_chunk, plan, sources, hashers)
                    group.create_task(store(index, raw))
        except BaseExceptionGroup as group_error:
            raise _first_error(group_error) from None
        return _blob_refs(sources, plans, chunk_ids, hashers)

    async def put_blob(self, data: bytes) -> BlobRef:
        source = Source(len(data), lambda offset, length: data[offset : offset + length])
        return (await self.put_sources([source]))[0]

    async def put_file(self, path: Path, *, progress: Progress | None = None) -> BlobRef:
        return (await self.put_sources([file_source(path)], progress=progress))[0]

    async def _fetch_extent(self, extent: Extent) -> bytes | DataUnavailable:
        try:
            raw = await self.fetch_chunk(extent.chunk_id)
        except DataUnavailable as exc:
            return exc
        if extent.offset + extent.length > len(raw):
            raise ChunkCorrupt(f"chunk {extent.chunk_id} is shorter than the extent naming it")
        return raw[extent.offset : extent.offset + extent.length]

    async def read_blob(
        self, ref: BlobRef, sink: Callable[[bytes], object], *, progress: Progress | None = None
    ) -> None:
        """Feed a blob's bytes to ``sink`` in order, fetching a bounded window ahead.

        Raises ``DataUnavailable`` naming every chunk no replica could serve (the sink has
        then received a prefix only), and ``ChunkCorrupt`` if the reassembled blob does not
        match its digest.
        """
        hasher = xxhash.xxh3_128()
        pending: deque[asyncio.Task[bytes | DataUnavailable]] = deque()
        missing: list[DataUnavailable] = []

        def deliver(piece: bytes | DataUnavailable) -> None:
            if isinstance(piece, DataUnavailable):
                missing.append(piece)
            elif not missing:
                hasher.update(piece)
                sink(piece)
                if progress is not None:
                    progress(len(piece))

        try:
            async with asyncio.TaskGroup() as group:
                for extent in ref.extents:
                    if len(pending) >= self.options.transfers_max:
                        deliver(await pending.popleft())
                    pending.append(group.create_task(self._fetch_extent(extent)))
                while pending:
                    deliver(await pending.popleft())
        except BaseExceptionGroup as group_error:
            raise _first_error(group_error) from None
        if missing:
            names = list(dict.fromkeys(chunk for error in missing for chunk in error.missing))
            raise DataUnavailable(names, [str(error) for error in missing[:1]])
        if hasher.hexdigest() != ref.digest:
            raise ChunkCorrupt(f"reassembled blob does not match its digest {ref.digest}")

    async def get_blob(self, ref: BlobRef) -> bytes:
        pieces: list[bytes] = []
        await self.read_blob(ref, pieces.append)
        return b"".join(pieces)

    async def get_file(self, ref: BlobRef, path: Path, *, progress: Progress | None = None) -> None:
        """Write a blob to ``path`` atomically: a temp file, fsync, then rename."""
        tmp = path.with_name(f".{path.name}.sr3-partial")
        try:
            handle = await asyncio.to_thread(open, tmp, "wb")
            with handle:
                await self.read_blob(ref, handle.write, progress=progress)
                handle.flush()
                await asyncio.to_thread(os.fsync, handle.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    # -- records ------------------------------------------------------------------------

    async def _get_record_from(
        self, member: Member, key: str, _hint: Member | None = None
    ) -> RecordValue | None:
        try:
            answer = await self._transport.request(
                member.address, "GET", f"/v1/records/{key}", body_bytes_max=8 * 1024 * 1024
            )
        except PeerRejected as exc:
            if exc.status == 404 and exc.code == "deleted":
                return RecordValue(key, exc.version, b"", deleted=True)
            if exc.status == 404:
                return None
            raise
        return RecordValue(key, int(answer.headers.get("X-SR3-Version", "0")), answer.body)

    async def get_record(self, key: str, *, include_deleted: bool = False) -> RecordValue | None:
        """The newest version held by the first R reachable replicas, or None.

        A deleted record reads as None, unless ``include_deleted``: then its tombstone
        (``deleted=True``) comes back, whose version a compare-and-set write expects."""
        view = await self.ring()

        def read(member: Member, hint: Member | None) -> Awaitable[RecordValue | None]:
            return self._get_record_from(member, key, hint)

        answers, causes = await self._fan_out(
            view.ring.candidates(key, view.replication), view.replication, read
        )
        if len(answers) < view.replication and all(value is None for _m, value in answers):
            # Fewer than R peers of the view could answer and none had it: the view may
            # be a part of the ring (``wider_ring``); ask the members a wider one adds.
            wider = await self.wider_ring(view)
            if wider is not None:
                others = _added(view, wider, key)
                more, more_causes = await self._fan_out(
                    others, min(wider.replication - len(answers), len(others)), read
                )
                answers += more
                causes += more_causes
        if not answers:
            raise DataUnavailable([key], causes)
        newest = _newest([value for _member, value in answers if value is not None])
        if newest is not None and newest.deleted and not include_deleted:
            return None
        return newest

    async def _put_record_to(
        self, member: Member, key: str, body: bytes, expected_version: int, refs: int
    ) -> int:
        try:
            answer = await self._transport.request(
                member.address,
                "PUT",
                f"/v1/records/{key}?expected_version={expected_version}&refs={refs}",
                body=body,
            )
        except PeerRejected as exc:
            if exc.status == 409:
                return -1
            raise
        return int(answer.json()["version"])

    async def put_record(
        self, key: str, value: bytes, *, expected_version: int, refs: Sequence[str] = ()
    ) -> int:
        """Compare-and-set: store ``value`` as ``expected_version + 1`` on W..R replicas.

        Only the key's R preferred peers count (no stand-ins): a stand-in that never held
        the record would accept a stale version. So a write needs W of them reachable;
        after a failure the ring moves records to live peers within the removal grace.
        ``refs`` are the chunk ids the value points at: peers audit that they stay
        available (``chunks_lost``) without parsing values. Raises ``RecordConflict``
        when replicas hold a newer version than expected.
        """
        if not all(codec.is_chunk_id(ref) for ref in refs):
            raise ProtocolError("refs must be chunk ids")
        body = b"".join(bytes.fromhex(ref) for ref in refs) + value
        return await self._compare_and_set(
            key,
            expected_version,
            lambda member: self._put_record_to(member, key, body, expected_version, len(refs)),
        )

    async def _compare_and_set(
        self, key: str, expected_version: int, write: Callable[[Member], Awaitable[int]]
    ) -> int:
        """Run ``write`` (its answer: the stored version, -1 for a conflict) on the key's
        preferred peers; ``expected_version + 1`` once W acknowledged."""
        view = await self.ring()
        answers, causes = await self._fan_out(
            view.ring.candidates(key, view.replication),
            view.replication,
            lambda member, _hint: write(member),
            strict=True,
        )
        acks = sum(1 for _member, version in answers if version >= 0)
        if acks >= view.write_quorum:
            return expected_version + 1
        if any(version < 0 for _member, version in answers):
            current = await self.get_record(key, include_deleted=True)
            raise RecordConflict(key, expected_version, current.version if current else 0)
        raise QuorumError(f"record {key!r}", acks, view.write_quorum, causes)

    async def _delete_record_at(self, member: Member, key: str, expected_version: int) -> int:
        try:
            answer = await self._transport.request(
                member.address, "DELETE", f"/v1/records/{key}?expected_version={expected_version}"
            )
        except PeerRejected as exc:
            if exc.status == 409:
                return -1
            raise
        return int(answer.json()["version"])

    async def delete_record(self, key: str, *, expected_version: int) -> int:
        """Compare-and-set delete: a tombstone as ``expected_version + 1`` on W..R of the
        key's preferred peers (as ``put_record``); the tombstone's version."""
        return await self._compare_and_set(
            key,
            expected_version,
            lambda member: self._delete_record_at(member, key, expected_version),
        )

    async def list_records(self, prefix: str = "", *, limit: int = 10_000) -> dict[str, int]:
        """Keys under ``prefix`` with the newest version any reachable peer knows (keys
        whose newest version is a delete left out)."""
        view = await self.ring()
        path = f"/v1/records?prefix={_quote(prefix)}&limit={limit}&deleted=1"

        async def one(member: Member, _hint: Member | None) -> Any:
            return (await self._transport.request(member.address, "GET", path)).json()

        answers, _causes = await self._fan_out(view.ring.members, len(view.ring), one)
        newest: dict[str, tuple[int, bool]] = {}
        for _member, answer in answers:
            for entry in answer["records"]:
                key = str(entry["key"])
                seen = (int(entry["version"]), bool(entry.get("deleted", False)))
                newest[key] = max(newest.get(key, seen), seen)
        live = {key: version for key, (version, deleted) in newest.items() if not deleted}
        return dict(sorted(live.items())[:limit])

    # -- named files (sr3 put / sr3 get) ------------------------------------------------

    async def store_file(
        self, path: Path, key: str, *, progress: Progress | None = None
    ) -> BlobRef:
        """Store a file and point record ``blob/<key>`` at it (replacing what was there)."""
        ref = await self.put_file(path, progress=progress)
        record_key = BLOB_KEY_PREFIX + key
        current = await self.get_record(record_key, include_deleted=True)
        value = codec.compact_json(ref.to_json())
        await self.put_record(
            record_key,
            value,
            expected_version=current.version if current else 0,
            refs=sorted({extent.chunk_id for extent in ref.extents}),
        )
        return ref

    async def lookup_file(self, key: str) -> BlobRef:
        record = await self.get_record(BLOB_KEY_PREFIX + key)
        if record is None:
            raise NotFound(f"no file is stored under key {key!r}")
        try:
            return BlobRef.from_json(json.loads(record.value))
        except json.JSONDecodeError as exc:
            raise ProtocolError(f"record for {key!r} is not a blob reference") from exc

    # -- membership and status ----------------------------------------------------------

    async def members(self) -> list[dict[str, Any]]:
        """The whole member table, with each peer's liveness, from the first peer that
        answers (it includes peers that left or were removed)."""
        view = await self.ring(refresh=True)
        causes: list[str] = []
        for member in self._live_first(view.ring.members):
            try:
                answer = await self._transport.request(member.address, "GET", "/v1/members")
                members: list[dict[str, Any]] = answer.json()["members"]
                return members
            except (PeerError, KeyError, TypeError) as exc:
                causes.append(str(exc))
        raise PeerUnavailable("ring", "no peer gave its member table: " + "; ".join(causes))

    async def leave(self, peer_id: str, *, wait: bool = True, timeout_s: float = 600.0) -> None:
        """Ask ``peer_id`` to hand its data over and leave the ring; wait until it has."""
        view = await self.ring(refresh=True)
        try:
            member = view.ring.member(peer_id)
        except KeyError as exc:
            raise NotFound(f"no peer {peer_id!r} in the ring") from exc
        await self._transport.request(member.address, "POST", "/v1/admin/leave", ok=(202,))
        if not wait:
            return
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    await asyncio.sleep(0.5)
                    states = {m["peer_id"]: m.get("state") for m in await self.members()}
                    if states.get(peer_id) == "left":
                        return
        except TimeoutError as exc:
            raise SR3Error(f"{peer_id} has not left the ring after {timeout_s:.0f} s") from exc

    async def admin_kill(self, peer_id: str) -> None:
        """Make ``peer_id`` exit at once, as if SIGKILLed (drills on a running ring). The
        peer must have been started with ``--enable-admin-kill``; otherwise it answers 403."""
        view = await self.ring()
        try:
            member = view.ring.member(peer_id)
        except KeyError as exc:
            raise NotFound(f"no peer {peer_id!r} in the ring") from exc
        await self._transport.request(member.address, "POST", "/v1/admin/kill", ok=(202,))
        self._mark_down(member)

    async def _probe(self, entry: Mapping[str, Any], ownership: float) -> PeerStatus:
        peer_id, address = str(entry["peer_id"]), str(entry["address"])
        ring_state = str(entry.get("state", "up"))
        try:
            async with asyncio.timeout(STATUS_TIMEOUT_S):
                info = (await self._transport.request(address, "GET", "/v1/info")).json()
        except (PeerError, TimeoutError) as exc:
            state = ring_state if ring_state in ("removed", "left") else "down"
            return PeerStatus(
                peer_id, address, str(entry.get("zone", "")), state, ownership,
                None, None, None, str(exc) or "timeout", ring_state=ring_state,
            )  # fmt: skip
        last = (info.get("repair") or {}).get("last") or {}
        return PeerStatus(
            peer_id, address, str(entry.get("zone", "")), "up", ownership,
            int(info["stored_bytes"]), int(info["chunk_count"]), int(info["record_count"]),
            ring_state=ring_state, epoch=info.get("epoch"),
            chunks_under_replicated=last.get("chunks_under_replicated"),
            chunks_lost=last.get("chunks_lost"), hints_pending=info.get("hints_pending"),
            repair_rounds=(info.get("repair") or {}).get("rounds"),
        )  # fmt: skip

    async def status(self) -> RingStatus:
        """Every member's state and figures, like ``nodetool status``, with the ring's
        under-replicated and lost chunk counts (from each peer's last repair round)."""
        view = await self.ring(refresh=True)
        ownership = view.ring.ownership(view.replication)
        entries = await self.members()
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(self._probe(entry, ownership.get(str(entry["peer_id"]), 0.0)))
                for entry in entries
            ]
        peers = tuple(task.result() for task in tasks)
        return RingStatus(
            view.replication,
            view.write_quorum,
            peers,
            chunks_under_replicated=sum(p.chunks_under_replicated or 0 for p in peers),
            chunks_lost=sum(p.chunks_lost or 0 for p in peers),
        )


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def file_source(path: Path) -> Source:
    size = path.stat().st_size

    def read(offset: int, length: int) -> bytes:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(length)
        if len(data) != length:
            raise SR3Error(f"{path} changed while it was being stored")
        return data

    return Source(size, read)


def _build_chunk(plan: ChunkPlan, sources: Sequence[Source], hashers: list[Any]) -> bytes:
    """Read a chunk's pieces and feed each source's digest, in source order."""
    parts = []
    for piece in plan.pieces:
        data = sources[piece.source].read(piece.offset, piece.length)
        hashers[piece.source].update(data)
        parts.append(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _blob_refs(
    sources: Sequence[Source],
    plans: Sequence[ChunkPlan],
    chunk_ids: Sequence[str],
    hashers: Sequence[Any],
) -> list[BlobRef]:
    extents: list[list[Extent]] = [[] for _ in sources]
    for plan, chunk_id in zip(plans, chunk_ids, strict=True):
        position = 0
        for piece in plan.pieces:
            extents[piece.source].append(Extent(chunk_id, position, piece.length))
            position += piece.length
    return [
        BlobRef(source.size, hasher.hexdigest(), tuple(found))
        for source, hasher, found in zip(sources, hashers, extents, strict=True)
    ]


def _newest(values: Sequence[RecordValue]) -> RecordValue | None:
    """The newest version; among equal versions, the value most replicas hold."""
    if not values:
        return None
    newest = max(value.version for value in values)
    candidates = [value for value in values if value.version == newest]
    counts: dict[bytes, int] = {}
    for value in candidates:
        counts[value.value] = counts.get(value.value, 0) + 1
    best = max(counts, key=lambda value: (counts[value], xxhash.xxh3_64_hexdigest(value)))
    deleted = any(value.deleted and value.value == best for value in candidates)
    return RecordValue(candidates[0].key, newest, best, conflict=len(counts) > 1, deleted=deleted)
