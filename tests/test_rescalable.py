"""The table of what a rescale may touch (spark_connector.rescalable.refusal), without
Spark: each refusal is one line naming what and why, and what the rescale matrix showed
right passes. tests/test_rescale_matrix.py checks the same against real checkpoints."""

from __future__ import annotations

import pytest

from spark_connector.rescalable import (
    HDFS,
    JOIN_FORMAT_CONF,
    OPERATORS,
    PROVIDER_CONF,
    ROCKSDB,
    refusal,
)

ON_ROCKSDB = {PROVIDER_CONF: ROCKSDB}


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_every_operator_of_the_table_passes_with_either_provider(name: str) -> None:
    assert refusal(ON_ROCKSDB, {0: name, 1: "dedupe"}) is None
    assert refusal({PROVIDER_CONF: HDFS}, {0: name}) is None
    assert refusal({}, {0: name}) is None  # Spark's default provider: the HDFS-backed one


@pytest.mark.parametrize(
    ("conf", "operators", "commit_version", "reason"),
    [
        ({PROVIDER_CONF: "my.Provider"}, {0: "dedupe"}, "v1", "provider my.Provider cannot"),
        (ON_ROCKSDB, {0: "stateStoreSave", 1: "globalLimit"}, "v1", "operator 1 (globalLimit)"),
        (ON_ROCKSDB, {0: "newOperator"}, "v1", "operator 0 (newOperator) cannot be rescaled"),
        (ON_ROCKSDB, {}, "v1", "no stateful operator metadata"),
        (ON_ROCKSDB, None, "v1", "no stateful operator metadata"),
        (ON_ROCKSDB, {0: "stateStoreSave"}, "v2", "state checkpoint format version 2"),
        (
            {**ON_ROCKSDB, JOIN_FORMAT_CONF: "4"},
            {0: "symmetricHashJoin"},
            "v1",
            "join state format 4 cannot be rescaled",
        ),
    ],
)
def test_what_is_not_known_to_rescale_right_is_refused_in_one_line(
    conf: dict[str, str],
    operators: dict[int, str] | None,
    commit_version: str,
    reason: str,
) -> None:
    why = refusal(conf, operators, commit_version=commit_version, checkpoint="/c")
    assert why is not None and reason in why and "\n" not in why, why
    assert why.startswith("/c: ")


def test_a_join_format_matters_only_with_a_join() -> None:
    conf = {**ON_ROCKSDB, JOIN_FORMAT_CONF: "4"}
    assert refusal(conf, {0: "stateStoreSave"}) is None
    assert refusal({**ON_ROCKSDB, JOIN_FORMAT_CONF: "3"}, {0: "symmetricHashJoin"}) is None
