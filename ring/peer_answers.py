"""How a peer answers an error: the HTTP status and JSON body each kind of failure gets
(``translate``), and whether a failure was the client hanging up (``client_gone``),
which is counted under ``CLIENT_CLOSED``, never as a server error; and how it reads a
large body (``read_body``)."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from ring import api
from ring.consensus import EpochMismatch, Syncing, ViewMismatch
from ring.errors import (
    ChunkCorrupt,
    ChunkTooLarge,
    ProtocolError,
    RecordConflict,
    SR3Error,
    StorageFull,
)
from ring.paxos import Preempted

__all__ = [
    "BODY", "CLIENT_CLOSED", "Leaving", "body_of", "client_gone", "error_answer",
    "preempted_answer", "read_body", "translate",
]  # fmt: skip

log = logging.getLogger("ring.peer")


# The status a request whose client went away is counted under (nginx's "client closed
# request"); never sent, since nobody is there to read it.
CLIENT_CLOSED = 499


def error_answer(status: int, code: str, message: str, **extra: Any) -> web.Response:
    return web.json_response(api.error_body(code, message, **extra), status=status)


class Leaving(SR3Error):
    """A write reached a peer that is leaving the ring (503: try another replica)."""


def preempted_answer(key: str, refusal: Preempted) -> web.Response:
    message = f"record {key!r}: ballot {refusal.promised.wire()} was promised here"
    return error_answer(409, "preempted", message, promised=refusal.promised.wire())


def translate(exc: Exception) -> web.Response:
    """Map an exception raised while handling a request to its HTTP answer."""
    if isinstance(exc, Leaving):
        return error_answer(503, "leaving", str(exc))
    if isinstance(exc, ViewMismatch):
        return error_answer(409, "view", str(exc))
    if isinstance(exc, EpochMismatch):
        return error_answer(409, "epoch", str(exc), epoch=exc.epoch)
    if isinstance(exc, Syncing):
        return error_answer(503, "syncing", str(exc))
    if isinstance(exc, RecordConflict):
        return error_answer(409, "version_conflict", str(exc), current_version=exc.current)
    if isinstance(exc, ChunkTooLarge):
        return error_answer(413, "chunk_too_large", str(exc))
    if isinstance(exc, ChunkCorrupt):
        return error_answer(422, "chunk_corrupt", str(exc))
    if isinstance(exc, StorageFull):
        return error_answer(507, "storage_full", str(exc))
    if isinstance(exc, ProtocolError):
        return error_answer(400, "bad_request", str(exc))
    if isinstance(exc, SR3Error):
        return error_answer(500, "internal", str(exc))
    log.exception("unexpected error while handling a request", exc_info=exc)
    return error_answer(500, "internal", f"{type(exc).__name__}")


def client_gone(request: web.Request, exc: Exception) -> bool:
    """Whether ``exc`` came from the client hanging up (its connection lost while the
    peer read its body or wrote the answer), not from the peer."""
    transport = request.transport
    return isinstance(exc, ConnectionError) and (transport is None or transport.is_closing())


# Where a handler finds the body the peer's guard read (``read_body``) and checked
# against the request's signature: every route's but those that stream theirs.
BODY = "sr3.body"


def body_of(request: web.Request) -> bytes:
    """The body the guard read and checked (empty: none was sent)."""
    body: bytes | None = request[BODY]
    return body or b""


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body of ``request``, at most ``limit`` bytes (413 beyond; a declared
    length over it is refused before any of the body is read), copied once: the pieces
    as the network delivers them, joined at the end. ``request.read()`` grows a buffer
    piece by piece and copies it again at the end, and a buffer of the declared length
    would be zeroed first: for a chunk, passes over every byte on each of R replicas."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=declared)
    content = request.content
    content.set_read_chunk_size(min(declared or limit, limit))
    pieces: list[bytes] = []
    size = 0
    while not content.at_eof():
        piece, _ = await content.readchunk()
        size += len(piece)
        if size > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
        pieces.append(piece)
    if declared is not None and size != declared:
        # The parser frames the body by its declared length; a short one means the
        # connection ended first.
        raise ConnectionResetError(f"the body ended after {size} of {declared} bytes")
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)
