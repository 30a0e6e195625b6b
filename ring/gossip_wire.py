"""What a gossip exchange carries (``POST /v1/gossip``, both ways): small when nothing
changed.

Sending the whole member table every exchange costs O(N) entries of ~110 bytes each
way: 1.4 MB/s per peer at 1,000 peers. What changes every round is only liveness, so a
message carries:

- ``cluster_epoch``: the configuration epoch the sender is at (``ring.metadata``);
- ``digest``: an xxh3 of every entry's fields but the heartbeat (peer id, address,
  networks, zone, status, incarnation, settled epoch), in peer-id order: equal digests mean equal
  tables up to liveness;
- ``ages``: one byte per entry, in the same order: how long ago the sender last heard
  from that peer, in tenths of a second rounded up (255: not within 25.4 s, or never).
  The receiver takes any that is more recent than its own (``MemberTable.heard``):
  heartbeat gossip in the currency of time, as the counters would spread it, at one
  byte a peer instead of a whole entry (~1.4 kB at 1,000 peers);
- ``members``: the whole table, only when the digests differ (the receiver answers with
  its table and ``want``: the sender then sends its own), when a status is announced,
  and to peers of a version before this format (which answer ``members`` only).

Ages are measured when the message is built; the time it spends on the wire makes a
peer look fresher by that much, milliseconds against a failure timeout of seconds.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from ring.api import member_table_body, parse_cluster_epoch, parse_member_table
from ring.errors import ProtocolError
from ring.membership import MEMBERS_MAX, Entry

__all__ = [
    "AGE_NONE", "AGE_UNIT_S", "GossipMessage", "decode_message", "encode_message",
    "encode_ages", "table_digest",
]  # fmt: skip

AGE_UNIT_S = 0.1
# The byte for "not heard from within 25.4 s, or never": it tells the receiver nothing.
AGE_NONE = 255
_DIGEST_CHARS = 16


@dataclass(frozen=True, slots=True)
class GossipMessage:
    cluster_epoch: int
    digest: str
    ages: bytes
    # The sender's whole table (sorted by peer id), or None when it sent only the digest.
    members: tuple[Entry, ...] | None = None
    # The sender found the digests differ and wants the receiver's whole table.
    want: bool = False


def table_digest(entries: Sequence[Entry]) -> str:
    """A digest of ``entries`` (sorted by peer id) without their heartbeats."""
    hasher = xxhash.xxh3_64()
    for entry in entries:
        fields = (entry.peer_id, entry.address, entry.zone, entry.status)
        hasher.update("\0".join(fields).encode())
        for name, address in entry.networks:
            hasher.update(f"\0{name}={address}".encode())
        hasher.update(f"\0{entry.epoch}\0{entry.settled}\n".encode())
    return hasher.hexdigest()


def encode_ages(ages_s: Sequence[float | None]) -> bytes:
    """One byte per age (None: never heard): tenths of a second, rounded up."""
    return bytes(
        AGE_NONE if age is None or not age < (AGE_NONE - 1) * AGE_UNIT_S
        else min(AGE_NONE - 1, max(0, math.ceil(age / AGE_UNIT_S - 1e-9)))
        for age in ages_s
    )  # fmt: skip


def encode_message(message: GossipMessage) -> dict[str, Any]:
    body: dict[str, Any] = {
        "cluster_epoch": message.cluster_epoch,
        "digest": message.digest,
        "ages": base64.b64encode(message.ages).decode(),
    }
    if message.members is not None:
        body["members"] = member_table_body(message.members)["members"]
    if message.want:
        body["want"] = True
    return body


def decode_message(data: dict[str, Any]) -> GossipMessage:
    """A gossip body; one of a peer before this format (``members`` only) reads as a
    whole table with no digest and no ages."""
    epoch = parse_cluster_epoch(data)
    members = tuple(parse_member_table(data)) if "members" in data else None
    if "digest" not in data:
        if members is None:
            raise ProtocolError("a gossip body has a digest or members")
        return GossipMessage(epoch, "", b"", members)
    digest, ages_text, want = data.get("digest"), data.get("ages"), data.get("want", False)
    if not isinstance(digest, str) or len(digest) != _DIGEST_CHARS or not digest.isalnum():
        raise ProtocolError(f"a gossip digest is {_DIGEST_CHARS} hex digits")
    if not isinstance(ages_text, str) or len(ages_text) > 4 * (MEMBERS_MAX // 3 + 1):
        raise ProtocolError(f"gossip ages are base64 of at most {MEMBERS_MAX} bytes")
    try:
        ages = base64.b64decode(ages_text, validate=True)
    except ValueError as exc:
        raise ProtocolError("gossip ages are base64") from exc
    if len(ages) > MEMBERS_MAX or not isinstance(want, bool):
        raise ProtocolError(f"gossip ages name at most {MEMBERS_MAX} peers; want is a boolean")
    if members is not None and len(ages) != len(members):
        raise ProtocolError("gossip ages name each of the members sent, in order")
    return GossipMessage(epoch, digest.lower(), ages, members, want)
