"""The HTTP routes of the ``sr3://`` namespace, served by every peer (``install`` adds
them to a peer's application; ``ring.fs_api`` has the routes, answers and error codes).

Each request is one ``Namespace`` operation (``filesystem.namespace``), run through a ring
client the peer opens for it with its own TLS. A file's body is streamed into the
namespace as it arrives and checked against its signed digest before the file is named
(a body that does not match is never visible). Refusals answer with their 4xx and code;
a ring that cannot serve answers 503 ``unavailable``. A fenced write (``lease=&fence=``)
reads its lease record first and is refused with 409 ``fenced`` unless the lease is held
with that fence. A coordinator that stalled while serving a write, or just before it came,
or whose client left, does not commit it (``filesystem.freshness``: 425 ``stalled``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import random
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from filesystem.freshness import CommitGuard, GuardedClient
from filesystem.moves import MoveRefused
from filesystem.namespace import BODY_PIECE_BYTES, FsError, Namespace
from filesystem.sweep import sweep_renames
from ring import api, fs_api, lease
from ring.api import Route
from ring.auth import AuthFailure, BodyDigest
from ring.client import ClientOptions
from ring.client.chunks import first_error
from ring.errors import (
    DataUnavailable,
    NotFound,
    ProtocolError,
    QuorumError,
    RecordContention,
    SR3Error,
)
from ring.loops import run_periodic
from ring.node import Node
from ring.peer import SIGNED_BODY_DIGEST

__all__ = ["FileService", "install"]

log = logging.getLogger(__name__)

# The sweep's pauses are the interval times a factor drawn in this range, so that peers
# started together do not sweep together.
SWEEP_JITTER = (0.8, 1.2)


def _path(request: web.Request) -> str:
    return fs_api.route_path(request.match_info.get("path", ""))


def _flag(request: web.Request, name: str) -> bool:
    return api.parse_flag(request.query.get(name), name)


def _op(request: web.Request) -> str:
    """The request's operation id, or a fresh one (a client that never retries)."""
    return fs_api.parse_op(request.query.get("op")) or secrets.token_hex(12)


def _error(error: FsError) -> web.Response:
    return web.json_response(api.error_body(error.code, str(error)), status=error.status)


def _unavailable(exc: Exception) -> web.Response:
    return web.json_response(api.error_body("unavailable", str(exc)), status=503)


def _fence_refusal(key: str, fence: int, record: bytes | None) -> str | None:
    """Why a write fenced by ``fence`` on the lease record ``key`` (its value, None when
    absent) must be refused, or None when that fence holds the lease."""
    stop = "it must stop writing"
    if record is None:
        return f"fenced: no lease record {key}; this writer's fence {fence} is not held — {stop}"
    try:
        held = lease.parse_lease(record)
    except ProtocolError as exc:
        return f"fenced: record {key} is not a lease ({exc}): fence {fence} holds nothing — {stop}"
    if held.released:
        return (
            f"fenced: lease {key} was released by {held.holder} (fence {held.fence}); "
            f"this writer's fence {fence} no longer holds it — {stop}"
        )
    if held.fence != fence:
        what = "was taken over" if fence < held.fence else "was never granted"
        return (
            f"fenced: lease {key} is held by {held.holder} with fence {held.fence}; "
            f"this writer's fence {fence} {what} — {stop}"
        )
    return None


