"""The wire contract of records: the paths of consensus rounds and listings, the bodies
of versions, envelopes and scans, with pure builders and parsers (``ring.api`` has the
routes, headers and limits every layer shares; ``ring.cluster`` the configuration's).

    GET    /v1/records/{key}[?view=D[&epoch=E]]   a slot (``ring.paxos`` encoding)
    POST   /v1/paxos/prepare|accept/{key}?ballot=B&view=D&epoch=E[&next=B2]
    GET    /v1/records?prefix=P&limit=N[&deleted=1] | [&scan=1...]   listings and scans
    POST   /v1/records/versions             {"keys": [...]} -> versions and ballots

Nothing here touches a socket; malformed input is a ``ProtocolError``.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ring import codec
from ring.api import (
    LIST_LIMIT_MAX,
    PAXOS_ACCEPT,
    PAXOS_PREPARE,
    RECORD_GET,
    RECORDS_LIST,
    REF_BYTES,
    REFS_MAX,
    VERSION_MAX,
    Route,
)
from ring.errors import ProtocolError
from ring.parse import json_int, parse_json_object

__all__ = [
    "KEY_QUERY_CHARS_MAX",
    "SCAN_HEAD_BYTES_MAX",
    "SCAN_VISITS_MAX",
    "ScanAnswer",
    "ScanRecord",
    "accept_path",
    "parse_ballots_answer",
    "parse_keys_request",
    "parse_records_list",
    "parse_scan_answer",
    "parse_versions_answer",
    "parse_written_version",
    "prepare_path",
    "record_envelope",
    "record_path",
    "record_raw_path",
    "record_round_path",
    "records_list_path",
    "records_scan_path",
    "scan_answer",
    "split_record_envelope",
    "versions_request",
]


def _quote(text: str) -> str:
    return quote(text, safe="")


def _prefix(route: Route) -> str:
    """A keyed route's path before its key (routes are spelled once, in ``ring.api``)."""
    return route.pattern.partition("{")[0]


def record_path(key: str) -> str:
    return f"{_prefix(RECORD_GET)}{key}"


def record_raw_path(key: str) -> str:
    """A peer's slot as it is (a peer catching up asks; never waits on others)."""
    return record_path(key)


def _epoch(epoch: int | None) -> str:
    return "" if epoch is None else f"&epoch={epoch}"


def record_round_path(key: str, view: str, epoch: int | None = None) -> str:
    """A peer's slot for a proposer that computed the acceptors ``view`` names, under
    the configuration ``epoch`` (every proposer sends it; a probe may leave it out)."""
    return f"{record_path(key)}?view={view}{_epoch(epoch)}"


def prepare_path(key: str, ballot: str, view: str, epoch: int | None = None) -> str:
    return f"{_prefix(PAXOS_PREPARE)}{key}?ballot={ballot}&view={view}{_epoch(epoch)}"


def accept_path(
    key: str, ballot: str, view: str, following: str | None = None, epoch: int | None = None
) -> str:
    path = f"{_prefix(PAXOS_ACCEPT)}{key}?ballot={ballot}&view={view}{_epoch(epoch)}"
    return path if following is None else f"{path}&next={following}"


def records_list_path(prefix: str, limit: int, *, include_deleted: bool) -> str:
    deleted = int(include_deleted)
    return f"{RECORDS_LIST.pattern}?prefix={_quote(prefix)}&limit={limit}&deleted={deleted}"


def records_scan_path(
    prefix: str, limit: int, *, after: str = "", delimiter: bool = False, head_bytes: int = 0
) -> str:
    path = f"{RECORDS_LIST.pattern}?prefix={_quote(prefix)}&limit={limit}&scan=1&head={head_bytes}"
    if after:
        path += f"&after={_quote(after)}"
    return path + ("&delimiter=1" if delimiter else "")


# -- records ----------------------------------------------------------------------------


