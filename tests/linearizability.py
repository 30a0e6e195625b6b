"""A linearizability checker for sr3's records, to judge histories recorded from clients.

What it is for: issue 16 asks that record writes be linearizable (an acknowledged
compare-and-set is what every later read returns until it is overwritten). A test records
every call its clients make (who, which key, what, the answer, when it was invoked and
when it returned, on a monotonic clock) and asks :func:`check` whether some order of
those calls, consistent with real time, is a legal run of one register per key.

The model is a compare-and-set register holding ``(version, value)``; absent and deleted
both read as ``None``. ``write`` is a CAS at ``expected_version`` that makes version
``expected_version + 1``, ``delete`` is the same CAS writing a tombstone (``value=None``)
and ``read`` returns the record or ``None``. A call that timed out has outcome
``unknown``: it may or may not have taken effect, and its return time is +infinity.

The algorithm is Wing & Gong's search with Lowe's memoization, as Porcupine does it:
depth-first over the calls that may go next (none of the remaining calls returned before
they were invoked), caching each (set of calls linearized, register state) already
explored. Keys are checked apart (linearizability is compositional). The search has a
step budget: past it the verdict is ``unknown``, never a false ``ok``. A violation comes
with a witness: the longest order found that explains a prefix, and the calls none of
which could go next.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "STEP_BUDGET_DEFAULT",
    "CheckResult",
    "Kind",
    "Operation",
    "Outcome",
    "Record",
    "check",
    "check_key",
]

Kind = Literal["read", "write", "delete"]
Outcome = Literal["ok", "fail", "unknown"]
Verdict = Literal["ok", "violation", "unknown"]

STEP_BUDGET_DEFAULT = 2_000_000


@dataclass(frozen=True, order=True)
class Record:
    """What a read returns: the record's version and value (``None`` for a tombstone
    never appears here: a deleted record reads as ``None``)."""

    version: int
    value: str


@dataclass(frozen=True)
class Operation:
    """One client call as recorded.

    ``expected_version`` and ``value`` are the input of a write (``value`` is ``None``
    for a delete); ``outcome`` is ok, fail (a CAS refused for a conflict; a read that
    failed means nothing and is dropped) or unknown (timed out: ``return_s`` must be
    ``math.inf``). ``observed`` is what an ok read returned.
    """

    client: int
    key: str
    kind: Kind
    invoke_s: float
    return_s: float
    outcome: Outcome = "ok"
    expected_version: int = 0
    value: str | None = None
    observed: Record | None = None

    def __post_init__(self) -> None:
        if self.outcome == "unknown" and self.return_s != math.inf:
            raise ValueError(f"an unknown outcome returns at +inf: {self}")
        if not self.invoke_s <= self.return_s:
            raise ValueError(f"returns before it is invoked: {self}")
        if self.kind == "delete" and self.value is not None:
            raise ValueError(f"a delete writes no value: {self}")
        if self.kind == "write" and self.value is None:
            raise ValueError(f"a write writes a value: {self}")

    def describe(self) -> str:
        """One line for a failing test's message."""
        span = f"[{self.invoke_s:g}, {self.return_s:g}]"
        if self.kind == "read":
            return f"client {self.client} {span} read -> {self.observed} ({self.outcome})"
        what = f"write {self.value!r}" if self.kind == "write" else "delete"
        return (
            f"client {self.client} {span} {what} at expected version "
            f"{self.expected_version} -> {self.outcome}"
        )


# The register: (version, value); version 0 with value None is "never written".
State = tuple[int, str | None]
INITIAL: State = (0, None)


def step(state: State, op: Operation) -> State | None:
    """The state after ``op`` if ``op`` may take effect in ``state`` with the answer it
    gave, else ``None``. An unknown call is only ever linearized as taking effect: the
    runs where it did not are those where it is left out."""
    version, value = state
    if op.kind == "read":
        seen = None if value is None else Record(version, value)
        return state if seen == op.observed else None
    matches = op.expected_version == version
    if op.outcome == "fail":
        return None if matches else state
    return (version + 1, op.value) if matches else None