async def _check_fence(ns: Namespace, request: web.Request) -> None:
    """Refuse (409 "fenced") a fenced request whose fence does not hold its lease now:
    a linearizable read of the lease record, before anything is read or written."""
    fenced = fs_api.parse_fence(request.query)
    if fenced is None:
        return
    key, fence = fenced
    record = await ns.client.get_record(key)
    refusal = _fence_refusal(key, fence, None if record is None else record.value)
    if refusal is not None:
        raise FsError(409, "fenced", refusal)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _answers(handler: Handler, guard: CommitGuard) -> Handler:
    """The namespace's refusals and the ring's unavailability as JSON answers; the
    record writes the handler makes pass ``guard`` (marked as serving the request)."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            with guard.serving(lambda: _client_gone(request)):
                return await handler(request)
        except FsError as exc:
            return _error(exc)
        except NotFound as exc:
            return _error(FsError(404, "not_found", str(exc)))
        except (QuorumError, DataUnavailable, RecordContention) as exc:
            return _unavailable(exc)

    return wrapped


class FileService:
    """The routes of one peer, over a ring client opened with the peer's application."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.namespace: Namespace | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.guard = CommitGuard(node.clocks.monotonic)
        self._watch: asyncio.Task[None] | None = None

    async def start(self, _app: web.Application) -> None:
        config = self.node.config
        # The peer's own TLS, as for its calls to other peers (its certificate serves as
        # a client certificate where peers require one).
        tls = config.tls
        options = ClientOptions(tls=None if tls is None else tls.as_client)
        # Chunks this peer holds are read from its own store, not through its own HTTP
        # server: most block reads of a file find some of their chunks here.
        client = GuardedClient(
            config.address, config.secret, guard=self.guard, options=options,
            local_chunks=self.node.own_chunks,
        )  # fmt: skip
        self.namespace = Namespace(client, lambda: int(self.node.clocks.wall() * 1000))
        self._watch = asyncio.create_task(self.guard.run())
        if config.rename_sweep_interval_s > 0:
            self._sweeper = asyncio.create_task(self._sweep_renames())

    async def stop(self, _app: web.Application) -> None:
        for task in (self._sweeper, self._watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.namespace is not None:
            await self.namespace.client.close()

    async def _sweep_renames(self) -> None:
        """Finish renames nobody finishes (``filesystem.sweep``), one pass per interval
        (jittered), until the peer stops. A pass that fails on the ring (unavailable,
        contended) is logged and the next one tries again (``ring.loops``)."""
        config = self.node.config
        rng = random.Random(config.rng_seed)

        async def jittered(seconds: float) -> None:
            await asyncio.sleep(seconds * rng.uniform(*SWEEP_JITTER))

        async def one_pass() -> None:
            finished = await sweep_renames(
                self.ns, abandoned_after_ms=int(config.rename_abandoned_s * 1000), owns=self._owns
            )
            if finished:
                log.info("rename sweep: %d abandoned rename(s) finished", finished)

        await run_periodic(
            "rename sweep", one_pass, config.rename_sweep_interval_s, first_at_once=False,
            tolerated=(SR3Error, MoveRefused), sleep=jittered,
        )  # fmt: skip

    async def _owns(self, key: str) -> bool:
        """Whether this peer is first in ``key``'s placement (the one that sweeps it)."""
        view = await self.ns.client.ring()
        first = view.ring.preference_list(key, 1)
        return bool(first) and first[0].peer_id == self.node.config.peer_id

    @property
    def ns(self) -> Namespace:
        if self.namespace is None:
            raise FsError(503, "starting", "the file namespace is starting")
        return self.namespace

    async def write(self, request: web.Request) -> web.StreamResponse:
        path = _path(request)
        overwrite = _flag(request, "overwrite")
        op = _op(request)
        signed = request.get(SIGNED_BODY_DIGEST)
        if not isinstance(signed, BodyDigest):
            raise AuthFailure("the body of a file is signed")
        await _check_fence(self.ns, request)
        digest = signed.hasher()
        verified = False

        async def body() -> AsyncIterator[bytes]:
            nonlocal verified
            size = 0
            while piece := await request.content.read(BODY_PIECE_BYTES):
                size += len(piece)
                if size > fs_api.FILE_BYTES_MAX:
                    raise FsError(
                        413, "too_large", f"a file is at most {fs_api.FILE_BYTES_MAX} bytes"
                    )
                digest.update(piece)
                yield piece
            if not hmac.compare_digest(digest.hexdigest(), signed.hex):
                raise AuthFailure("body does not match its signed digest")
            verified = True

        stat = await self.ns.create(path, body(), overwrite=overwrite, op=op)
        assert verified
        return web.json_response(fs_api.stat_body(stat), status=201)

    async def read(self, request: web.Request) -> web.StreamResponse:
        path = _path(request)
        stat, entry, tag = await self.ns.open(path, fs_api.parse_tag(request.query.get("tag")))
        offset = api.parse_int(request.query.get("offset"), "offset", 0, fs_api.FILE_BYTES_MAX)
        length = api.parse_int(
            request.query.get("length"), "length", fs_api.FILE_BYTES_MAX, fs_api.FILE_BYTES_MAX
        )
        length = max(0, min(length, stat.size - offset))
        pieces = self.ns.read(entry, offset, length)
        first = await anext(pieces, b"")  # unavailable chunks answer 503, not a cut body
        response = web.StreamResponse(
            status=200,
            headers={
                fs_api.HEADER_FILE_SIZE: str(stat.size),
                fs_api.HEADER_MTIME_MS: str(stat.mtime_ms),
                fs_api.HEADER_FILE_TAG: tag,
                "Content-Type": "application/octet-stream",
            },
        )
        response.content_length = length
        await response.prepare(request)
        await response.write(first)
        async for piece in pieces:
            await response.write(piece)
        await response.write_eof()
        return response

    async def stat(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(fs_api.stat_body(await self.ns.stat(_path(request))))

    async def list(self, request: web.Request) -> web.StreamResponse:
        path = _path(request)
        after = request.query.get("after", "")
        if len(after) > fs_api.PATH_CHARS_MAX:
            raise ProtocolError(f"after: at most {fs_api.PATH_CHARS_MAX} characters")
        limit = api.parse_int(
            request.query.get("limit"), "limit", fs_api.LIST_LIMIT_MAX, fs_api.LIST_LIMIT_MAX
        )
        # The listing and the stat of the directory at once: most listings are of
        # directories, and a file's (or a missing path's) scan finds nothing anyway.
        try:
            async with asyncio.TaskGroup() as group:
                stat_task = group.create_task(self.ns.stat(path))
                listing = group.create_task(self.ns.children(path, after=after, limit=limit))
        except BaseExceptionGroup as group_error:
            raise first_error(group_error) from None
        stat, (entries, truncated, following) = stat_task.result(), listing.result()
        if stat.type == "file":
            entries, truncated, following = [stat], False, ""
        return web.json_response(
            {
                "path": path,
                "type": stat.type,
                "entries": [{"name": e.name, **fs_api.stat_body(e)} for e in entries],
                "truncated": truncated,
                # Where the next page starts (``after``): a listing that ran into a long
                # run of deleted entries may end a page with none.
                "next": following,
            }
        )

    async def delete(self, request: web.Request) -> web.StreamResponse:
        path, recursive = _path(request), _flag(request, "recursive")
        await _check_fence(self.ns, request)
        removed = await self.ns.delete(path, recursive=recursive)
        return web.json_response({"deleted": removed})

    async def rename(self, request: web.Request) -> web.StreamResponse:
        source, target = fs_api.paths_of(fs_api.FS_RENAME, request.match_info, request.query)
        overwrite, op = _flag(request, "overwrite"), _op(request)
        await _check_fence(self.ns, request)
        stat = await self.ns.rename(source, target, overwrite=overwrite, op=op)
        return web.json_response(fs_api.stat_body(stat))

    async def usage(self, request: web.Request) -> web.StreamResponse:
        """The ring's disk use for Hadoop's ``df``: bytes stored and free on every peer
        that answers (replicas counted as stored, as HDFS counts them)."""
        _path(request)  # the credential's reach was checked on it
        status = await self.ns.client.status()
        up = [peer for peer in status.peers if peer.state == "up"]
        used = sum(peer.stored_bytes or 0 for peer in up)
        remaining = sum(peer.disk_free_bytes or 0 for peer in up)
        return web.json_response(
            {"capacity": used + remaining, "used": used, "remaining": remaining, "peers": len(up)}
        )

    async def mkdirs(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"created": await self.ns.mkdirs(_path(request))})


def install(app: web.Application, node: Node) -> None:
    """Add the file namespace's routes to a peer's application."""
    service = FileService(node)
    app.on_startup.append(service.start)
    app.on_cleanup.append(service.stop)
    routes: dict[Route, Handler] = {
        fs_api.FS_WRITE: service.write,
        fs_api.FS_READ: service.read,
        fs_api.FS_DELETE: service.delete,
        fs_api.FS_STAT: service.stat,
        fs_api.FS_LIST: service.list,
        fs_api.FS_RENAME: service.rename,
        fs_api.FS_MKDIRS: service.mkdirs,
        fs_api.FS_USAGE: service.usage,
    }
    for route, handler in routes.items():
        if route.method == "GET":
            app.router.add_get(route.pattern, _answers(handler, service.guard), allow_head=False)
        else:
            app.router.add_route(route.method, route.pattern, _answers(handler, service.guard))
