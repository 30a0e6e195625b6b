"""Shared fixtures: real local clusters on 127.0.0.x and a replayable random generator.

Every random choice a test makes comes from the ``rng`` fixture, seeded from one run seed
(``SR3_TEST_SEED`` to replay; otherwise a fresh one, printed in the header and in the
report of every failing test that used it) and the test's node id, so one test replays
alone or in a full run alike.

Clusters are real: ``LocalCluster`` starts ``python -m sr3 peer`` subprocesses with their
own data folders, fsync and all. ``ring5`` is one 5-peer cluster (R=3, W=2) shared by
the whole session; ``ring`` hands it to a test and afterwards restarts any peer the test
stopped, so tests may kill peers freely. ``make_cluster`` builds fresh clusters for tests
that need their own, and tears them down (purging their data) after the test.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import (
    REQUIRE_SPARK_ENV,
    SEED,
    SEED_ENV,
    MakeCluster,
    missing_spark_requirements,
    spark_required,
    start_cluster,
)

from sr3.local import LocalCluster


def pytest_report_header() -> str:
    return f"sr3 test seed: {SEED} (replay with {SEED_ENV}={SEED})"


def pytest_sessionstart(session: pytest.Session) -> None:
    """With ``SR3_REQUIRE_SPARK=1`` (CI), stop before any test when Spark cannot run, even
    if no Spark test was selected: the tests' own check could be skipped or deselected."""
    missing = missing_spark_requirements("pandas", "pyarrow")
    if spark_required() and missing:
        raise pytest.UsageError(
            f"{REQUIRE_SPARK_ENV}=1 but Spark cannot run; missing " + "; ".join(missing)
        )


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    """A generator seeded from the run seed and the test id; the seed is reported."""
    request.node.add_report_section("setup", "seed", f"replay with {SEED_ENV}={SEED}")
    return random.Random(f"{SEED}/{request.node.nodeid}")


@pytest.fixture(scope="session")
def ring5(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One running 5-peer cluster (R=3, W=2) for the whole session. Its background
    healing is off (no scrubbing, repair once an hour): tests on it look at exactly the
    damage they did, which repair would otherwise race to undo. Healing is tested on
    clusters of its own (test_healing.py)."""
    cluster = start_cluster(
        tmp_path_factory.mktemp("ring5"),
        5,
        peer_flags=["--scrub-rate", "0", "--repair-interval", "3600"],
    )
    yield cluster
    cluster.down(purge=True)


@pytest.fixture
def ring(ring5: LocalCluster) -> Iterator[LocalCluster]:
    """The shared 5-peer cluster, every peer running again after the test."""
    ring5.start()
    yield ring5
    ring5.start()


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[MakeCluster]:
    """Factory of fresh running clusters, torn down (data purged) after the test."""
    made: list[LocalCluster] = []
    counter = itertools.count()

    def make(peers: int, **options: object) -> LocalCluster:
        cluster = start_cluster(tmp_path / f"cluster-{next(counter)}", peers, **options)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.down(purge=True)
