"""The peer side of line and tree recovery: ``POST /v1/recovery/stream``.

The request body is a ``recovery.plan.PlanNode`` naming this peer. The answer is a stream
of frames (``recovery.frames``) carrying the node's ``own`` chunks, read from this peer's
store, interleaved with the frames its upstreams send it (each upstream is asked for its
own sub-plan with the same request), and closed by an end frame.

Pipelined and bounded: producers (one reading the store, one per upstream) feed a queue
of ``QUEUE_FRAMES_MAX`` frames that the response writer drains, so a slow receiver slows
the producers down (back-pressure) and no state is ever stored and forwarded whole.
Producers run in a task group tied to the request: a receiver that goes away cancels
them.

Routing around failures, without starting over: a chunk this peer lacks or holds corrupt
is fetched from another live replica. When an upstream fails (connection error, error
answer, malformed frame, a stream without its end frame), the chunks of its subtree that
were not forwarded yet are fetched directly from live replicas, skipping the peers seen
failing. Each such chunk is preceded by a rerouted frame naming the failed holder; a chunk
nobody can serve becomes a missing frame and the requester decides.

``install`` adds the route to a peer's application (``sr3 peer`` wires it in; ``ring``
does not import ``recovery``). The route sits behind the peer's authentication
middleware like every other one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from aiohttp import web

from recovery import frames
from recovery.frames import Frame, FrameParser
from recovery.plan import PLAN_DEPTH_MAX, PLAN_NODES_MAX, PlanNode
from ring import api, codec
from ring.errors import AuthError, ChunkCorrupt, PeerError, PeerUnavailable, ProtocolError
from ring.node import Node
from ring.peer_answers import body_of
from ring.replicas import read_from_replicas

__all__ = [
    "PLAN_BYTES_MAX",
    "QUEUE_FRAMES_MAX",
    "STREAMS_MAX",
    "Relay",
    "install",
    "parse_plan",
]

log = logging.getLogger(__name__)

ROUTE = api.RECOVERY_STREAM
PLAN_BYTES_MAX = 4 * 1024 * 1024
# Frames waiting between the producers and the response writer.
QUEUE_FRAMES_MAX = 4
# Chunks fetched at once from other replicas when routing around a failure.
REROUTE_TRANSFERS_MAX = 4
# Recovery streams one peer serves at once; more are refused with 503 (the receiver
# routes around a busy peer as around a failed one).
STREAMS_MAX = 16

# Failures of an upstream that make its remaining chunks come around it.
_UPSTREAM_FAILURES = (PeerError, ProtocolError, AuthError)


def install(app: web.Application, node: Node) -> None:
    """Add ``POST /v1/recovery/stream`` to a peer's application."""
    app.router.add_route(ROUTE.method, ROUTE.pattern, Relay(node).handle)


def parse_plan(body: bytes, me: str) -> PlanNode:
    """The plan node a request carries; ``ProtocolError`` unless it is for ``me``, is
    small, names distinct peers and distinct, well-formed chunk ids."""
    if len(body) > PLAN_BYTES_MAX:
        raise ProtocolError(f"recovery plan of {len(body)} bytes is above {PLAN_BYTES_MAX}")
    # Each plan node nests two levels deeper ({"upstreams": [{...}]}).
    data = api.load_json(body, bytes_max=PLAN_BYTES_MAX, depth_max=2 * PLAN_DEPTH_MAX + 3)
    plan = PlanNode.from_json(data)
    if plan.peer_id != me:
        raise ProtocolError(f"recovery plan is for {plan.peer_id[:80]!r}, this is {me!r}")
    peers = list(plan.peers())
    if len(peers) > PLAN_NODES_MAX or len(set(peers)) != len(peers):
        raise ProtocolError(f"a recovery plan names at most {PLAN_NODES_MAX} distinct peers")
    chunk_ids = list(plan.chunk_ids())
    if len(set(chunk_ids)) != len(chunk_ids) or not all(map(codec.is_chunk_id, chunk_ids)):
        raise ProtocolError("a recovery plan names distinct chunk ids (32 lowercase hex)")
    return plan


