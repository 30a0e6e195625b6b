"""The storage peer: one aiohttp application per process.

HTTP API (all under ``/v1`` except metrics; every route but health is authenticated, see
``ring.auth``; errors are JSON ``{"error": code, "message": text}``):

    GET    /v1/health                     liveness, unauthenticated
    GET    /v1/info                       peer id, address, zone, stored bytes, chunk count
    GET    /v1/ring                       the member table and the cluster's R, W and vnodes
    PUT    /v1/chunks/{id}                store a chunk (body: stored form, see sr3.codec)
    GET    /v1/chunks/{id}                a chunk's stored form, verified before it is sent
    HEAD   /v1/chunks/{id}                200 if present, 404 if not
    POST   /v1/chunks/exists              {"ids": [...]} -> {"present": [...]}
    GET    /v1/records?prefix=P&limit=N   record keys and versions
    GET    /v1/records/{key}              value as body, version in X-SR3-Version
    PUT    /v1/records/{key}?expected_version=N   compare-and-set, 409 on a stale version
    DELETE /v1/records/{key}?expected_version=N
    GET    /metrics                       Prometheus text (signed, or the metrics bearer token)

The peer never crashes on input: every handler error becomes a 4xx or 5xx JSON answer.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ring.auth import ANY_TARGET, AuthFailure, Verifier
from ring.chunkstore import IO_CONCURRENCY_DEFAULT, ChunkStore
from ring.metrics import PeerMetrics
from ring.placement import VNODES_DEFAULT, Member
from ring.records import RECORD_BYTES_MAX, RecordStore, validate_key
from sr3 import codec
from sr3.errors import (
    ChunkCorrupt,
    ChunkTooLarge,
    ProtocolError,
    RecordConflict,
    SR3Error,
    StorageFull,
)

__all__ = ["PeerConfig", "build_app"]

log = logging.getLogger(__name__)

VERSION_HEADER = "X-SR3-Version"
EXISTS_IDS_MAX = 10_000
LIST_LIMIT_MAX = 10_000
REQUEST_BYTES_MAX = max(codec.STORED_BYTES_MAX, RECORD_BYTES_MAX + 1024)
HEADER_LINE_BYTES_MAX = 8190
HEADERS_MAX = 64

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class PeerConfig:
    peer_id: str
    host: str
    port: int
    data_dir: Path
    secret: str
    members: tuple[Member, ...]
    zone: str = ""
    replication: int = 3
    write_quorum: int = 2
    vnodes: int = VNODES_DEFAULT
    zone_aware: bool = False
    capacity_bytes: int | None = None
    io_concurrency: int = IO_CONCURRENCY_DEFAULT
    # The address other peers and clients use, when it differs from host:port (containers).
    advertise: str | None = None

    @property
    def address(self) -> str:
        return self.advertise or f"{self.host}:{self.port}"


def _error(status: int, code: str, message: str, **extra: Any) -> web.Response:
    body = {"error": code, "message": message, **extra}
    return web.json_response(body, status=status)


def _translate(exc: Exception) -> web.Response:
    """Map an exception raised while handling a request to its HTTP answer."""
    if isinstance(exc, RecordConflict):
        return _error(409, "version_conflict", str(exc), current_version=exc.current)
    if isinstance(exc, ChunkTooLarge):
        return _error(413, "chunk_too_large", str(exc))
    if isinstance(exc, ChunkCorrupt):
        return _error(422, "chunk_corrupt", str(exc))
    if isinstance(exc, StorageFull):
        return _error(507, "storage_full", str(exc))
    if isinstance(exc, ProtocolError):
        return _error(400, "bad_request", str(exc))
    if isinstance(exc, SR3Error):
        return _error(500, "internal", str(exc))
    log.exception("unexpected error while handling a request", exc_info=exc)
    return _error(500, "internal", f"{type(exc).__name__}")


class Peer:
    """Request handlers over one chunk store and one record store."""

    def __init__(self, config: PeerConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self.started_at = clock()
        self.chunks = ChunkStore(
            config.data_dir,
            capacity_bytes=config.capacity_bytes,
            io_concurrency=config.io_concurrency,
        )
        self.records = RecordStore(config.data_dir)
        self.verifier = Verifier(config.secret, clock)
        # The addresses a correctly targeted request may name.
        self.addresses = frozenset({config.address, f"{config.host}:{config.port}"})
        self.metrics = PeerMetrics()
        self.chunks.on_corrupt = lambda _chunk_id, _reason: self.metrics.chunks_corrupt.inc()
        self.metrics.gauge(
            "sr3_peer_chunks", "Chunks stored.", lambda: self.chunks.stats().chunk_count
        )
        self.metrics.gauge(
            "sr3_peer_stored_bytes", "Stored bytes.", lambda: self.chunks.stats().stored_bytes
        )
        self.metrics.gauge("sr3_peer_records", "Records stored.", self.records.count)

    def open(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        self.chunks.open()
        self.records.open()

    # -- middleware ---------------------------------------------------------------------

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Authenticate, then translate every error to a JSON answer; count and time."""
        route = request.match_info.route.resource
        route_name = route.canonical if route is not None else "unmatched"
        started = time.perf_counter()
        try:
            await self._authenticate(request)
            response = await handler(request)
        except AuthFailure as exc:
            self.metrics.auth_failures.inc()
            response = _error(401, "unauthorized", str(exc))
        except web.HTTPException as exc:
            response = _error(exc.status, exc.reason.lower().replace(" ", "_"), exc.text or "")
        except Exception as exc:
            response = _translate(exc)
        self.metrics.requests.labels(route_name, str(response.status)).inc()
        self.metrics.request_seconds.labels(route_name).observe(time.perf_counter() - started)
        return response

    async def _authenticate(self, request: web.Request) -> None:
        if request.path == "/v1/health":
            return
        if request.path == "/metrics" and self.verifier.verify_metrics_bearer(request.headers):
            return
        # The signature is checked before the body is read: a stranger cannot make the
        # peer buffer a body.
        targets = self.addresses
        if request.method == "GET" and request.path == "/v1/ring":
            targets = self.addresses | {ANY_TARGET}
        digest = self.verifier.verify_headers(
            request.method, request.raw_path, request.headers, targets
        )
        body = await request.read() if request.body_exists else None
        self.verifier.verify_body(digest, body)

    # -- peer ---------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "peer_id": self.config.peer_id})

    async def info(self, request: web.Request) -> web.Response:
        stats = self.chunks.stats()
        return web.json_response(
            {
                "peer_id": self.config.peer_id,
                "address": self.config.address,
                "zone": self.config.zone,
                "uptime_s": round(self.clock() - self.started_at, 3),
                "chunk_count": stats.chunk_count,
                "stored_bytes": stats.stored_bytes,
                "capacity_bytes": stats.capacity_bytes,
                "quarantined": stats.quarantined,
                "record_count": self.records.count(),
            }
        )

    async def ring(self, request: web.Request) -> web.Response:
        config = self.config
        return web.json_response(
            {
                "members": [
                    {"peer_id": m.peer_id, "address": m.address, "zone": m.zone}
                    for m in config.members
                ],
                "replication": config.replication,
                "write_quorum": config.write_quorum,
                "vnodes": config.vnodes,
                "zone_aware": config.zone_aware,
            }
        )

    async def metrics_text(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- chunks -------------------------------------------------------------------------

    @staticmethod
    def _chunk_id(request: web.Request) -> str:
        chunk_id = request.match_info["chunk_id"]
        if not codec.is_chunk_id(chunk_id):
            raise ProtocolError("a chunk id is 32 lowercase hex digits")
        return chunk_id

    async def put_chunk(self, request: web.Request) -> web.Response:
        chunk_id = self._chunk_id(request)
        stored = await request.read()
        created = await self.chunks.put(chunk_id, stored)
        if created:
            self.metrics.chunk_bytes_written.inc(len(stored))
        return web.json_response(
            {"id": chunk_id, "created": created}, status=201 if created else 200
        )

    async def get_chunk(self, request: web.Request) -> web.Response:
        chunk_id = self._chunk_id(request)
        stored = await self.chunks.get(chunk_id)
        if stored is None:
            return _error(404, "not_found", f"chunk {chunk_id} is not stored here")
        self.metrics.chunk_bytes_read.inc(len(stored))
        return web.Response(body=stored, content_type="application/octet-stream")

    async def head_chunk(self, request: web.Request) -> web.Response:
        size = self.chunks.stored_size(self._chunk_id(request))
        if size is None:
            return web.Response(status=404)
        return web.Response(status=200, headers={"X-SR3-Stored-Bytes": str(size)})

    async def chunks_exist(self, request: web.Request) -> web.Response:
        ids = _json_body(await request.read()).get("ids")
        if not isinstance(ids, list) or len(ids) > EXISTS_IDS_MAX:
            raise ProtocolError(f"'ids' must be a list of at most {EXISTS_IDS_MAX} chunk ids")
        if not all(isinstance(item, str) and codec.is_chunk_id(item) for item in ids):
            raise ProtocolError("every id must be 32 lowercase hex digits")
        return web.json_response({"present": [item for item in ids if self.chunks.has(item)]})

    # -- records ------------------------------------------------------------------------

    async def list_records(self, request: web.Request) -> web.Response:
        prefix = request.query.get("prefix", "")
        limit = _int_query(request, "limit", LIST_LIMIT_MAX)
        if not 0 < limit <= LIST_LIMIT_MAX:
            raise ProtocolError(f"limit must be between 1 and {LIST_LIMIT_MAX}")
        entries = self.records.list(prefix, limit)
        return web.json_response(
            {"records": [{"key": key, "version": version} for key, version in entries]}
        )

    async def get_record(self, request: web.Request) -> web.Response:
        key = validate_key(request.match_info["key"])
        record = await self.records.get(key)
        if record is None:
            return _error(404, "not_found", f"record {key!r} is not stored here")
        return web.Response(
            body=record.value,
            content_type="application/octet-stream",
            headers={VERSION_HEADER: str(record.version)},
        )

    async def put_record(self, request: web.Request) -> web.Response:
        key = validate_key(request.match_info["key"])
        expected = _int_query(request, "expected_version", None)
        record = await self.records.put(key, await request.read(), expected)
        return web.json_response({"key": key, "version": record.version}, status=201)

    async def delete_record(self, request: web.Request) -> web.Response:
        key = validate_key(request.match_info["key"])
        expected = _int_query(request, "expected_version", None)
        deleted = await self.records.delete(key, expected)
        return web.json_response({"key": key, "deleted": deleted})


def _int_query(request: web.Request, name: str, default: int | None) -> int:
    raw = request.query.get(name)
    if raw is None:
        if default is None:
            raise ProtocolError(f"query parameter {name!r} is required")
        return default
    if not raw.isdigit() or len(raw) > 18:
        raise ProtocolError(f"query parameter {name!r} must be a non-negative integer")
    return int(raw)


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ProtocolError("request body must be a JSON object")
    return parsed


def build_app(config: PeerConfig, clock: Callable[[], float] = time.time) -> web.Application:
    """The peer's aiohttp application; its stores are opened before it is returned."""
    peer = Peer(config, clock)
    peer.open()
    app = web.Application(middlewares=[peer.guard], client_max_size=REQUEST_BYTES_MAX)
    app["peer"] = peer
    app.router.add_get("/v1/health", peer.health)
    app.router.add_get("/v1/info", peer.info)
    app.router.add_get("/v1/ring", peer.ring)
    app.router.add_get("/metrics", peer.metrics_text)
    app.router.add_put("/v1/chunks/{chunk_id}", peer.put_chunk)
    app.router.add_get("/v1/chunks/{chunk_id}", peer.get_chunk, allow_head=False)
    app.router.add_head("/v1/chunks/{chunk_id}", peer.head_chunk)
    app.router.add_post("/v1/chunks/exists", peer.chunks_exist)
    app.router.add_get("/v1/records", peer.list_records)
    app.router.add_get("/v1/records/{key:.+}", peer.get_record)
    app.router.add_put("/v1/records/{key:.+}", peer.put_record)
    app.router.add_delete("/v1/records/{key:.+}", peer.delete_record)
    return app


def runner_options() -> dict[str, Any]:
    """Bounds on the HTTP parser: request line, header sizes and count."""
    return {
        "max_line_size": HEADER_LINE_BYTES_MAX,
        "max_field_size": HEADER_LINE_BYTES_MAX,
        "max_headers": HEADERS_MAX,
    }
