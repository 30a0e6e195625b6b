"""``sr3 demo``: the Spark story at small scale, and the pieces it is judged by.

What it breaks (end to end): the driver's whole process group is SIGKILLed once the ring
holds batch 2, two of five peers are SIGKILLed and the checkpoint directory is deleted.
What must hold: the restored query and the killed one together emit exactly the rows of
an uninterrupted run, and the demo says MATCH and exits 0. Spark runs in the demo's own
driver subprocesses, so that test is a plain one (without PySpark or Java it skips, or
fails under SR3_REQUIRE_SPARK=1).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from support import next_base_port, require_spark

from ring.errors import ConfigError
from sr3 import demo
from sr3.cluster_demo import ClusterDemoOptions, run_cluster_demo
from sr3.demo import SparkDemoOptions, compare_outputs, run_spark_demo
from sr3.spark_demo import (
    Output,
    input_rows,
    read_output,
    scratch_conf,
    with_scratch,
    write_inputs,
)


@pytest.mark.slow
def test_spark_demo_restores_the_query_and_matches_the_reference(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    require_spark()
    options = SparkDemoOptions(
        batches=4, kill_at=1, seed=3, trigger_s=0.5, base_port=next_base_port(),
        keep_dir=tmp_path / "demo",
    )  # fmt: skip
    code = run_spark_demo(options)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "MATCH" in out and "MISMATCH" not in out
    restored = re.search(r"restored batch (\d+): (\d+) files", out)
    assert restored is not None, out
    assert int(restored.group(1)) >= options.kill_at and int(restored.group(2)) > 0
    # The restored driver went on from the restored batch, not from the start.
    resumed = read_output(tmp_path / "demo" / "output-restored")
    assert resumed and min(resumed) == int(restored.group(1)) + 1


def test_compare_drops_the_killed_runs_batches_after_the_restored_one() -> None:
    row = ("2024-01-01T00:00:00", "k0", 1)
    later = ("2024-01-01T00:01:00", "k1", 2)
    killed: Output = {0: [], 1: [row], 2: [later]}  # batch 2 committed after the last push
    reference: Output = {0: [], 1: [row], 2: [later], 3: []}
    comparison = compare_outputs(killed, 1, {2: [later], 3: []}, reference)
    assert comparison.match and comparison.first_batch_apart() is None
    assert comparison.dropped == (2,) and comparison.replays_identical
    # Emitted twice, or in another batch: only the first is a mismatch.
    twice = compare_outputs(killed, 2, {3: [later]}, reference)
    assert not twice.match and twice.differences() == [("+", later)]
    moved = compare_outputs(killed, 1, {2: [], 3: [later]}, reference)
    assert moved.match and moved.first_batch_apart() == 2


def test_inputs_are_deterministic_and_outputs_read_back(tmp_path: Path) -> None:
    assert write_inputs(tmp_path / "a", 3, seed=5) == write_inputs(tmp_path / "b", 3, seed=5)
    for name in ("input-0000.json", "input-0002.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert input_rows(1, 5) != input_rows(1, 6)
    modified = [(tmp_path / "a" / f"input-{i:04d}.json").stat().st_mtime for i in range(3)]
    assert modified == sorted(modified), "the file source must see minutes in order"
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "batch-000004.json").write_text('[["2024-01-01T00:00:00", "k1", 3]]')
    assert read_output(tmp_path / "out") == {4: [("2024-01-01T00:00:00", "k1", 3)]}


def test_jvm_scratch_is_the_launcher_s_folder_and_its_option_one_word(tmp_path: Path) -> None:
    """An application's JVMs keep their scratch files in the folder its launcher names
    (created there), whatever characters the path holds; nothing is set without one."""
    assert scratch_conf({}) == {}
    folder = tmp_path / 'a "quoted" \\ folder'
    conf = scratch_conf(with_scratch({"OTHER": "kept"}, folder))
    assert conf["spark.local.dir"] == str(folder.resolve() / "local")
    assert (folder / "local").is_dir() and (folder / "tmp").is_dir()
    option = conf["spark.driver.extraJavaOptions"]
    assert conf["spark.executor.extraJavaOptions"] == option
    # Spark splits the option string as a shell does (double quotes, backslash escapes).
    assert shlex.split(option) == [f"-Djava.io.tmpdir={folder.resolve() / 'tmp'}"]


def test_demo_without_pyspark_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        demo.importlib.util, "find_spec", lambda name, *args: None if name == "pyspark" else 1
    )
    with pytest.raises(ConfigError, match=re.escape("sr3[spark]")):
        run_spark_demo(SparkDemoOptions())


def test_demo_refuses_a_kill_that_leaves_nothing_to_restore() -> None:
    with pytest.raises(ConfigError, match="--kill-at"):
        SparkDemoOptions(batches=6, kill_at=5)


@pytest.mark.slow
def test_cluster_demo_carries_on_from_sr3_after_the_application_and_two_peers_die(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``sr3 demo --cluster`` end to end, small: executors on local-cluster checkpoint to
    sr3:///, the application and 2 of 5 peers are SIGKILLed, a new application finishes;
    it reports MATCH for output, state and the secret kept from executors, exit code 0."""
    require_spark()
    options = ClusterDemoOptions(batches=5, kill_after=2, seed=4, base_port=next_base_port())
    code = run_cluster_demo(options)
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("MATCH") == 3 and "MISMATCH" not in out, out
