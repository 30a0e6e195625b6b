"""The storage peer: one aiohttp application per process.

The routes, headers, limits and body shapes are the wire contract in ``ring.api``; this
module is their server side: every route but health is authenticated (``ring.auth``),
and errors are JSON ``{"error": code, "message": text}``.

Extensions add routes from outside ``ring`` (``build_app(node, extensions)``), behind the
same authentication; ``sr3 peer`` installs ``api.RECOVERY_STREAM`` from
``recovery.relay``.

Network emulation (``--egress-rate``, ``--added-latency``): chunk reads wait the added
latency, then draw their bytes from the node's egress token bucket before they are sent.

The peer never crashes on input: every handler error becomes a 4xx or 5xx JSON answer.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ring import api, codec, fs_api, paxos, records_api
from ring.api import Route
from ring.auth import ANY_TARGET, AuthFailure, ClockSkew, Principal, Verifier
from ring.cluster_http import cluster_routes
from ring.consensus import RoundView
from ring.errors import (
    ProtocolError,
)
from ring.metrics import PeerMetrics, watch_node
from ring.node import Node
from ring.paxos import Ballot, Preempted
from ring.peer_answers import (
    BODY,
    CLIENT_CLOSED,
    Leaving,
    body_of,
    client_gone,
    error_answer,
    preempted_answer,
    read_body,
    translate,
)
from ring.peer_config import PeerConfig
from ring.records import validate_key

__all__ = ["SIGNED_BODY_DIGEST", "AppExtension", "PeerConfig", "build_app"]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Adds routes to a peer's application (they pass through ``Peer.guard``).
AppExtension = Callable[[web.Application, Node], None]


# Where a handler of a streamed-body route finds the body digest the request signed.
SIGNED_BODY_DIGEST = "sr3.signed_body_digest"


def _canonical(route: Route) -> tuple[str, str]:
    """``(method, pattern)`` as aiohttp names a matched resource: the pattern without the
    variables' regular expressions."""
    return route.method, re.sub(r"\{(\w+):[^}]*\}", r"{\1}", route.pattern)


_STREAMED_BODY = frozenset(_canonical(route) for route in fs_api.STREAMED_BODY_ROUTES)
_CHUNK_PUT = _canonical(api.CHUNK_PUT)
# What a scoped credential may reach: the member table (to find peers), and the file
# namespace's routes for paths under its prefix.
_SCOPED_ROUTES = {_canonical(route): route for route in fs_api.FS_ROUTES}
_SCOPED_OPEN = frozenset({_canonical(api.RING)})


class Forbidden(Exception):
    """Valid credentials that do not reach what the request asks. The peer answers 403."""


def _authorize(request: web.Request, principal: Principal) -> None:
    """A scoped credential reaches only the file namespace under its prefix, and fences
    its writes only with leases under it (``fs_api.lease_within``)."""
    prefix = principal.prefix
    if prefix is None:
        return
    key = (request.method, _pattern(request))
    if key in _SCOPED_OPEN:
        return
    route = _SCOPED_ROUTES.get(key)
    if route is None:
        raise Forbidden(f"a credential scoped to {prefix} reaches only files under it")
    for path in fs_api.paths_of(route, request.match_info, request.query):
        if not _under(path, prefix):
            raise Forbidden(f"{path[:200]} is outside {prefix}, the credential's prefix")
    fenced = fs_api.parse_fence(request.query) if route in fs_api.FENCED_ROUTES else None
    if fenced is not None and not fs_api.lease_within(fenced[0], prefix):
        raise Forbidden(
            f"lease {fenced[0][:200]} is outside {prefix}, the credential's prefix (a "
            f"credential scoped to {prefix} fences with leases under {prefix[1:]}/)"
        )


def _under(path: str, prefix: str) -> bool:
    return prefix in (fs_api.ROOT, path) or path.startswith(prefix + "/")


