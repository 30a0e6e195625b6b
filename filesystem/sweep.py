"""Renames nobody finishes: the recovery pass.

A rename whose client gave up and never retried (its process died, its retries ran
out) leaves its intent record and its marks behind. Readers are not misled by them (a
mark whose rename is still copying shows the source; an aborted one, too) and the next
write of a marked record aborts the rename first (``Namespace.give_way``), but the
intent stays for good, every read of a marked record reads it too, and copies hidden at
the target keep their chunks from collection.

Every peer sweeps, every ``rename_sweep_interval_s`` (jittered; ``sr3 peer
--rename-sweep-interval``), the intents it owns (it is first in the intent key's
placement, so one peer does each) that are older than ``rename_abandoned_s``
(``--rename-abandoned-after``) by their coordinator's clock:

- one still *copying* is aborted, as a write meeting its marks would: the tree or file
  stays at its source, as if the rename had not been asked for;
- then it is cleaned up as its own coordinator would have (``Move.settle``, scanning
  both ends): a committed rename's marks cleared and originals deleted, an aborted one's
  copies deleted and marks cleared (a replaced file put back), and the intent deleted.

Aborting is always safe (it is what any writer of a marked record does); the age only
keeps the sweep from aborting a rename that is still running. A client that retries
the rename after the sweep aborted it is answered 409 ``changed``, and renames again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from filesystem.moves import INTENT_KEY_PREFIX, Intent, Move, abort_rename
from ring import fs_api
from ring.errors import ProtocolError

if TYPE_CHECKING:
    from filesystem.namespace import Namespace

__all__ = ["SWEEP_INTENTS_MAX", "sweep_renames"]

log = logging.getLogger(__name__)

# Intent records one pass reads at most (the rest wait for the next pass).
SWEEP_INTENTS_MAX = 1000


async def sweep_renames(
    ns: Namespace, *, abandoned_after_ms: int, owns: Callable[[str], Awaitable[bool]]
) -> int:
    """One pass over the rename intents: those ``owns`` and older than
    ``abandoned_after_ms`` are aborted if still copying and cleaned up; how many."""
    finished = 0
    seen = 0
    cursor = ""
    while seen < SWEEP_INTENTS_MAX:
        limit = min(fs_api.LIST_LIMIT_MAX, SWEEP_INTENTS_MAX - seen)
        scan = await ns.client.scan_records(INTENT_KEY_PREFIX, limit=limit, after=cursor)
        for record in scan.records:
            seen += 1
            if await owns(record.key) and await _finish(ns, record.key, abandoned_after_ms):
                finished += 1
        if not scan.truncated or not scan.records:
            break
        cursor = scan.last
    return finished


async def _finish(ns: Namespace, key: str, abandoned_after_ms: int) -> bool:
    """Abort (if still copying) and clean up the rename of intent ``key`` when it is old
    enough; whether it was."""
    record = await ns.client.get_record(key)
    if record is None:
        return False
    try:
        intent = Intent.decode(record.value)
    except ProtocolError as exc:
        log.warning("rename intent %s is not one (%s); left alone", key, exc)
        return False
    age_ms = ns.wall_ms() - intent.started_ms
    if age_ms < abandoned_after_ms:
        return False
    op = key[len(INTENT_KEY_PREFIX) :]
    if intent.state == "copying":
        aborted = await abort_rename(ns, op)
        intent = replace(intent, state="aborted" if aborted else "committed")
    log.info(
        "finishing the rename of %s to %s (op %s), %s %d s ago",
        intent.source, intent.target, op, intent.state, age_ms // 1000,
    )  # fmt: skip
    # Version 0: the clean-up reads the intent again before it deletes it.
    await Move(ns, op, intent, 0).settle()
    return True
