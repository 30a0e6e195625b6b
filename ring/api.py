"""The peer's wire contract, written once: every route, header, limit and body shape.

The peer routes with these ``Route`` patterns, and every caller (the client, repair,
chunk collection, gossip, the scrubber, the recovery relay and executor) builds its paths
and bodies and reads the answers with the functions here. Nothing in this module touches
a socket: bytes and values in, bytes and values out, so the contract is tested without a
network (``tests/test_api.py``).

    GET    /v1/health                     liveness, unauthenticated
    GET    /v1/info                       peer id, address, zone, stored bytes, chunk count
    GET    /v1/ring                       placement members with their state, R, W and vnodes
    GET    /v1/members                    the whole member table with each peer's liveness
    POST   /v1/gossip                     {"members": [...]} -> our table (heartbeats)
    POST   /v1/admin/leave                start leaving the ring (hand data over, then exit)
                                          -> {"leave": progress}; 409 if fewer than R
                                          peers would remain
    POST   /v1/admin/kill                 exit at once like SIGKILL (drills on a running ring;
                                          403 unless the peer runs with --enable-admin-kill)
    PUT    /v1/chunks/{id}[?hint=PEER]    store a chunk (body: stored form, see ring.codec);
                                          with a hint, on behalf of an unreachable PEER
    GET    /v1/chunks/{id}                a chunk's stored form, verified before it is sent
    HEAD   /v1/chunks/{id}                200 if present (X-SR3-Stored-Bytes), 404 if not
    POST   /v1/chunks/exists              {"ids": [...]} -> {"present": [...]}; with
                                          "sizes": true also {"stored_bytes": {id: n}}
    GET    /v1/records?prefix=P&limit=N[&deleted=1]   record keys and versions (and tombstones)
    GET    /v1/records?prefix=P&limit=N&scan=1[&after=K][&delimiter=1][&head=H]
                                          a scan: each record's accepted ballot, value
                                          identity and first H bytes, keys rolled up at
                                          "/" with a delimiter (``scan_answer``)
    GET    /v1/records/{key}[?view=D[&epoch=E]]   this peer's slot for the key
                                          (``ring.paxos`` encoding); X-SR3-View names the
                                          acceptors it computes, X-SR3-Epoch its
                                          configuration epoch. With ``view``: for a round
                                          (409 "view" if they differ, 409 "epoch" with
                                          ``epoch`` if the epochs do, 503 "syncing")
    POST   /v1/records/versions           {"keys": [...]} -> {"versions": {key: n},
                                          "ballots": {key: accepted ballot}}
    POST   /v1/paxos/prepare/{key}?ballot=B&view=D&epoch=E    promise B -> the slot;
                                          409 "preempted" with the ballot promised
                                          instead (409 "view" and "epoch" as above)
    POST   /v1/paxos/accept/{key}?ballot=B[&next=B2]&view=D&epoch=E   accept the value
                                          in the body (a slot encoding) at B, promising B2
    GET    /v1/refs                       chunk ids live records here reference (16 B each)
    GET    /v1/cluster, POST /v1/cluster/learn|prepare|accept, GET /v1/cluster/suspects
                                          the configuration, decided by the voters
                                          (bodies in ``ring.cluster``)
    POST   /v1/recovery/stream            a recovery plan -> framed chunk stream
                                          (installed by ``recovery.relay``)
    PUT|GET|DELETE /v1/fs/files/{path}, GET /v1/fs/stat|list/{path},
    POST /v1/fs/rename, POST /v1/fs/mkdirs/{path}   the sr3:// file namespace
                                          (``ring.fs_api``; installed by
                                          ``filesystem.service``)
    GET    /metrics                       Prometheus text (signed, or the metrics bearer token)

Errors are JSON ``{"error": code, "message": text}`` (``error_body``/``parse_error``),
with ``promised`` (a ballot) on a 409 "preempted". Records are changed only by consensus
rounds (``ring.paxos``): prepare and accept on the key's acceptors, never a write to one
replica.

Every number taken from the wire is ASCII digits with an explicit maximum
(``parse_ascii_int``; record versions at most ``VERSION_MAX``), and every JSON body or
answer is read with ``load_json``: bounded in size and nesting before it is parsed, with
numbers of bounded length and no NaN or Infinity. Malformed input is a ``ProtocolError``
(a 400), never an error the peer does not expect.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ring import codec
from ring.cluster import INTERNAL_NETWORK, check_networks
from ring.errors import ProtocolError
from ring.membership import MEMBERS_MAX, Entry
from ring.parse import (
    JSON_BYTES_MAX,
    JSON_DEPTH_MAX,
    JSON_INT_MAX,
    QUERY_INT_MAX,
    check_target,
    json_int,
    load_json,
    parse_ascii_int,
    parse_flag,
    parse_int,
    parse_json_object,
)

__all__ = [
    "ADMIN_KILL",
    "ADMIN_LEAVE",
    "ANY_TARGET_ROUTES",
    "CHUNKS_EXIST",
    "CLUSTER",
    "CLUSTER_ACCEPT",
    "CLUSTER_LEARN",
    "CLUSTER_PREPARE",
    "CLUSTER_SUSPECTS",
    "CHUNK_GET",
    "CHUNK_HEAD",
    "CHUNK_PUT",
    "CONTENT_TYPE_FRAMES",
    "EXISTS_IDS_MAX",
    "FS_DELETE",
    "FS_LIST",
    "FS_MKDIRS",
    "FS_READ",
    "FS_RENAME",
    "FS_USAGE",
    "FS_STAT",
    "FS_WRITE",
    "GOSSIP",
    "HEADERS_MAX",
    "HEADER_AUTHORIZATION",
    "HEADER_CONTENT_BLAKE3",
    "HEADER_CONTENT_SHA256",
    "HEADER_CREDENTIAL",
    "HEADER_EPOCH",
    "HEADER_FILE_SIZE",
    "HEADER_FILE_TAG",
    "HEADER_LINE_BYTES_MAX",
    "HEADER_MTIME_MS",
    "HEADER_NONCE",
    "HEADER_REFS",
    "HEADER_STORED_BYTES",
    "HEADER_TARGET",
    "HEADER_TIMESTAMP",
    "HEADER_VERSION",
    "HEALTH",
    "INFO",
    "JSON_BYTES_MAX",
    "JSON_DEPTH_MAX",
    "LEAVE_STATES",
    "LIST_LIMIT_MAX",
    "MEMBERS",
    "METRICS",
    "PAXOS_ACCEPT",
    "PAXOS_PREPARE",
    "QUERY_INT_MAX",
    "RECORDS_LIST",
    "RECORD_BYTES_MAX",
    "RECORD_GET",
    "RECORD_VERSIONS",
    "RECOVERY_STREAM",
    "REFS",
    "REFS_ANSWER_MAX",
    "REFS_MAX",
    "REF_BYTES",
    "REQUEST_BYTES_MAX",
    "RING",
    "VERSION_MAX",
    "ErrorBody",
    "InfoSummary",
    "LeaveProgress",
    "MemberState",
    "RingDescription",
    "Route",
    "chunk_path",
    "error_body",
    "exists_request",
    "check_target",
    "json_int",
    "load_json",
    "member_table_body",
    "members_answer",
    "parse_ascii_int",
    "parse_cluster_epoch",
    "parse_error",
    "parse_exists_answer",
    "parse_exists_request",
    "parse_flag",
    "parse_hint",
    "parse_info",
    "parse_int",
    "parse_json_object",
    "parse_leave_progress",
    "parse_member_table",
    "parse_members_answer",
    "parse_refs",
    "refs_body",
]


@dataclass(frozen=True, slots=True)
class Route:
    """One route: its method and its path pattern (aiohttp's ``{name}`` syntax)."""

    method: str
    pattern: str


HEALTH = Route("GET", "/v1/health")
INFO = Route("GET", "/v1/info")
RING = Route("GET", "/v1/ring")
MEMBERS = Route("GET", "/v1/members")
GOSSIP = Route("POST", "/v1/gossip")
ADMIN_LEAVE = Route("POST", "/v1/admin/leave")
ADMIN_KILL = Route("POST", "/v1/admin/kill")
METRICS = Route("GET", "/metrics")
CHUNK_PUT = Route("PUT", "/v1/chunks/{chunk_id}")
CHUNK_GET = Route("GET", "/v1/chunks/{chunk_id}")
CHUNK_HEAD = Route("HEAD", "/v1/chunks/{chunk_id}")
CHUNKS_EXIST = Route("POST", "/v1/chunks/exists")
RECORDS_LIST = Route("GET", "/v1/records")
RECORD_VERSIONS = Route("POST", "/v1/records/versions")
RECORD_GET = Route("GET", "/v1/records/{key:.+}")
PAXOS_PREPARE = Route("POST", "/v1/paxos/prepare/{key:.+}")
PAXOS_ACCEPT = Route("POST", "/v1/paxos/accept/{key:.+}")
REFS = Route("GET", "/v1/refs")
# Cluster metadata (``ring.cluster``): the configuration and its consensus rounds.
CLUSTER = Route("GET", "/v1/cluster")
CLUSTER_LEARN = Route("POST", "/v1/cluster/learn")
CLUSTER_PREPARE = Route("POST", "/v1/cluster/prepare")
CLUSTER_ACCEPT = Route("POST", "/v1/cluster/accept")
CLUSTER_SUSPECTS = Route("GET", "/v1/cluster/suspects")
RECOVERY_STREAM = Route("POST", "/v1/recovery/stream")
# The sr3:// file namespace (paths, bodies and answers in ``ring.fs_api``).
FS_WRITE = Route("PUT", "/v1/fs/files/{path:.*}")
FS_READ = Route("GET", "/v1/fs/files/{path:.*}")
FS_DELETE = Route("DELETE", "/v1/fs/files/{path:.*}")
FS_STAT = Route("GET", "/v1/fs/stat/{path:.*}")
FS_LIST = Route("GET", "/v1/fs/list/{path:.*}")
FS_RENAME = Route("POST", "/v1/fs/rename")
FS_MKDIRS = Route("POST", "/v1/fs/mkdirs/{path:.*}")
FS_USAGE = Route("GET", "/v1/fs/usage/{path:.*}")

# Routes a request may reach with the target "*": a client asks a seed for the member
# table before it knows the seed's advertised address, and a joining peer gossips with
# overlay contacts it knows only by IP, asks a seed for the configuration and tells such
# a contact the configuration it missed. All are idempotent and change no stored data (a
# peer learns only configurations newer than its own, of its own cluster).
ANY_TARGET_ROUTES = frozenset({RING, GOSSIP, CLUSTER, CLUSTER_LEARN})

# Request signing (``ring.auth``).
HEADER_AUTHORIZATION = "Authorization"
HEADER_TIMESTAMP = "X-SR3-Timestamp"
HEADER_NONCE = "X-SR3-Nonce"
HEADER_CONTENT_SHA256 = "X-SR3-Content-SHA256"
HEADER_CONTENT_BLAKE3 = "X-SR3-Content-BLAKE3"
HEADER_TARGET = "X-SR3-Target"
# Answers.
HEADER_VERSION = "X-SR3-Version"
HEADER_REFS = "X-SR3-Refs"
HEADER_STORED_BYTES = "X-SR3-Stored-Bytes"
HEADER_VIEW = "X-SR3-View"
# The configuration epoch the answering peer is at (record slots it serves).
HEADER_EPOCH = "X-SR3-Epoch"
# A scoped credential's claims (``ring.auth``); a file's size and time (``ring.fs_api``).
HEADER_CREDENTIAL = "X-SR3-Credential"
HEADER_FILE_SIZE = "X-SR3-File-Size"
HEADER_MTIME_MS = "X-SR3-Mtime-Ms"
HEADER_FILE_TAG = "X-SR3-File-Tag"
CONTENT_TYPE_FRAMES = "application/x-sr3-frames"

# Limits both sides hold to.
EXISTS_IDS_MAX = 10_000
LIST_LIMIT_MAX = 10_000
RECORD_BYTES_MAX = 4 * 1024 * 1024
REFS_MAX = 65_536
REF_BYTES = 16
# Chunk ids one ``GET /v1/refs`` answer may list.
REFS_ANSWER_MAX = 4 * 1024 * 1024
REQUEST_BYTES_MAX = max(codec.STORED_BYTES_MAX, RECORD_BYTES_MAX + REFS_MAX * REF_BYTES)
HEADER_LINE_BYTES_MAX = 8190
HEADERS_MAX = 64
# A hinted write's peer id, in bytes of UTF-8.
HINT_BYTES_MAX = 128
# Record versions (and member epochs and heartbeats) stay below 2**53, so every JSON
# reader (Java, JavaScript) holds them exactly and a version a replica stores can always
# be named as the expected version of the next write.
VERSION_MAX = JSON_INT_MAX


def _quote(text: str) -> str:
    return quote(text, safe="")


# -- paths ------------------------------------------------------------------------------


def chunk_path(chunk_id: str, *, hint: str | None = None) -> str:
    """``/v1/chunks/{id}``; with ``hint``, stored on behalf of that unreachable peer."""
    path = f"/v1/chunks/{chunk_id}"
    return path if hint is None else f"{path}?hint={_quote(hint)}"


# -- query parameters (peer side) -------------------------------------------------------


def parse_hint(raw: str | None) -> str | None:
    """The peer id a hinted chunk write names (``?hint=PEER``): printable, at most
    ``HINT_BYTES_MAX`` bytes of UTF-8 (it becomes part of a file name)."""
    if raw is None:
        return None
    if not raw.isprintable() or not 0 < len(raw.encode()) <= HINT_BYTES_MAX:
        raise ProtocolError(f"a hint is a peer id of 1 to {HINT_BYTES_MAX} printable bytes")
    return raw


# -- errors -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ErrorBody:
    code: str
    message: str
    # A 409's current version, or a deleted record's tombstone version; 0 otherwise.
    version: int = 0


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": code, "message": message, **extra}


def parse_error(body: bytes) -> ErrorBody:
    """An error answer's code, message and version; a body that is not ours reads as
    code "error" with its first 200 bytes as the message."""
    code, message = "error", body[:200].decode("utf-8", "replace")
    version = 0
    try:
        parsed = load_json(body)
        code, message = str(parsed.get("error", code)), str(parsed.get("message", message))
        version = json_int(parsed.get("version", parsed.get("current_version", 0)), "version")
    except (ProtocolError, AttributeError, TypeError, ValueError):
        pass
    return ErrorBody(code, message, version)


# -- chunks -----------------------------------------------------------------------------


def exists_request(ids: Sequence[str], *, sizes: bool = False) -> bytes:
    """The body of ``POST /v1/chunks/exists`` (at most ``EXISTS_IDS_MAX`` ids)."""
    if len(ids) > EXISTS_IDS_MAX:
        raise ProtocolError(f"at most {EXISTS_IDS_MAX} ids per exists query")
    query: dict[str, Any] = {"ids": list(ids)}
    if sizes:
        query["sizes"] = True
    return codec.compact_json(query)


def parse_exists_request(body: bytes) -> tuple[list[str], bool]:
    """The ids asked about and whether their sizes are wanted."""
    query = parse_json_object(body)
    ids = query.get("ids")
    if not isinstance(ids, list) or len(ids) > EXISTS_IDS_MAX:
        raise ProtocolError(f"'ids' must be a list of at most {EXISTS_IDS_MAX} chunk ids")
    if not all(isinstance(item, str) and codec.is_chunk_id(item) for item in ids):
        raise ProtocolError("every id must be 32 lowercase hex digits")
    return ids, query.get("sizes") is True


def parse_exists_answer(answer: Any) -> dict[str, int]:
    """Chunk id -> stored bytes (0 when the answer gave no sizes) of the ids present."""
    try:
        present = [str(item) for item in answer["present"]]
        sizes: Mapping[str, Any] = answer.get("stored_bytes") or {}
        return {chunk_id: json_int(sizes.get(chunk_id, 0), "stored_bytes") for chunk_id in present}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed exists answer: {exc!r}") from exc


def refs_body(refs: Iterable[str]) -> bytes:
    """``GET /v1/refs``: the referenced chunk ids, 16 raw bytes each, sorted."""
    return b"".join(bytes.fromhex(ref) for ref in sorted(refs))


def parse_refs(body: bytes) -> set[str]:
    if len(body) % REF_BYTES:
        raise ProtocolError(f"a refs answer is a whole number of {REF_BYTES}-byte ids")
    return {body[offset : offset + REF_BYTES].hex() for offset in range(0, len(body), REF_BYTES)}


# -- ring and members -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemberState:
    peer_id: str
    address: str
    zone: str
    # up / down as the answering peer sees it
    state: str
    # The member's addresses on other networks, by name (``ring.cluster.check_networks``).
    networks: tuple[tuple[str, str], ...] = ()

    def address_on(self, network: str) -> str | None:
        """Its address on ``network`` (the peers' own: ``INTERNAL_NETWORK``), if any."""
        if network == INTERNAL_NETWORK:
            return self.address
        return dict(self.networks).get(network)


@dataclass(frozen=True, slots=True)
class RingDescription:
    """``GET /v1/ring``: the placement members, R, W and the placement settings."""

    members: tuple[MemberState, ...]
    replication: int
    write_quorum: int
    vnodes: int
    zone_aware: bool
    # The configuration epoch the members are of (0: a peer before epochs).
    epoch: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "members": [
                {
                    "peer_id": m.peer_id,
                    "address": m.address,
                    "zone": m.zone,
                    "state": m.state,
                    **({"networks": dict(m.networks)} if m.networks else {}),
                }
                for m in self.members
            ],
            "replication": self.replication,
            "write_quorum": self.write_quorum,
            "vnodes": self.vnodes,
            "zone_aware": self.zone_aware,
            "epoch": self.epoch,
        }

    @classmethod
    def from_json(cls, answer: Any) -> RingDescription:
        try:
            members = tuple(
                MemberState(
                    str(m["peer_id"]),
                    str(m["address"]),
                    str(m.get("zone", "")),
                    str(m.get("state", "up")),
                    check_networks(m.get("networks", {})),
                )
                for m in answer["members"]
            )
            return cls(
                members,
                json_int(answer["replication"], "replication"),
                json_int(answer["write_quorum"], "write_quorum"),
                json_int(answer["vnodes"], "vnodes"),
                bool(answer["zone_aware"]),
                json_int(answer.get("epoch", 0), "epoch", VERSION_MAX),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"malformed ring description: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class InfoSummary:
    """What ``sr3 status`` reads of ``GET /v1/info`` (the answer holds more, for people)."""

    stored_bytes: int
    chunk_count: int
    record_count: int
    epoch: int | None
    hints_pending: int | None
    repair_rounds: int | None
    chunks_under_replicated: int | None
    chunks_lost: int | None
    # Chunks the peer found corrupt that no member had a good copy of.
    chunks_unrecoverable: tuple[str, ...] = ()
    # Free space on the peer's data disk (None: a peer that does not say).
    disk_free_bytes: int | None = None


def _optional_int(value: Any) -> int | None:
    return None if value is None else json_int(value, "a count")


def parse_info(answer: Any) -> InfoSummary:
    try:
        repair = answer.get("repair") or {}
        last = repair.get("last") or {}
        return InfoSummary(
            json_int(answer["stored_bytes"], "stored_bytes"),
            json_int(answer["chunk_count"], "chunk_count"),
            json_int(answer["record_count"], "record_count"),
            _optional_int(answer.get("epoch")),
            _optional_int(answer.get("hints_pending")),
            _optional_int(repair.get("rounds")),
            _optional_int(last.get("chunks_under_replicated")),
            _optional_int(last.get("chunks_lost")),
            _chunk_ids(answer.get("chunks_unrecoverable") or []),
            disk_free_bytes=_optional_int(answer.get("disk_free_bytes")),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed peer info: {exc!r}") from exc


def _chunk_ids(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > EXISTS_IDS_MAX:
        raise ValueError(f"a list of at most {EXISTS_IDS_MAX} chunk ids")
    if not all(isinstance(item, str) and codec.is_chunk_id(item) for item in value):
        raise ValueError("chunk ids are 32 lowercase hex digits")
    return tuple(value)


def member_table_body(entries: Iterable[Entry], cluster_epoch: int = 0) -> dict[str, Any]:
    """``POST /v1/gossip`` both ways (and a peer's saved ``members.json``), with the
    configuration epoch the sender is at."""
    return {"members": [entry.to_json() for entry in entries], "cluster_epoch": cluster_epoch}


def parse_cluster_epoch(data: Any) -> int:
    """The configuration epoch a gossip body names (0: none, or a peer before epochs)."""
    epoch = data.get("cluster_epoch", 0) if isinstance(data, dict) else 0
    return json_int(epoch, "cluster_epoch", VERSION_MAX)


def parse_member_table(data: Any) -> list[Entry]:
    members = data.get("members") if isinstance(data, dict) else None
    if not isinstance(members, list) or len(members) > MEMBERS_MAX:
        raise ProtocolError(f"'members' must be a list of at most {MEMBERS_MAX} entries")
    return [Entry.from_json(item) for item in members]


def members_answer(entries: Iterable[Entry], states: Mapping[str, str]) -> dict[str, Any]:
    """``GET /v1/members``: every entry with the answering peer's view of its state."""
    return {"members": [{**entry.to_json(), "state": states[entry.peer_id]} for entry in entries]}


def parse_members_answer(answer: Any) -> list[dict[str, Any]]:
    """``GET /v1/members``: the member table's entries, each with its ``state``."""
    try:
        members = answer["members"]
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"malformed member table: {exc!r}") from exc
    if not isinstance(members, list) or not all(isinstance(m, dict) for m in members):
        raise ProtocolError("malformed member table: 'members' is not a list of objects")
    return members


# -- leaving ----------------------------------------------------------------------------

# idle: not leaving; handing_over: out of placement, handing its data over; done: every
# chunk and record it held is on R peers without it (it then announces ``left`` and
# exits); failed: the hand-over did not finish in time (it is back ``up``, data kept).
LEAVE_STATES = ("idle", "handing_over", "done", "failed")
_LEAVE_COUNTS = (
    "chunks_moved", "bytes_moved", "records_moved",
    "chunks_remaining", "bytes_remaining", "records_remaining",
)  # fmt: skip
_LEAVE_MESSAGE_CHARS_MAX = 500


@dataclass(frozen=True, slots=True)
class LeaveProgress:
    """A peer's hand-over when it leaves: ``"leave"`` in the answers of
    ``POST /v1/admin/leave`` and ``GET /v1/info``. Moved: handed over and on R peers
    without it; remaining: what it still holds."""

    state: str = "idle"
    chunks_moved: int = 0
    bytes_moved: int = 0
    records_moved: int = 0
    chunks_remaining: int = 0
    bytes_remaining: int = 0
    records_remaining: int = 0
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ("state", *_LEAVE_COUNTS, "message")}


def _leave_count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"leave progress: {name} must be a non-negative integer")
    return value


def parse_leave_progress(answer: Any) -> LeaveProgress:
    """The ``"leave"`` object of a leave or info answer."""
    try:
        body = answer["leave"]
        state, message = body["state"], body.get("message", "")
        counts = {name: _leave_count(body.get(name, 0), name) for name in _LEAVE_COUNTS}
    except (KeyError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"malformed leave progress: {exc!r}") from exc
    if state not in LEAVE_STATES or not isinstance(message, str):
        raise ProtocolError(f"malformed leave progress: state {str(state)[:40]!r}")
    return LeaveProgress(state, message=message[:_LEAVE_MESSAGE_CHARS_MAX], **counts)