def record_envelope(refs: Sequence[str], value: bytes) -> bytes:
    """A record write's body: the referenced chunk ids, then the value."""
    if not all(codec.is_chunk_id(ref) for ref in refs):
        raise ProtocolError("refs must be chunk ids")
    return b"".join(bytes.fromhex(ref) for ref in refs) + value


def split_record_envelope(body: bytes, refs_count: int) -> tuple[bytes, tuple[str, ...]]:
    """The value and the referenced chunk ids of an envelope holding ``refs_count``."""
    if not 0 <= refs_count <= REFS_MAX or len(body) < refs_count * REF_BYTES:
        raise ProtocolError(f"refs must be 0..{REFS_MAX} ids of {REF_BYTES} bytes before the value")
    cut = refs_count * REF_BYTES
    refs = tuple(body[offset : offset + REF_BYTES].hex() for offset in range(0, cut, REF_BYTES))
    return body[cut:], refs


def parse_written_version(answer: Any) -> int:
    """The version a record write or delete stored."""
    try:
        return json_int(answer["version"], "version", VERSION_MAX)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed record write answer: {exc!r}") from exc


def versions_request(keys: Sequence[str]) -> bytes:
    if len(keys) > LIST_LIMIT_MAX:
        raise ProtocolError(f"at most {LIST_LIMIT_MAX} keys per versions query")
    return codec.compact_json({"keys": list(keys)})


def parse_keys_request(body: bytes) -> list[str]:
    keys = parse_json_object(body).get("keys")
    if not isinstance(keys, list) or len(keys) > LIST_LIMIT_MAX:
        raise ProtocolError(f"'keys' must be a list of at most {LIST_LIMIT_MAX} keys")
    if not all(isinstance(key, str) for key in keys):
        raise ProtocolError("every key must be a string")
    return keys


def parse_versions_answer(answer: Any) -> dict[str, int]:
    try:
        versions = answer["versions"].items()
        return {str(key): json_int(version, "a version", VERSION_MAX) for key, version in versions}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed versions answer: {exc!r}") from exc


def parse_ballots_answer(answer: Any) -> dict[str, str]:
    """The accepted ballot (its wire form) of each key a versions answer names."""
    ballots = answer.get("ballots", {}) if isinstance(answer, dict) else None
    if not isinstance(ballots, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and len(v) <= 60 for k, v in ballots.items()
    ):
        raise ProtocolError("malformed versions answer: 'ballots' maps keys to ballots")
    return ballots


