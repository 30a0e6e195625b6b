"""The recovery stream wire format: frames in, frames out. Pure, no I/O.

A recovery stream (the body of a ``POST /v1/recovery/stream`` answer) is a sequence of
frames, each a 21-byte header followed by its payload::

    offset size field
    0      1    kind: 1 = chunk, 2 = missing, 3 = end, 4 = rerouted
    1      16   chunk id (xxh3-128, big endian digest; zero in an end frame)
    17     4    payload length (unsigned, big endian)
    21     n    payload

* **chunk**: the payload is the chunk's stored form (``ring.codec``), at most
  ``ring.codec.STORED_BYTES_MAX`` bytes.
* **missing**: the sender could not get the chunk from anyone; the payload is a short
  UTF-8 reason.
* **end**: the stream is complete (payload empty). A stream that stops without an end
  frame is broken, whatever the transport said.
* **rerouted**: a notice that the named chunk (sent in its own chunk or missing frame)
  came around a holder that could not serve it; the payload is the UTF-8 id of that
  holder when it failed, empty when it was alive but lacked the chunk or held a corrupt
  copy. The requester reports these in ``RecoveryResult``.

``FrameParser`` is incremental (feed it bytes as they arrive, get whole frames back) and
bounded: it never buffers more than one frame plus the piece it was fed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ring.codec import STORED_BYTES_MAX
from ring.errors import ProtocolError

__all__ = [
    "FRAME_HEADER_BYTES",
    "KIND_CHUNK",
    "KIND_END",
    "KIND_MISSING",
    "KIND_REROUTED",
    "NOTE_BYTES_MAX",
    "Frame",
    "FrameParser",
    "chunk_frame",
    "encode",
    "end_frame",
    "missing_frame",
    "rerouted_frame",
]

KIND_CHUNK = 1
KIND_MISSING = 2
KIND_END = 3
KIND_REROUTED = 4
_HEADER = struct.Struct(">B16sI")
FRAME_HEADER_BYTES = _HEADER.size  # 21
# Reasons and peer ids are short; a longer text is cut, a longer payload refused.
NOTE_BYTES_MAX = 1024
_NO_CHUNK = "0" * 32
_PAYLOAD_BYTES_MAX = {
    KIND_CHUNK: STORED_BYTES_MAX,
    KIND_MISSING: NOTE_BYTES_MAX,
    KIND_END: 0,
    KIND_REROUTED: NOTE_BYTES_MAX,
}


@dataclass(frozen=True, slots=True)
class Frame:
    kind: int
    chunk_id: str
    payload: bytes = b""

    @property
    def note(self) -> str:
        """The payload of a missing or rerouted frame, as text."""
        return self.payload.decode("utf-8", "replace")


def chunk_frame(chunk_id: str, stored: bytes) -> Frame:
    return Frame(KIND_CHUNK, chunk_id, stored)


def missing_frame(chunk_id: str, reason: str) -> Frame:
    return Frame(KIND_MISSING, chunk_id, _note(reason))


def rerouted_frame(chunk_id: str, failed_holder: str) -> Frame:
    return Frame(KIND_REROUTED, chunk_id, _note(failed_holder))


def end_frame() -> Frame:
    return Frame(KIND_END, _NO_CHUNK)


def _note(text: str) -> bytes:
    return text.encode("utf-8")[:NOTE_BYTES_MAX]


def encode(frame: Frame) -> tuple[bytes, bytes]:
    """``(header, payload)`` of a frame; written one after the other, without a copy."""
    limit = _PAYLOAD_BYTES_MAX.get(frame.kind)
    if limit is None or len(frame.payload) > limit:
        raise ValueError(f"frame of kind {frame.kind} with {len(frame.payload)} payload bytes")
    header = _HEADER.pack(frame.kind, bytes.fromhex(frame.chunk_id), len(frame.payload))
    return header, frame.payload


class FrameParser:
    """Bytes in, frames out. Raises ``ProtocolError`` on an unknown kind, a payload above
    its kind's limit, or bytes after the end frame.

    A payload is gathered as views of the pieces fed and joined once when complete (a
    piece that holds a whole payload is used as it is): a 296 MiB restore spent a fifth
    of its client CPU copying each piece into a buffer and then out of it again."""

    def __init__(self) -> None:
        self._head = bytearray()  # a header's bytes until all of them have come
        self._header: tuple[int, str, int] | None = None
        self._pieces: list[memoryview] = []  # the current payload's bytes so far
        self._have = 0
        self.ended = False

    @property
    def buffered_bytes(self) -> int:
        return len(self._head) + self._have

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        if self.ended and data:
            raise ProtocolError("bytes after the end of a recovery stream")
        # Views are kept of immutable bytes only: a view of the caller's bytearray would
        # pin it and see its later changes, so anything else is copied.
        if not isinstance(data, bytes | memoryview) or (
            isinstance(data, memoryview) and not isinstance(data.obj, bytes)
        ):
            data = bytes(data)
        view = memoryview(data).cast("B")
        frames: list[Frame] = []
        while not self.ended:
            if self._header is None:
                take = min(FRAME_HEADER_BYTES - len(self._head), len(view))
                self._head += view[:take]
                view = view[take:]
                if len(self._head) < FRAME_HEADER_BYTES:
                    break
                self._header = _parse_header(self._head)
                self._head.clear()
            kind, chunk_id, length = self._header
            take = min(length - self._have, len(view))
            if take:
                self._pieces.append(view[:take])
                self._have += take
                view = view[take:]
            if self._have < length:
                break
            frames.append(Frame(kind, chunk_id, self._payload()))
            self._header = None
            self.ended = kind == KIND_END
        if len(view):
            raise ProtocolError("bytes after the end of a recovery stream")
        return frames

    def _payload(self) -> bytes:
        pieces, self._pieces, self._have = self._pieces, [], 0
        if len(pieces) == 1:
            whole = pieces[0].obj
            if isinstance(whole, bytes) and len(whole) == pieces[0].nbytes:
                return whole
        return b"".join(pieces)


def _parse_header(buffer: bytearray) -> tuple[int, str, int]:
    kind, digest, length = _HEADER.unpack_from(buffer)
    limit = _PAYLOAD_BYTES_MAX.get(kind)
    if limit is None:
        raise ProtocolError(f"unknown recovery frame kind {kind}")
    if length > limit:
        raise ProtocolError(f"recovery frame of kind {kind} claims {length} bytes, above {limit}")
    return kind, digest.hex(), length