@dataclass(frozen=True)
class CheckResult:
    """The verdict for a history (or one key of it), with a witness when it is not ok:
    ``prefix`` is the longest legal order found, ``stuck`` the calls that were allowed
    next in real time but none of which the register could explain."""

    verdict: Verdict
    key: str | None = None
    steps: int = 0
    prefix: tuple[Operation, ...] = ()
    stuck: tuple[Operation, ...] = ()

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def describe(self) -> str:
        """A few lines a failing test prints."""
        lines = [f"{self.verdict} (key {self.key!r}, {self.steps} steps)"]
        if self.verdict == "violation":
            lines.append(f"longest linearizable prefix ({len(self.prefix)} calls):")
            lines += [f"  {op.describe()}" for op in self.prefix]
            lines.append("then none of these can take effect:")
            lines += [f"  {op.describe()}" for op in self.stuck]
        return "\n".join(lines)


@dataclass
class _Search:
    """The state of one key's search: calls sorted by invocation, the budget, the
    memo of explored (linearized set, state) pairs and the deepest point reached."""

    ops: Sequence[Operation]
    step_budget: int
    required_mask: int
    steps: int = 0
    seen: set[tuple[int, State]] = field(default_factory=set)
    best_order: tuple[int, ...] = ()
    best_mask: int = 0


def _candidates(search: _Search, mask: int) -> Iterator[int]:
    """Indexes of the calls not yet linearized that may go next: those invoked before
    every remaining call returned. Calls are sorted by invocation, so a call that
    returned before another was invoked is met first and ends the scan."""
    earliest_return_s = math.inf
    for index, op in enumerate(search.ops):
        if mask >> index & 1:
            continue
        if op.invoke_s > earliest_return_s:
            return
        earliest_return_s = min(earliest_return_s, op.return_s)
        yield index


def _search(search: _Search) -> Verdict:
    """Depth-first over linearization orders with an explicit stack (histories run to
    thousands of calls, deeper than Python's recursion)."""
    stack: list[tuple[int, State, Iterator[int]]] = [(0, INITIAL, _candidates(search, 0))]
    order: list[int] = []
    while stack:
        mask, state, choices = stack[-1]
        if mask & search.required_mask == search.required_mask:
            return "ok"
        advanced = False
        for index in choices:
            search.steps += 1
            if search.steps > search.step_budget:
                return "unknown"
            after = step(state, search.ops[index])
            new_mask = mask | 1 << index
            if after is None or (new_mask, after) in search.seen:
                continue
            search.seen.add((new_mask, after))
            order.append(index)
            if len(order) > len(search.best_order):
                search.best_order, search.best_mask = tuple(order), new_mask
            stack.append((new_mask, after, _candidates(search, new_mask)))
            advanced = True
            break
        if not advanced:
            stack.pop()
            if order:
                order.pop()
    return "violation"


def check_key(history: Iterable[Operation], step_budget: int = STEP_BUDGET_DEFAULT) -> CheckResult:
    """The verdict for the calls on one key."""
    ops = sorted(
        (op for op in history if not (op.kind == "read" and op.outcome != "ok")),
        key=lambda op: (op.invoke_s, op.return_s),
    )
    keys = {op.key for op in ops}
    if len(keys) > 1:
        raise ValueError(f"check_key takes one key, got {sorted(keys)}")
    key = next(iter(keys), None)
    # Unknown calls need not be linearized: leaving one out is the run where it did
    # not take effect.
    required_mask = sum(1 << i for i, op in enumerate(ops) if op.outcome != "unknown")
    search = _Search(ops=ops, step_budget=step_budget, required_mask=required_mask)
    verdict = _search(search)
    if verdict != "violation":
        return CheckResult(verdict=verdict, key=key, steps=search.steps)
    stuck = tuple(ops[i] for i in _candidates(search, search.best_mask))
    prefix = tuple(ops[i] for i in search.best_order)
    return CheckResult("violation", key, search.steps, prefix, stuck)


def check(history: Iterable[Operation], step_budget: int = STEP_BUDGET_DEFAULT) -> CheckResult:
    """The verdict for a whole history, key by key: the first violation found, else
    ``unknown`` if some key ran past ``step_budget``, else ok."""
    by_key: dict[str, list[Operation]] = {}
    for op in history:
        by_key.setdefault(op.key, []).append(op)
    undecided: CheckResult | None = None
    steps = 0
    for key in sorted(by_key):
        result = check_key(by_key[key], step_budget)
        steps += result.steps
        if result.verdict == "violation":
            return result
        if result.verdict == "unknown" and undecided is None:
            undecided = result
    return undecided or CheckResult("ok", steps=steps)