def _pattern(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else ""


def _streamed_body(request: web.Request) -> bool:
    """A route whose body its handler streams (a file of the namespace, beyond what the
    peer buffers): the handler checks the signed digest, and keeps nothing that fails."""
    return (request.method, _pattern(request)) in _STREAMED_BODY


class Peer:
    """The HTTP shell of one node: request handlers, authentication, metrics."""

    def __init__(self, node: Node) -> None:
        self.node = node
        config = node.config
        self.config = config
        self.monotonic = node.clocks.monotonic
        self.started_at = self.monotonic()
        self.chunks = node.chunks
        self.records = node.records
        # Signed timestamps are compared across machines: wall time.
        self.verifier = Verifier(config.secret, node.clocks.wall)
        # The addresses a correctly targeted request may name.
        self.addresses = config.addresses
        self.metrics = PeerMetrics()
        self.chunks.on_corrupt = self._on_corrupt
        watch_node(self.metrics, node)

    def _on_corrupt(self, chunk_id: str, _reason: str) -> None:
        """A copy here failed its check and was quarantined: count it, fetch a good one."""
        self.metrics.chunks_corrupt.inc()
        self.node.scrubber.flag(chunk_id)

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
            # A clock too far apart has its own code: clients then try other peers.
            code = "clock_skew" if isinstance(exc, ClockSkew) else "unauthorized"
            response = error_answer(401, code, str(exc))
        except Forbidden as exc:
            self.metrics.auth_failures.inc()
            response = error_answer(403, "forbidden", str(exc))
        except web.HTTPException as exc:
            response = error_answer(
                exc.status, exc.reason.lower().replace(" ", "_"), exc.text or ""
            )
        except Exception as exc:
            if not client_gone(request, exc):
                response = translate(exc)
            else:
                # Nobody reads this answer: counted as 499 ("client closed"), not an error.
                log.debug("%s %s: the client went away: %r", request.method, route_name, exc)
                response = error_answer(CLIENT_CLOSED, "client_closed", "the client went away")
        if response.status >= 500:
            self.metrics.responses_5xx.inc()
        self.metrics.requests.labels(route_name, str(response.status)).inc()
        self.metrics.request_seconds.labels(route_name).observe(time.perf_counter() - started)
        return response

    async def _authenticate(self, request: web.Request) -> None:
        if request.path == api.HEALTH.pattern:
            return
        metrics = request.path == api.METRICS.pattern
        if metrics and self.verifier.verify_metrics_bearer(request.headers):
            return
        # The signature is checked before the body is read: a stranger cannot make the
        # peer buffer a body.
        targets = self.addresses
        if Route(request.method, request.path) in api.ANY_TARGET_ROUTES:
            targets = self.addresses | {ANY_TARGET}
        digest, principal = self.verifier.authenticate(
            request.method, request.raw_path, request.headers, targets
        )
        # Before anything reads the decoded path or query (the scope check first).
        api.check_target(request.raw_path)
        _authorize(request, principal)
        if _streamed_body(request):
            # Read (bounded) and checked against the digest by the handler as it goes.
            request[SIGNED_BODY_DIGEST] = digest
            return
        # Read once, here, for the handler (``body_of``): a declared length over the
        # route's bound is refused 413 before any of the body is read.
        chunk = (request.method, _pattern(request)) == _CHUNK_PUT
        limit = codec.STORED_BYTES_MAX if chunk else api.REQUEST_BYTES_MAX
        body = await read_body(request, limit) if request.body_exists else None
        request[BODY] = body
        self.verifier.verify_body(digest, body)

    # -- peer and membership -------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        ready = self.node.gossiper.ready.is_set()
        # Members of the configuration this peer has heard from (a member the voters
        # added moments ago is placed before its first heartbeat arrives here).
        table = self.node.table
        members = sum(1 for m in table.placement() if table.entry(m.peer_id) is not None)
        # Whether no record waits for a catch-up from the rings before this one
        # (``ring.settle``): after a change, until every member caught up.
        settled = not self.node.acceptor.history()
        return web.json_response(
            {
                "status": "ok", "peer_id": self.config.peer_id, "ready": ready,
                "members": members, "settled": settled,
            }
        )  # fmt: skip

    async def info(self, request: web.Request) -> web.Response:
        node = self.node
        stats = self.chunks.stats()
        repair = node.repairer.last
        overlay: dict[str, Any] | None = None
        if node.overlay is not None:
            overlay_stats = node.overlay.stats()
            overlay = {
                "contacts": len(node.overlay.contacts()),
                "handled": overlay_stats.handled,
                "dropped": overlay_stats.dropped,
            }
        return web.json_response(
            {
                "peer_id": self.config.peer_id,
                "address": self.config.address,
                "zone": self.config.zone,
                "epoch": node.epoch,
                "status": node.table.own.status,
                "uptime_s": round(self.monotonic() - self.started_at, 3),
                "chunk_count": stats.chunk_count,
                "stored_bytes": stats.stored_bytes,
                "capacity_bytes": stats.capacity_bytes,
                "disk_free_bytes": stats.disk_free_bytes,
                "direct_io": stats.direct_io,
                "quarantined": stats.quarantined,
                "chunks_unrecoverable": node.scrubber.unrecoverable(),
                "record_count": self.records.count(),
                "hints_pending": len(node.hints),
                "repair": {
                    "rounds": node.repairer.rounds,
                    "last": repair.to_json() if repair is not None else None,
                    "bytes_pushed_total": node.repairer.totals.bytes_pushed,
                    "extra_copies_deleted_total": node.repairer.totals.extra_copies_deleted,
                    "hints_delivered_total": node.repairer.totals.hints_delivered,
                    "pushes_deferred_total": node.repairer.totals.pushes_deferred,
                },
                "scrub": asdict(node.scrubber.stats),
                "gc": {
                    "last": node.collector.last.to_json() if node.collector.last else None,
                    "chunks_collected_total": node.collector.totals.chunks_collected,
                    "bytes_collected_total": node.collector.totals.bytes_collected,
                    "tombstones_purged_total": node.collector.totals.tombstones_purged,
                },
                "overlay": overlay,
                "gossip": asdict(node.gossiper.traffic),
                # Read by the client that waits for this peer to leave: once it says
                # "done", the peer may exit.
                "leave": node.handover.read().to_json(),
            }
        )

    async def ring(self, request: web.Request) -> web.Response:
        if not self.node.gossiper.ready.is_set():
            return error_answer(503, "not_ready", "this peer is still learning the member table")
        config = self.config
        table = self.node.table
        states = table.states()
        description = api.RingDescription(
            tuple(
                api.MemberState(
                    m.peer_id,
                    m.address,
                    m.zone,
                    states[m.peer_id],
                    entry.networks if (entry := table.entry(m.peer_id)) is not None else (),
                )
                for m in table.placement()
            ),
            config.replication,
            config.write_quorum,
            config.vnodes,
            config.zone_aware,
            self.node.metadata.epoch,
        )
        return web.json_response(description.to_json())

    async def members(self, request: web.Request) -> web.Response:
        table = self.node.table
        states = table.states()
        return web.json_response(api.members_answer(table.entries(), states))

    async def gossip(self, request: web.Request) -> web.Response:
        answer = self.node.gossiper.receive(body_of(request))
        return web.Response(body=answer, content_type="application/json")

    async def leave(self, request: web.Request) -> web.Response:
        """Start handing the data over and leaving; 409 if too few peers would remain."""
        refused = self.node.leave_refused()
        if refused is not None:
            return error_answer(409, "too_few_peers", refused)
        progress = self.node.request_leave()
        return web.json_response(
            {"peer_id": self.config.peer_id, "status": "leaving", "leave": progress.to_json()},
            status=202,
        )

    async def kill(self, request: web.Request) -> web.Response:
        """Die without any cleanup, as SIGKILL would, once this answer is on its way."""
        if not self.config.admin_kill:
            return error_answer(
                403, "forbidden", "admin kill is off (start with --enable-admin-kill)"
            )
        log.warning("peer %s killed through the admin endpoint", self.config.peer_id)
        response = web.json_response({"peer_id": self.config.peer_id, "killed": True}, status=202)
        await response.prepare(request)
        await response.write_eof()
        os.kill(os.getpid(), signal.SIGKILL)
        return response

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

    def _leaving(self) -> bool:
        """From a leave request until exit (unless the hand-over gave up): this peer
        takes no new data and confirms no copy, so nothing lands here after its last
        count and no other peer drops a copy on the strength of one about to go."""
        return self.node.leaving.is_set() or self.node.handover.progress.state == "done"

    def _refuse_if_leaving(self) -> None:
        if self._leaving():
            raise Leaving(f"{self.config.peer_id} is leaving the ring: write elsewhere")

    async def put_chunk(self, request: web.Request) -> web.Response:
        self._refuse_if_leaving()
        chunk_id = self._chunk_id(request)
        hint = api.parse_hint(request.query.get("hint"))
        stored = body_of(request)
        created = await self.chunks.put(chunk_id, stored)
        if hint is not None and hint != self.config.peer_id:
            try:
                await self.node.hints.add(chunk_id, hint)
            except ValueError as exc:
                raise ProtocolError(str(exc)) from exc
        if created:
            self.metrics.chunk_bytes_written.inc(len(stored))
        return web.json_response(
            {"id": chunk_id, "created": created}, status=201 if created else 200
        )

    async def get_chunk(self, request: web.Request) -> web.Response:
        chunk_id = self._chunk_id(request)
        foreground = self.node.foreground
        foreground.enter()
        try:
            await self.node.emulate_latency()
            stored = await self.chunks.get(chunk_id)
            if stored is None:
                return error_answer(404, "not_found", f"chunk {chunk_id} is not stored here")
            await self.node.egress.acquire(len(stored))
        finally:
            foreground.leave()
        self.metrics.chunk_bytes_read.inc(len(stored))
        return web.Response(body=stored, content_type="application/octet-stream")

    async def head_chunk(self, request: web.Request) -> web.Response:
        size = self.chunks.stored_size(self._chunk_id(request))
        if size is None:
            return web.Response(status=404)
        return web.Response(status=200, headers={api.HEADER_STORED_BYTES: str(size)})

    async def chunks_exist(self, request: web.Request) -> web.Response:
        ids, with_sizes = api.parse_exists_request(body_of(request))
        held = not self._leaving()
        present = [item for item in ids if held and self.chunks.has(item)]
        answer: dict[str, Any] = {"present": present}
        if with_sizes:
            sizes = {item: self.chunks.stored_size(item) for item in present}
            answer["stored_bytes"] = {i: n for i, n in sizes.items() if n is not None}
        return web.json_response(answer)

    # -- records ------------------------------------------------------------------------

    async def list_records(self, request: web.Request) -> web.Response:
        prefix = request.query.get("prefix", "")
        limit = _int_query(request, "limit", api.LIST_LIMIT_MAX)
        if not 0 < limit <= api.LIST_LIMIT_MAX:
            raise ProtocolError(f"limit must be between 1 and {api.LIST_LIMIT_MAX}")
        if _flag_query(request, "scan"):
            # The epoch says which rounds it refuses: a peer catching up on every record
            # counts only pages of its epoch or later (``ring.settle``).
            epoch = str(self.node.metadata.epoch)
            return web.json_response(
                records_api.scan_answer(self._scan(request, prefix, limit)),
                headers={api.HEADER_EPOCH: epoch},
            )
        entries = self.records.list(prefix, limit, include_deleted=_flag_query(request, "deleted"))
        return web.json_response(
            {
                "records": [
                    {"key": key, "version": version, "deleted": self.records.is_deleted(key)}
                    for key, version in entries
                ]
            }
        )

    def _scan(self, request: web.Request, prefix: str, limit: int) -> records_api.ScanAnswer:
        after = request.query.get("after", "")
        if (
            len(after) > records_api.KEY_QUERY_CHARS_MAX
            or len(prefix) > records_api.KEY_QUERY_CHARS_MAX
        ):
            raise ProtocolError(
                f"prefix and after are at most {records_api.KEY_QUERY_CHARS_MAX} chars"
            )
        head_bytes = _int_query(request, "head", 0, records_api.SCAN_HEAD_BYTES_MAX)
        page = self.records.scan(
            prefix, limit, after=after, delimiter=_flag_query(request, "delimiter"),
            head_bytes=head_bytes,
        )  # fmt: skip
        acceptor = self.node.acceptor
        # A leaving peer refuses prepares and accepts, so its slots are as they will
        # stay; it is out of placement, so clients count them as a former holder's.
        settled = acceptor.settled()
        records = tuple(
            records_api.ScanRecord(
                r.key,
                r.version,
                "" if r.accepted is None else r.accepted.wire(),
                r.op,
                r.deleted,
                r.head,
                settled or not acceptor.needs_catch_up(r.key),
            )
            for r in page.records
        )
        return records_api.ScanAnswer(
            records, tuple(page.prefixes), page.truncated, page.last,
            acceptor.placement_digest(), settled,
        )  # fmt: skip

    async def record_versions(self, request: web.Request) -> web.Response:
        keys = [validate_key(key) for key in records_api.parse_keys_request(body_of(request))]
        held = not self._leaving()
        versions: dict[str, int] = {}
        ballots: dict[str, str] = {}
        for key in keys:
            accepted = self.records.accepted(key) if held else None
            versions[key] = self.records.version(key) if held else 0
            if accepted is not None:
                ballots[key] = accepted[0].wire()
        return web.json_response({"versions": versions, "ballots": ballots})

    def _view_query(self, request: web.Request) -> RoundView:
        view = request.query.get("view", "")
        if not 0 < len(view) <= 16 or not view.isascii() or not view.isalnum():
            raise ProtocolError("view is the 16-hex-digit digest of the key's acceptors")
        raw = request.query.get("epoch")
        epoch = None if raw is None else api.parse_int(raw, "epoch", None, api.VERSION_MAX)
        return RoundView(view, epoch)

    async def get_record(self, request: web.Request) -> web.Response:
        key = validate_key(request.match_info["key"])
        acceptor = self.node.acceptor
        view = self._view_query(request) if "view" in request.query else None
        slot = await acceptor.read(key, view)
        return web.Response(
            body=paxos.encode_slot(slot),
            content_type="application/octet-stream",
            headers={
                api.HEADER_VIEW: acceptor.digest(key),
                api.HEADER_EPOCH: str(self.node.metadata.epoch),
            },
        )

    async def prepare_record(self, request: web.Request) -> web.Response:
        self._refuse_if_leaving()
        key = validate_key(request.match_info["key"])
        ballot = Ballot.parse(request.query.get("ballot"))
        outcome = await self.node.acceptor.prepare(key, ballot, self._view_query(request))
        if isinstance(outcome, Preempted):
            return preempted_answer(key, outcome)
        return web.Response(
            body=paxos.encode_slot(outcome), content_type="application/octet-stream"
        )

    async def accept_record(self, request: web.Request) -> web.Response:
        self._refuse_if_leaving()
        key = validate_key(request.match_info["key"])
        ballot = Ballot.parse(request.query.get("ballot"))
        following = request.query.get("next")
        proposal, _meta = paxos.decode_slot(body_of(request), api.RECORD_BYTES_MAX)
        outcome = await self.node.acceptor.accept(
            key,
            ballot,
            proposal.value,
            None if following is None else Ballot.parse(following, "next"),
            self._view_query(request),
        )
        if isinstance(outcome, Preempted):
            return preempted_answer(key, outcome)
        return web.json_response({"key": key, "accepted": ballot.wire()})

    async def referenced_chunks(self, _request: web.Request) -> web.Response:
        refs = self.records.referenced()
        if len(refs) > api.REFS_ANSWER_MAX:
            raise ProtocolError(f"more than {api.REFS_ANSWER_MAX} referenced chunks to list")
        return web.Response(
            body=api.refs_body(refs),
            content_type="application/octet-stream",
        )


def _int_query(
    request: web.Request, name: str, default: int | None, maximum: int = api.QUERY_INT_MAX
) -> int:
    return api.parse_int(request.query.get(name), name, default, maximum)


def _flag_query(request: web.Request, name: str) -> bool:
    return api.parse_flag(request.query.get(name), name)


def build_app(node: Node, extensions: Sequence[AppExtension] = ()) -> web.Application:
    """The HTTP application of an opened ``Node``, with the routes ``extensions`` add."""
    peer = Peer(node)
    app = web.Application(middlewares=[peer.guard], client_max_size=api.REQUEST_BYTES_MAX)
    routes: dict[Route, Handler] = {
        api.HEALTH: peer.health,
        api.INFO: peer.info,
        api.RING: peer.ring,
        api.MEMBERS: peer.members,
        api.GOSSIP: peer.gossip,
        api.ADMIN_LEAVE: peer.leave,
        api.ADMIN_KILL: peer.kill,
        api.METRICS: peer.metrics_text,
        api.CHUNK_PUT: peer.put_chunk,
        api.CHUNK_GET: peer.get_chunk,
        api.CHUNK_HEAD: peer.head_chunk,
        api.CHUNKS_EXIST: peer.chunks_exist,
        api.RECORDS_LIST: peer.list_records,
        api.RECORD_VERSIONS: peer.record_versions,
        api.RECORD_GET: peer.get_record,
        api.PAXOS_PREPARE: peer.prepare_record,
        api.PAXOS_ACCEPT: peer.accept_record,
        api.REFS: peer.referenced_chunks,
        **cluster_routes(node.metadata, node.steward),
    }
    for route, handler in routes.items():
        if route.method == "GET":
            # GET routes answer HEAD too, unless HEAD has a handler of its own.
            has_head = Route("HEAD", route.pattern) in routes
            app.router.add_get(route.pattern, handler, allow_head=not has_head)
        else:
            app.router.add_route(route.method, route.pattern, handler)
    for extension in extensions:
        extension(app, node)
    return app


def runner_options() -> dict[str, Any]:
    """Bounds on the HTTP parser: request line, header sizes and count."""
    return {
        "max_line_size": api.HEADER_LINE_BYTES_MAX,
        "max_field_size": api.HEADER_LINE_BYTES_MAX,
        "max_headers": api.HEADERS_MAX,
    }
