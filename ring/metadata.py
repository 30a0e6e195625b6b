"""This peer's copy of the cluster metadata (``ring.cluster``): the newest configuration
it learned, the few before it, and its acceptor state for the next epoch's instance.

A configuration is learned only forward, one epoch at a time or from a chain a peer
serves; a peer that missed epochs it cannot get (older than every peer keeps) jumps to
the newest, and says so (``gaps``): a record acceptor then treats what it missed as
unknown (``ring.consensus``).

Durability: the acceptor state is written and fsynced before a promise or acceptance is
answered (a forgotten promise could let two configurations be decided for one epoch).
A full disk must not take a voter out of the rounds that would let the ring replace
it, so the store keeps a reserve file (``RESERVE_BYTES``) that it gives up to write its
acceptor state when the disk is full, and takes back once there is room; only with the
reserve gone too is the round refused (``StorageFull``, 507). Learned configurations
are saved best effort: one lost in a crash is learned again from any peer.

Files: ``<data>/cluster/config.json`` (``ClusterAnswer`` JSON) and
``<data>/cluster/next.slot`` (the epoch, then a ``ring.paxos`` slot).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ring import paxos
from ring.cluster import (
    CONFIG_BYTES_MAX,
    RECENT_MAX,
    ClusterAnswer,
    Configuration,
    chain_after,
    parse_cluster_answer,
)
from ring.errors import ProtocolError, StorageFull
from ring.files import PendingWrite, make_folders, write_file_atomic
from ring.parse import load_json
from ring.paxos import Ballot, Preempted, Slot, Value

__all__ = ["Decided", "Metadata", "NotVoter", "Unready"]

log = logging.getLogger(__name__)

_EPOCH = struct.Struct("<Q")
# Room kept for the acceptor state on a full disk: a slot holds one configuration
# (at most CONFIG_BYTES_MAX), and the atomic replace writes it beside the old one.
RESERVE_BYTES = 2 * CONFIG_BYTES_MAX
# Freed beyond a write's own size: its temp file's name and the file system's blocks.
_RESERVE_SLACK_BYTES = 8192


@dataclass(frozen=True, slots=True)
class Decided:
    """The epoch a round asked about is decided already (or older): the configuration
    this peer holds, which the proposer learns and goes on from."""

    current: ClusterAnswer


@dataclass(frozen=True, slots=True)
class Unready:
    """This peer cannot take part in the round: it has not learned the epoch before it
    (``epoch``: the one it is at, 0 for none)."""

    epoch: int


@dataclass(frozen=True, slots=True)
class NotVoter:
    """This peer is not a voter of the configuration that decides the asked epoch."""

    epoch: int


Refusal = Decided | Unready | NotVoter | Preempted


class Metadata:
    def __init__(self, root: Path, me: str, wall_clock: Callable[[], float] = time.time) -> None:
        self._dir = root / "cluster"
        self._tmp = root / "tmp"
        self._me = me
        self._saved = PendingWrite(self._tmp, self._dir / "config.json", "the configuration")
        self._slot_path = self._dir / "next.slot"
        self._reserve = self._dir / "reserve"
        self.current: Configuration | None = None
        self.recent: list[Configuration] = []
        # The acceptor's state for one instance: (epoch it decides, slot).
        self._slot: tuple[int, Slot] = (0, paxos.NOTHING)
        self._lock = asyncio.Lock()
        # Called with each configuration learned, in epoch order, and whether epochs
        # before it were missed.
        self.listeners: list[Callable[[Configuration, bool], None]] = []
        self.gaps = 0
        # Wall time each kept configuration was learned here (saved: a restarted peer
        # tells which configurations stopped being current shortly before it stopped).
        self._wall_clock = wall_clock
        self.learned_at: dict[int, float] = {}
        # Every member caught up on every record at this epoch (``ring.settle``): the
        # configurations before it are never asked again, after a restart either.
        self.settled_epoch = 0

    # -- files --------------------------------------------------------------------------

    def open(self) -> None:
        make_folders([self._dir])
        self._keep_reserve()
        if self._saved.path.exists():
            try:
                saved = load_json(self._saved.path.read_bytes())
                answer = parse_cluster_answer(saved)
            except (OSError, ValueError, ProtocolError) as exc:
                log.error("ignoring the saved configuration %s: %s", self._saved.path, exc)
            else:
                self.current, self.recent = answer.current, list(answer.recent)
                self.learned_at = _learned_at(saved)
                self.settled_epoch = answer.settled_epoch
        if self._slot_path.exists():
            try:
                data = self._slot_path.read_bytes()
                (epoch,) = _EPOCH.unpack_from(data)
                slot, _meta = paxos.decode_slot(data[_EPOCH.size :], CONFIG_BYTES_MAX)
                self._slot = (epoch, slot)
            except (OSError, ValueError, ProtocolError, struct.error) as exc:
                # A torn slot cannot be: it is replaced atomically. A corrupt one is a
                # disk fault; refusing to start would stall the ring less safely than
                # promising nothing, which only this peer's own proposals rely on.
                log.error("ignoring the corrupt acceptor state %s: %s", self._slot_path, exc)

    def replaced_since(self, horizon: float) -> list[Configuration]:
        """The kept configurations that stopped being current at or after ``horizon``
        (wall time): their successor was learned then."""
        chain = [*self.recent, *([self.current] if self.current else [])]
        return [
            config
            for config, successor in itertools.pairwise(chain)
            if self.learned_at.get(successor.epoch, float("-inf")) >= horizon
            and config.epoch >= self.settled_epoch
        ]

    async def settled(self, epoch: int) -> None:
        """Every member of ``epoch``'s configuration caught up on every record at it
        (``ring.settle``): remember it, so a restart does not ask the rings before."""
        async with self._lock:
            if epoch <= self.settled_epoch or epoch > self.epoch:
                return
            log.info("records: every member caught up at epoch %d; rings before done", epoch)
            self.settled_epoch = epoch
            self._set_saved()
        await asyncio.to_thread(self._saved.flush)

    def _set_saved(self) -> None:
        answer = self.answer()
        assert answer is not None
        saved = answer.to_json()
        saved["learned_at"] = sorted(self.learned_at.items())
        self._saved.set(json.dumps(saved).encode())

    def answer(self) -> ClusterAnswer | None:
        if self.current is None:
            return None
        return ClusterAnswer(self.current, tuple(self.recent), self.settled_epoch)

    async def learn_answer(self, answer: ClusterAnswer) -> bool:
        """``learn`` the configurations of another peer's answer, and the epoch it knows
        every member caught up at; True if a configuration was new."""
        learned = await self.learn(answer.chain())
        await self.settled(answer.settled_epoch)
        return learned

    @property
    def epoch(self) -> int:
        return 0 if self.current is None else self.current.epoch

    @property
    def saves_pending(self) -> bool:
        return self._saved.pending

    async def save_pending(self) -> None:
        if self._saved.pending:
            await asyncio.to_thread(self._saved.flush)
        if self._reserve_short():
            await asyncio.to_thread(self._keep_reserve)

    def _reserve_short(self) -> bool:
        try:
            return self._reserve.stat().st_size < RESERVE_BYTES
        except FileNotFoundError:
            return True

    def _release_reserve(self, needed_bytes: int) -> bool:
        """Free room for a write of ``needed_bytes`` from the reserve (only that much, so
        that a full disk stays full for everything else); False if it is spent."""
        try:
            size = self._reserve.stat().st_size
        except FileNotFoundError:
            return False
        freed = needed_bytes + _RESERVE_SLACK_BYTES
        log.warning("disk full: using %d bytes of the configuration reserve to vote", freed)
        if size <= freed:
            self._reserve.unlink()
        else:
            os.truncate(self._reserve, size - freed)
        return True

    def _keep_reserve(self) -> None:
        """Make the reserve file whole if it is short and there is room (else later)."""
        if not self._reserve_short():
            return
        try:
            write_file_atomic(self._tmp, self._reserve, bytes(RESERVE_BYTES))
        except StorageFull:
            log.warning("no room for the configuration reserve yet: will retry")

    # -- learning -----------------------------------------------------------------------

    async def learn(self, configs: Sequence[Configuration]) -> bool:
        """Take the configurations of ``configs`` newer than the current one, in epoch
        order; True if any was. A configuration of another cluster is refused."""
        async with self._lock:
            fresh = chain_after(self.epoch, configs)
            if not fresh:
                return False
            current = self.current
            for config in fresh:
                if current is not None and config.cluster != current.cluster:
                    raise ProtocolError(
                        f"configuration of cluster {config.cluster} offered to a peer of "
                        f"cluster {current.cluster}: peers of two rings were mixed"
                    )
                gap = current is not None and config.epoch != current.epoch + 1
                if current is not None:
                    self.recent = [*self.recent, current][-RECENT_MAX:]
                current = config
                self.current = config
                self.learned_at[config.epoch] = self._wall_clock()
                if gap:
                    self.gaps += 1
                for listener in self.listeners:
                    listener(config, gap)
            assert current is not None
            log.info(
                "configuration epoch %d: %d members (%s)",
                current.epoch, len(current.members),
                ", ".join(m.peer_id for m in current.members[:8]),
            )  # fmt: skip
            kept = {c.epoch for c in self.recent} | {current.epoch}
            self.learned_at = {e: at for e, at in self.learned_at.items() if e in kept}
            self._set_saved()
        await asyncio.to_thread(self._saved.flush)
        return True

    # -- the acceptor of the next epoch -------------------------------------------------

    def _refusal(self, epoch: int) -> Refusal | None:
        current = self.current
        if current is None or epoch > current.epoch + 1:
            return Unready(self.epoch)
        if epoch <= current.epoch:
            answer = self.answer()
            assert answer is not None
            return Decided(answer)
        if all(voter.peer_id != self._me for voter in current.voters()):
            return NotVoter(current.epoch)
        return None

    def _slot_for(self, epoch: int) -> Slot:
        held_epoch, slot = self._slot
        return slot if held_epoch == epoch else paxos.NOTHING

    async def prepare(self, epoch: int, ballot: Ballot) -> Slot | Refusal:
        """Promise ``ballot`` in the instance that decides ``epoch``."""
        async with self._lock:
            refusal = self._refusal(epoch)
            if refusal is not None:
                return refusal
            outcome = paxos.prepare(self._slot_for(epoch), ballot)
            if isinstance(outcome, Slot):
                await self._write_slot(epoch, outcome)
            return outcome

    async def accept(self, epoch: int, ballot: Ballot, config: Configuration) -> Slot | Refusal:
        """Accept ``config`` (of epoch ``epoch``) at ``ballot``."""
        if config.epoch != epoch:
            raise ProtocolError("an accepted configuration carries the epoch it decides")
        async with self._lock:
            refusal = self._refusal(epoch)
            if refusal is not None:
                return refusal
            assert self.current is not None
            if config.cluster != self.current.cluster:
                raise ProtocolError("a configuration of another cluster")
            value = Value(epoch, config.encode())
            current = self._slot_for(epoch)
            outcome = paxos.accept(current, ballot, value, None, 0.0)
            if isinstance(outcome, Slot) and outcome != current:
                await self._write_slot(epoch, outcome)
            return outcome

    async def _write_slot(self, epoch: int, slot: Slot) -> None:
        data = _EPOCH.pack(epoch) + paxos.encode_slot(slot)
        try:
            await asyncio.to_thread(write_file_atomic, self._tmp, self._slot_path, data)
        except StorageFull:
            if not await asyncio.to_thread(self._release_reserve, len(data)):
                raise
            await asyncio.to_thread(write_file_atomic, self._tmp, self._slot_path, data)
        self._slot = (epoch, slot)


def _learned_at(saved: object) -> dict[int, float]:
    """The ``learned_at`` pairs of a saved configuration file (none when unreadable)."""
    pairs = saved.get("learned_at", []) if isinstance(saved, dict) else []
    if not isinstance(pairs, list):
        return {}
    return {
        int(pair[0]): float(pair[1])
        for pair in pairs
        if isinstance(pair, list) and len(pair) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)
    }  # fmt: skip