class Relay:
    """The request handler; one ``_Stream`` per request holds that request's state."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.streams = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        plan = parse_plan(body_of(request), self.node.config.peer_id)
        if self.streams >= STREAMS_MAX:
            raise web.HTTPServiceUnavailable(text=f"{STREAMS_MAX} recovery streams running")
        self.streams += 1
        self.node.foreground.enter()
        try:
            return await self._serve(request, plan)
        finally:
            self.node.foreground.leave()
            self.streams -= 1

    async def _serve(self, request: web.Request, plan: PlanNode) -> web.StreamResponse:
        await self.node.emulate_latency()
        response = web.StreamResponse(headers={"Content-Type": api.CONTENT_TYPE_FRAMES})
        await response.prepare(request)
        try:
            await _Stream(self.node, plan).run(response)
        except Exception as exc:
            # The answer has started: no error status can be sent any more. Without its
            # end frame, the receiver knows the stream is broken and routes around us.
            log.warning("recovery stream for %s broken off: %r", request.remote, exc)
        return response


class _Stream:
    def __init__(self, node: Node, plan: PlanNode) -> None:
        self.node = node
        self.plan = plan
        self.me = node.config.peer_id
        self.queue: asyncio.Queue[Frame | None] = asyncio.Queue(QUEUE_FRAMES_MAX)
        # Peers seen failing during this stream: never asked again.
        self.failed: set[str] = set()

    async def run(self, response: web.StreamResponse) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._produce())
            while (frame := await self.queue.get()) is not None:
                await self._send(response, frame)
        await self._send(response, frames.end_frame())
        await response.write_eof()

    async def _send(self, response: web.StreamResponse, frame: Frame) -> None:
        header, payload = frames.encode(frame)
        await self.node.egress.acquire(len(header) + len(payload))
        await response.write(header)
        if payload:
            await response.write(payload)

    async def _produce(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._own())
            for upstream in self.plan.upstreams:
                group.create_task(self._upstream(upstream))
        await self.queue.put(None)

    # -- own chunks ---------------------------------------------------------------------

    async def _own(self) -> None:
        for chunk_id in self.plan.own:
            stored = await self._read_local(chunk_id)
            if stored is not None:
                await self.queue.put(frames.chunk_frame(chunk_id, stored))
            else:
                await self._reroute(chunk_id, failed_holder="", skip_self=True)

    async def _read_local(self, chunk_id: str) -> bytes | None:
        """The stored form from this peer's store (verified by the store), or None."""
        try:
            return await self.node.chunks.get(chunk_id)
        except (ChunkCorrupt, OSError) as exc:
            log.warning("recovery: own copy of %s unusable: %s", chunk_id, exc)
            return None

    # -- upstreams ----------------------------------------------------------------------

    async def _upstream(self, upstream: PlanNode) -> None:
        forwarded: set[str] = set()
        failed_holder = ""
        try:
            await self._follow(upstream, forwarded)
        except _UPSTREAM_FAILURES as exc:
            log.warning("recovery: upstream %s failed: %s", upstream.peer_id, exc)
            self.failed.add(upstream.peer_id)
            failed_holder = upstream.peer_id
        # After a failure: everything not forwarded; after a clean end: chunks whose
        # frames failed verification here.
        remaining = [c for c in upstream.chunk_ids() if c not in forwarded]
        await self._reroute_many(remaining, failed_holder)

    def _address(self, peer_id: str) -> str:
        entry = self.node.table.entry(peer_id)
        if entry is None or self.node.table.liveness(peer_id) != "up":
            raise PeerUnavailable(peer_id, "not a live member of the ring")
        return entry.address

    async def _follow(self, upstream: PlanNode, forwarded: set[str]) -> None:
        """Forward an upstream's frames as they arrive, until its end frame."""
        address = self._address(upstream.peer_id)
        body = codec.compact_json(upstream.to_json())
        expected = frozenset(upstream.chunk_ids())
        parser = FrameParser()
        async with self.node.data_transport.stream(
            address, ROUTE.method, ROUTE.pattern, body=body
        ) as pieces:
            async for piece in pieces:
                for frame in parser.feed(piece):
                    await self._forward(frame, expected, forwarded)
        if not parser.ended:
            raise ProtocolError(f"{upstream.peer_id}: recovery stream ended without its end")

    async def _forward(self, frame: Frame, expected: frozenset[str], forwarded: set[str]) -> None:
        if frame.kind == frames.KIND_END:
            return
        if frame.chunk_id not in expected:
            raise ProtocolError(f"recovery stream sent chunk {frame.chunk_id}, not in its plan")
        if frame.chunk_id in forwarded:
            return
        if frame.kind == frames.KIND_CHUNK:
            try:
                codec.verify_stored(frame.payload, frame.chunk_id)
            except ChunkCorrupt as exc:
                log.warning("recovery: relayed chunk failed verification: %s", exc)
                return
        await self.queue.put(frame)
        if frame.kind in (frames.KIND_CHUNK, frames.KIND_MISSING):
            forwarded.add(frame.chunk_id)

    # -- routing around failures --------------------------------------------------------

    async def _reroute_many(self, chunk_ids: Iterable[str], failed_holder: str) -> None:
        slots = asyncio.Semaphore(REROUTE_TRANSFERS_MAX)

        async def one(chunk_id: str) -> None:
            async with slots:
                await self._reroute(chunk_id, failed_holder, skip_self=False)

        async with asyncio.TaskGroup() as group:
            for chunk_id in chunk_ids:
                group.create_task(one(chunk_id))

    async def _reroute(self, chunk_id: str, failed_holder: str, *, skip_self: bool) -> None:
        """Send a chunk that its planned holder could not: from this peer's store if it
        has a replica (unless it is the holder that failed), else from another live
        replica; a missing frame if nobody can."""
        stored, causes = await self._fetch_elsewhere(chunk_id, skip_self=skip_self)
        await self.queue.put(frames.rerouted_frame(chunk_id, failed_holder))
        if stored is None:
            reason = "; ".join(causes[:3]) or "no live replica"
            await self.queue.put(frames.missing_frame(chunk_id, reason))
        else:
            await self.queue.put(frames.chunk_frame(chunk_id, stored))

    async def _fetch_elsewhere(
        self, chunk_id: str, *, skip_self: bool
    ) -> tuple[bytes | None, list[str]]:
        if not skip_self and self.node.chunks.has(chunk_id):
            stored = await self._read_local(chunk_id)
            if stored is not None:
                return stored, []
        live = self.node.table.live()
        replicas = [
            member
            for member in self.node.ring().candidates(chunk_id, self.node.config.replication)
            if member.peer_id != self.me
            and member.peer_id not in self.failed
            and member.peer_id in live
        ]
        read = await read_from_replicas(
            self.node.data_transport,
            replicas,
            chunk_id,
            check="checksum",
            tolerated=(*_UPSTREAM_FAILURES, ChunkCorrupt),
            on_unreachable=lambda member: self.failed.add(member.peer_id),
        )
        return read.data, read.causes