def parse_records_list(answer: Any) -> list[tuple[str, int, bool]]:
    """``(key, version, deleted)`` of each record a listing names."""
    try:
        return [
            (
                str(entry["key"]),
                json_int(entry["version"], "version", VERSION_MAX),
                bool(entry.get("deleted", False)),
            )
            for entry in answer["records"]
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed record listing: {exc!r}") from exc


# -- scans ------------------------------------------------------------------------------

# The first bytes of each value a scan gives (peers keep them in memory).
SCAN_HEAD_BYTES_MAX = 64
# Keys a scan page looks at, at most (live or tombstones): what one request costs a peer,
# and bounds its answer (about 3 MB of JSON for keys of 60 characters).
SCAN_VISITS_MAX = 16_384
# A scan's prefix and starting key, in characters (keys are at most 512).
KEY_QUERY_CHARS_MAX = 1024
_BALLOT_CHARS_MAX = 64
_OP_CHARS_MAX = 64
_DIGEST_CHARS_MAX = 32


@dataclass(frozen=True, slots=True)
class ScanRecord:
    """One record as one peer holds it: the ballot it accepted (its wire form, "" for
    none), the identity of the value accepted with it, the value's first bytes, and
    whether this peer may lack what it should hold for the key (``synced`` False: it
    newly answers for it and has not caught up)."""

    key: str
    version: int
    accepted: str
    op: str
    deleted: bool
    head: bytes
    synced: bool


@dataclass(frozen=True, slots=True)
class ScanAnswer:
    """One peer's page of a scan. ``placement``: a digest of the member set it places
    keys with (its acceptors match the client's only when this matches). ``settled``: it
    holds everything it should for every key it answers for, so a key it does not list
    it has never accepted. ``last``: the last key or prefix the page covers; past it the
    page says nothing when ``truncated``."""

    records: tuple[ScanRecord, ...]
    prefixes: tuple[str, ...]
    truncated: bool
    last: str
    placement: str
    settled: bool


def scan_answer(answer: ScanAnswer) -> dict[str, Any]:
    return {
        "records": [
            {
                "key": r.key, "version": r.version, "accepted": r.accepted, "op": r.op,
                "deleted": r.deleted, "head": base64.b64encode(r.head).decode(),
                "synced": r.synced,
            }
            for r in answer.records
        ],
        "prefixes": list(answer.prefixes),
        "truncated": answer.truncated,
        "last": answer.last,
        "placement": answer.placement,
        "settled": answer.settled,
    }  # fmt: skip


def _scan_text(value: Any, name: str, chars_max: int) -> str:
    if not isinstance(value, str) or len(value) > chars_max or not value.isascii():
        raise ProtocolError(f"malformed scan: {name} is ASCII text of at most {chars_max}")
    return value


def _scan_record(entry: Any) -> ScanRecord:
    if not isinstance(entry, dict):
        raise ProtocolError("malformed scan: a record is an object")
    version = entry.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or not 0 < version < VERSION_MAX:
        raise ProtocolError("malformed scan: a version is an integer in 1..2**53-1")
    head_text = _scan_text(entry.get("head"), "head", 4 * SCAN_HEAD_BYTES_MAX)
    try:
        head = base64.b64decode(head_text, validate=True)
    except ValueError as exc:
        raise ProtocolError("malformed scan: head is base64") from exc
    if len(head) > SCAN_HEAD_BYTES_MAX or not all(
        isinstance(entry.get(flag), bool) for flag in ("deleted", "synced")
    ):
        raise ProtocolError("malformed scan: head too long, or deleted/synced not booleans")
    return ScanRecord(
        _scan_text(entry.get("key"), "key", 1024),
        version,
        _scan_text(entry.get("accepted"), "accepted", _BALLOT_CHARS_MAX),
        _scan_text(entry.get("op"), "op", _OP_CHARS_MAX),
        entry["deleted"],
        head,
        entry["synced"],
    )


def parse_scan_answer(answer: Any, limit: int) -> ScanAnswer:
    """A peer's scan page, at most ``limit`` records and prefixes (what was asked)."""
    if not isinstance(answer, dict):
        raise ProtocolError("malformed scan: not an object")
    records, prefixes = answer.get("records"), answer.get("prefixes")
    if not isinstance(records, list) or not isinstance(prefixes, list):
        raise ProtocolError("malformed scan: records and prefixes are lists")
    if len(records) > SCAN_VISITS_MAX or len(prefixes) > limit:
        raise ProtocolError(
            f"malformed scan: more than {SCAN_VISITS_MAX} records or {limit} prefixes"
        )
    truncated, settled = answer.get("truncated"), answer.get("settled")
    if not isinstance(truncated, bool) or not isinstance(settled, bool):
        raise ProtocolError("malformed scan: truncated and settled are booleans")
    parsed = tuple(_scan_record(entry) for entry in records)
    if sum(1 for record in parsed if not record.deleted) + len(prefixes) > limit:
        raise ProtocolError(f"malformed scan: more than the {limit} live entries asked for")
    return ScanAnswer(
        parsed,
        tuple(_scan_text(prefix, "prefix", 1024) for prefix in prefixes),
        truncated,
        _scan_text(answer.get("last"), "last", 1024),
        _scan_text(answer.get("placement"), "placement", _DIGEST_CHARS_MAX),
        settled,
    )
