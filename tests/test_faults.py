"""The fault lab's scenarios, one short run each: five peers on five hosts, clients on
two more, one nemesis per test (``tests/faultlab.py`` says what each breaks and what must
hold; ``make faults`` runs them over many seeds, longer).

What breaks: a minority partition past the removal grace, a bridge, a flapping
partition, one-way loss on a few links, 20 % random loss on every peer, two peers
SIGKILLed at once and one SIGSTOPped, the founder starting after the others, and two
peers' wall clocks jumping (one inside the skew signatures allow, one past it).

What must hold: every key's history is linearizable; after the heal every client reads
the last acknowledged write of every key (or a later one); the sr3:// namespace keeps
one winner per create-if-absent and renames atomic; no epoch is served with two member
sets. Under the minority partition, the cut-off side gets no acknowledged write
and no read, its peer removes nobody, and at least 99 % of the majority side's calls are
decided by a quorum once the failure timeout has passed. The final-read and epoch checks
are themselves tested on made-up histories that must (and must not) fail them.

The scenario's seed comes from the ``rng`` fixture (replay with ``SR3_TEST_SEED``) and
is printed with a summary of every run; each run's histories and logs stay in its
``tmp_path``. Where the lab cannot run these tests skip, or fail under
``SR3_REQUIRE_NETLAB=1`` (CI).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
from faultlab import (
    KEYS,
    NEMESES,
    Seen,
    epoch_violations,
    final_read_violations,
    fs_violations,
    require_faketime,
    run_scenario,
)
from histories import Call
from linearizability import Operation, Record
from netlab import require_netlab
from support import SEED, SEED_ENV


@pytest.mark.slow
@pytest.mark.parametrize("nemesis", list(NEMESES))
def test_records_and_membership_hold_under_the_nemesis(
    nemesis: str, rng: random.Random, tmp_path: Path
) -> None:
    require_netlab()
    if nemesis == "clock-jump":
        require_faketime()
    seed = rng.randrange(2**32)
    report = run_scenario(nemesis, seed, tmp_path)
    print(f"run seed {SEED} (replay with {SEED_ENV}={SEED}); scenario seed {seed}")
    print(report.describe())
    assert not report.violations, report.describe()


# -- the checks themselves, on made-up histories (no lab needed) ----------------------------


def call(client: int, kind: str, invoke_s: float, return_s: float, **fields: object) -> Call:
    op = Operation(client, "fault/a", kind, invoke_s, return_s, **fields)  # type: ignore[arg-type]
    return Call(op, return_s)


def judged(*calls: tuple[str, Call]) -> list[str]:
    """The final-read check of these (phase, call) on key fault/a, every client having
    read the other keys as never written."""
    clients = {c.op.client for _phase, c in calls}
    others = [
        ("a", "final", Call(Operation(client, key, "read", 9.0, 9.1), 9.1))
        for client in sorted(clients)
        for key in KEYS
        if key != "fault/a"
    ]
    return final_read_violations(Seen([("a", p, c) for p, c in calls] + others, [], []))


def test_the_final_read_check_flags_a_lost_acknowledged_write_and_only_that() -> None:
    written = ("workload", call(0, "write", 1.0, 1.1, expected_version=0, value="x"))
    unknown = call(0, "write", 2.0, math.inf, outcome="unknown", expected_version=1, value="y")
    for observed, lost in [
        (Record(1, "x"), False),  # the acknowledged write
        (Record(2, "y"), False),  # a later write, of unknown outcome
        (None, True),  # the acknowledged write lost
        (Record(2, "z"), True),  # a version no write proposed with that value
    ]:
        read = call(0, "read", 3.0, 3.1, observed=observed)
        found = judged(written, ("workload", unknown), ("final", read))
        assert bool(found) == lost, (observed, found)
    # A write acknowledged only after the read began need not be seen by it.
    late = call(0, "write", 2.9, 3.2, expected_version=1, value="y")
    read = call(0, "read", 3.0, 3.1, observed=Record(1, "x"))
    assert judged(written, ("workload", late), ("final", read)) == []
    assert judged(written) == ["client 0 never read fault/a after the heal"]


def test_the_epoch_check_flags_two_member_sets_under_one_epoch() -> None:
    def probe(epoch: int, *config: str) -> dict[str, object]:
        return {"peer": "10.213.0.1:7401", "at_s": 1.0, "epoch": epoch, "config": list(config),
                "members": list(config), "cluster": "c1"}  # fmt: skip

    agreeing = [probe(5, "peer-1", "peer-2"), probe(6, "peer-2"), probe(5, "peer-1", "peer-2")]
    assert epoch_violations(agreeing) == []
    assert epoch_violations([*agreeing, probe(6, "peer-1")]) == [
        "epoch 6 served with different members: [('peer-1',), ('peer-2',)]"
    ]


def _fs(op: str, path: str, outcome: str, data: str, target: str | None = None) -> dict[str, Any]:
    return {"type": "fs", "side": "a", "client": 0, "op": op, "path": path, "target": target,
            "data": data, "invoke_s": 1.0, "end_s": 1.1, "outcome": outcome, "code": "",
            "error": "", "message": ""}  # fmt: skip


def _read(path: str, data: str | None, side: str = "a") -> dict[str, Any]:
    return {"type": "fs-final", "side": side, "path": path, "data": data, "read": True}


def test_the_namespace_check_flags_two_winners_lost_creates_and_torn_renames() -> None:
    """Breaks: made-up namespace histories. Must hold: a clean one passes; two
    acknowledged creates of one path, a path holding a refused create's bytes, a rename
    whose bytes are at both ends (or neither, acknowledged or not), and sides reading
    different contents are each flagged."""
    clean = [
        _fs("create", "/f/c/1", "ok", "x"), _fs("create", "/f/c/1", "refused", "y"),
        _fs("create", "/f/c/2", "unknown", "z"),
        _fs("create", "/f/r/1.tmp", "ok", "r"), _fs("rename", "/f/r/1.tmp", "ok", "r", "/f/r/1"),
        _fs("create", "/f/r/2.tmp", "ok", "s"),
        _fs("rename", "/f/r/2.tmp", "unknown", "s", "/f/r/2"),
        _read("/f/c/1", "x"), _read("/f/c/2", "z"), _read("/f/r/1.tmp", None),
        _read("/f/r/1", "r"), _read("/f/r/2.tmp", "s"), _read("/f/r/2", None),
    ]  # fmt: skip
    assert fs_violations(clean, {}) == []
    two = [*clean, _fs("create", "/f/c/1", "ok", "w")]
    assert any("2 creates acknowledged" in v for v in fs_violations(two, {}))
    refused = [_fs("create", "/f/c/3", "refused", "y"), _read("/f/c/3", "y")]
    assert any("a refused create's" in v for v in fs_violations(refused, {}))
    torn = [
        _fs("rename", "/f/r/3.tmp", "ok", "t", "/f/r/3"),
        _read("/f/r/3.tmp", "t"), _read("/f/r/3", "t"),
    ]  # fmt: skip
    assert any("exactly one of them" in v for v in fs_violations(torn, {}))
    lost = [
        _fs("rename", "/f/r/4.tmp", "unknown", "u", "/f/r/4"),
        _read("/f/r/4.tmp", None), _read("/f/r/4", None),
    ]  # fmt: skip
    assert any("exactly one of them" in v for v in fs_violations(lost, {}))
    both = [
        _fs("rename", "/f/r/5.tmp", "unknown", "v", "/f/r/5"),
        _read("/f/r/5.tmp", "v"), _read("/f/r/5", "v"),
    ]  # fmt: skip
    assert any("exactly one of them" in v for v in fs_violations(both, {}))
    split = [*clean, _read("/f/c/1", "other", side="b")]
    assert any("different contents" in v for v in fs_violations(split, {}))
