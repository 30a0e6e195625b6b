"""The peer's hand in cluster metadata: it founds or finds the ring, asks to join, leaves,
proposes the removal of peers a majority of voters has not heard from, and spreads
every decided configuration (``ring.cluster``, ``ring.metadata``).

**Changes.** ``propose(change)`` runs single-decree Paxos for epoch ``N + 1`` among the
voters of epoch ``N``: prepare at a ballot above any seen, take the value accepted at
the highest ballot among a majority of promises (a change someone else started must be
finished first), else this peer's own change, and have a majority accept it. Decided,
it is learned here and pushed to every member of both configurations. A proposer that
finds the epoch decided learns it and applies ``change`` to the new one; at most
``ATTEMPTS_MAX`` attempts.

**Founding and joining.** A peer with no configuration and no seeds founds a new ring
(epoch 1: itself, under a fresh cluster id). Any other peer without one asks its seeds
and overlay contacts for theirs, then proposes to add itself. A peer that is running,
not leaving, and not a member (it joined, or it was removed while cut off and is back)
asks to be added again.

**Removals.** A voter proposes removing members silent on its own clock for longer than
the removal grace only when a majority of the voters (itself included) answer that they
do not hear from those members either (``GET /v1/cluster/suspects``). A peer cut off
from the majority therefore never removes anyone; the majority side removes the peer
that is cut off.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ring import api, paxos
from ring.cluster import (
    ClusterAnswer,
    Configuration,
    majority,
    new_cluster_id,
    parse_cluster_answer,
    parse_suspects,
    round_path,
)
from ring.codec import compact_json
from ring.errors import PeerError, ProtocolError, QuorumError, SR3Error
from ring.loops import run_periodic
from ring.membership import MemberTable
from ring.metadata import Metadata
from ring.paxos import Ballot, Slot
from ring.placement import Member
from ring.transport import Transport

__all__ = ["Steward", "StewardSettings"]

log = logging.getLogger(__name__)

ATTEMPTS_MAX = 12
BACKOFF_S_MIN = 0.02
BACKOFF_S_MAX = 1.0
# One message of a round, a learn pushed to one peer, a fetch of the configuration.
MESSAGE_TIMEOUT_S = 2.0
LEARN_PUSH_TIMEOUT_S = 3.0
LEARN_PUSH_CONCURRENCY = 32

Change = Callable[[Configuration], Configuration | None]


class ClusterUnavailable(QuorumError):
    """Too few voters answered for a configuration change to be decided."""


@dataclass(frozen=True, slots=True)
class StewardSettings:
    interval_s: float
    removal_grace_s: float


@dataclass(frozen=True, slots=True)
class _Refused:
    code: str
    promised: Ballot | None = None
    answer: ClusterAnswer | None = None


class Steward:
    def __init__(
        self,
        me: Member,
        metadata: Metadata,
        table: MemberTable,
        transport: Transport,
        settings: StewardSettings,
        *,
        seeds: Sequence[str],
        contacts: Callable[[], list[str]],
        rng: random.Random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.me = me
        self.metadata = metadata
        self.table = table
        self._transport = transport
        self.settings = settings
        self._seeds = [seed for seed in seeds if seed != me.address]
        self._contacts = contacts
        self._rng = rng
        self._clock = clock
        self._proposer = secrets.token_hex(8)
        self._counter = 0
        # Cleared while leaving or after leaving: the peer must not ask to be added.
        self.wants_membership = True
        self._changing = asyncio.Lock()
        self.changes_decided = 0

    # -- the loop -----------------------------------------------------------------------

    async def run(self) -> None:
        await run_periodic(
            "cluster metadata",
            self.round,
            self.settings.interval_s,
            tolerated=(SR3Error,),
            clock=self._clock,
        )

    async def round(self) -> None:
        current = self.metadata.current
        if current is None:
            await self._find_or_found()
            return
        if self.wants_membership and current.member(self.me.peer_id) != self.me:
            await self.propose(self._add_me)
        elif any(v.peer_id == self.me.peer_id for v in current.voters()):
            await self._remove_silent(current)

    def _add_me(self, config: Configuration) -> Configuration | None:
        if not self.wants_membership or config.member(self.me.peer_id) == self.me:
            return None
        log.info("asking to join the ring at epoch %d", config.epoch + 1)
        return config.with_member(self.me)

    async def _find_or_found(self) -> None:
        addresses = list(dict.fromkeys([*self._seeds, *self._contacts()]))
        if not addresses:
            founding = Configuration.founding(new_cluster_id(secrets.token_bytes(16)), self.me)
            log.info("no seeds and no configuration: founding ring %s", founding.cluster)
            await self.metadata.learn([founding])
            return
        for address in addresses:
            try:
                answer = await self.fetch(address)
            except (SR3Error, TimeoutError) as exc:
                log.info("no configuration from %s yet: %s", address, exc)
                continue
            await self.metadata.learn_answer(answer)
            return

    async def fetch(self, address: str) -> ClusterAnswer:
        """The configuration the peer at ``address`` holds."""
        async with asyncio.timeout(MESSAGE_TIMEOUT_S):
            answer = await self._transport.request(
                address, api.CLUSTER.method, api.CLUSTER.pattern, any_target=True
            )
        return parse_cluster_answer(answer.json())

    async def pull(self, address: str, epoch: int) -> None:
        """Learn from ``address``, which said it is at ``epoch``, if that is newer."""
        if epoch > self.metadata.epoch:
            await self.metadata.learn_answer(await self.fetch(address))

    # -- removals -----------------------------------------------------------------------

    def _overdue(self, config: Configuration) -> list[str]:
        """Members this peer has not heard from for longer than the removal grace."""
        grace_s = self.settings.removal_grace_s
        return [
            member.peer_id
            for member in config.members
            if member.peer_id != self.me.peer_id and self.table.silent_s(member.peer_id) > grace_s
        ]

    async def _remove_silent(self, config: Configuration) -> None:
        overdue = self._overdue(config)
        if not overdue:
            return
        voters = config.voters()
        votes = {peer_id: 0 for peer_id in overdue}
        for down in await self._suspects(voters):
            for peer_id in overdue:
                votes[peer_id] += peer_id in down
        needed = majority(len(voters))
        agreed = [peer_id for peer_id, count in votes.items() if count >= needed]
        if not agreed:
            log.info(
                "not removing %s: fewer than %d of %d voters do not hear from them",
                ", ".join(overdue), needed, len(voters),
            )  # fmt: skip
            return

        def remove(current: Configuration) -> Configuration | None:
            gone = [peer_id for peer_id in agreed if current.member(peer_id) is not None]
            if not gone or len(gone) >= len(current.members):
                return None
            log.info("proposing the removal of %s (silent past the grace)", ", ".join(gone))
            return current.without(gone)

        await self.propose(remove)

    async def _suspects(self, voters: Sequence[Member]) -> list[frozenset[str]]:
        """What each voter that answers does not hear from (this peer answers itself)."""

        async def ask(voter: Member) -> frozenset[str] | None:
            if voter.peer_id == self.me.peer_id:
                return self.table.suspects()
            try:
                async with asyncio.timeout(MESSAGE_TIMEOUT_S):
                    answer = await self._transport.request(
                        voter.address, api.CLUSTER_SUSPECTS.method, api.CLUSTER_SUSPECTS.pattern
                    )
                return parse_suspects(answer.json())
            except (SR3Error, TimeoutError) as exc:
                log.debug("voter %s did not say whom it suspects: %s", voter.peer_id, exc)
                return None

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(ask(voter)) for voter in voters]
        return [down for task in tasks if (down := task.result()) is not None]

    # -- one change ---------------------------------------------------------------------

    async def propose(self, change: Change) -> Configuration:
        """Decide the next configuration ``change`` asks for (none: nothing to do); the
        configuration current once it is decided."""
        async with self._changing:
            causes: list[str] = []
            for attempt in range(1, ATTEMPTS_MAX + 1):
                current = self.metadata.current
                if current is None:
                    raise ClusterUnavailable("the configuration", 0, 1, ["none learned yet"])
                wanted = change(current)
                if wanted is None:
                    return current
                decided = await self._instance(current, wanted, causes)
                if decided is not None:
                    self.changes_decided += 1
                    if decided == wanted:
                        return decided
                    continue
                await asyncio.sleep(self._backoff_s(attempt))
            epoch = self.metadata.epoch + 1
            voters = () if current is None else current.voters()
            raise ClusterUnavailable(
                f"configuration epoch {epoch}", 0, majority(len(voters)), causes[-4:]
            )

    def _backoff_s(self, attempt: int) -> float:
        ceiling = min(BACKOFF_S_MAX, BACKOFF_S_MIN * 2 ** (attempt - 1))
        return self._rng.uniform(ceiling / 2, ceiling)

    def _ballot(self) -> Ballot:
        self._counter += 1
        return Ballot(self._counter, self._proposer)

    async def _instance(
        self, current: Configuration, wanted: Configuration, causes: list[str]
    ) -> Configuration | None:
        """One try at deciding epoch ``current.epoch + 1``: the configuration decided
        (``wanted`` or one another proposer got accepted first), or None."""
        epoch, voters = current.epoch + 1, current.voters()
        needed = majority(len(voters))
        ballot = self._ballot()
        path = round_path(api.CLUSTER_PREPARE.pattern, epoch, ballot.wire())
        answers = await self._ask(voters, api.CLUSTER_PREPARE.method, path, None, causes)
        if await self._settle_refusals(answers, causes):
            return None
        promises = [answer for answer in answers.values() if isinstance(answer, Slot)]
        if len(promises) < needed:
            causes.append(f"epoch {epoch}: {len(promises)} of {needed} voters promised")
            return None
        _ballot, value = paxos.recovered_value(promises)
        proposal = Configuration.decode(value.data) if value.version else wanted
        if proposal.epoch != epoch or proposal.cluster != current.cluster:
            raise ProtocolError(f"a voter accepted a configuration that does not decide {epoch}")
        path = round_path(api.CLUSTER_ACCEPT.pattern, epoch, ballot.wire())
        answers = await self._ask(
            voters, api.CLUSTER_ACCEPT.method, path, proposal.encode(), causes
        )
        if await self._settle_refusals(answers, causes):
            return None
        accepted = sum(1 for answer in answers.values() if answer is True)
        if accepted < needed:
            causes.append(f"epoch {epoch}: {accepted} of {needed} voters accepted")
            return None
        await self.metadata.learn([proposal])
        await self.push(proposal, current.members)
        return proposal

    async def _settle_refusals(
        self, answers: dict[str, Slot | bool | _Refused], causes: list[str]
    ) -> bool:
        """Act on the refusals of a phase: learn an epoch decided already, tell voters
        behind what they missed, go above a higher ballot. True if the phase is lost."""
        lost = False
        for peer_id, answer in answers.items():
            if not isinstance(answer, _Refused):
                continue
            causes.append(f"{peer_id}: {answer.code}")
            if answer.answer is not None:
                lost = await self.metadata.learn_answer(answer.answer) or lost
            if answer.promised is not None:
                self._counter = max(self._counter, answer.promised.counter)
                lost = True
        unready = [peer_id for peer_id, a in answers.items() if isinstance(a, _Refused)
                   and a.code == "epoch_unready"]  # fmt: skip
        current = self.metadata.current
        if unready and current is not None:
            await self.push(current, [m for m in current.members if m.peer_id in unready])
        return lost

    async def _ask(
        self, voters: Sequence[Member], method: str, path: str, body: bytes | None,
        causes: list[str],
    ) -> dict[str, Slot | bool | _Refused]:  # fmt: skip
        """Send one phase to every voter (this peer answers itself through the same
        route, so its state is kept in one place); each answer by peer id."""

        async def one(voter: Member) -> Slot | bool | _Refused | None:
            try:
                async with asyncio.timeout(MESSAGE_TIMEOUT_S):
                    answer = await self._transport.request(
                        voter.address, method, path, body=body, ok=(200, 409),
                        body_bytes_max=paxos.SLOT_BYTES_MAX,
                    )  # fmt: skip
                if answer.status == 409:
                    return _refusal(answer.json())
                if body is not None:
                    return True
                slot, _meta = paxos.decode_slot(answer.body, paxos.SLOT_BYTES_MAX)
                return slot
            except (PeerError, ProtocolError, TimeoutError) as exc:
                causes.append(f"{voter.peer_id}: {exc or 'no answer in time'}")
                return None

        async with asyncio.TaskGroup() as group:
            tasks = {voter.peer_id: group.create_task(one(voter)) for voter in voters}
        return {peer_id: result for peer_id, task in tasks.items() if (result := task.result())}

    # -- spreading ----------------------------------------------------------------------

    async def _tell(self, address: str, body: bytes, *, any_target: bool = False) -> None:
        """``POST /v1/cluster/learn`` to ``address``, within ``LEARN_PUSH_TIMEOUT_S``."""
        async with asyncio.timeout(LEARN_PUSH_TIMEOUT_S):
            await self._transport.request(
                address, api.CLUSTER_LEARN.method, api.CLUSTER_LEARN.pattern,
                body=body, any_target=any_target,
            )  # fmt: skip

    async def push_to(self, address: str) -> None:
        """Tell the peer at ``address`` (a gossip partner behind) the configuration."""
        answer = self.metadata.answer()
        if answer is not None:
            await self._tell(address, compact_json(answer.to_json()), any_target=True)

    async def push(self, config: Configuration, also: Iterable[Member] = ()) -> None:
        """Tell every member of ``config`` (and ``also``) about it, best effort, each
        within ``LEARN_PUSH_TIMEOUT_S``."""
        answer = self.metadata.answer()
        if answer is None:
            return
        body = compact_json(answer.to_json())
        targets = {m.peer_id: m for m in [*config.members, *also] if m.peer_id != self.me.peer_id}
        slots = asyncio.Semaphore(LEARN_PUSH_CONCURRENCY)

        async def one(member: Member) -> None:
            async with slots:
                try:
                    await self._tell(member.address, body)
                except (SR3Error, TimeoutError) as exc:
                    log.debug("epoch %d not pushed to %s: %s", config.epoch, member.peer_id, exc)

        async with asyncio.TaskGroup() as group:
            for member in targets.values():
                group.create_task(one(member))


def _refusal(body: object) -> _Refused:
    if not isinstance(body, dict):
        raise ProtocolError("a refusal is a JSON object")
    code = str(body.get("error", ""))
    if code == "preempted":
        promised = body.get("promised")
        return _Refused(
            code, promised=Ballot.parse(promised if isinstance(promised, str) else None)
        )
    if code == "epoch_decided":
        return _Refused(code, answer=parse_cluster_answer(body.get("cluster")))
    if code in ("epoch_unready", "not_voter"):
        return _Refused(code)
    raise ProtocolError(f"unexpected refusal {code[:40]!r} in a configuration round")
