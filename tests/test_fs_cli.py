"""``sr3 fs`` and ``sr3 spark conf`` from a shell, against the shared ring.

What must hold: a directory tree put into sr3:// comes back byte-identical with ``get``;
``ls``, ``du`` and ``cat`` show what is there; ``rm -r`` removes it; errors are one line
and exit code 1; ``spark_conf`` and ``sr3 spark conf`` give the same conf, which holds a
credential scoped to the prefix and never the secret.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ring.auth import parse_credential
from spark_connector.conf import spark_conf
from spark_connector.fs_client import FsClient, FsRefused
from sr3.local import LocalCluster


def _sr3(cluster: LocalCluster, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    hidden = ("SR3_RING", "SR3_SECRET", "SR3_CLUSTER_FILE", "SR3_CREDENTIAL")
    environment = {k: v for k, v in os.environ.items() if k not in hidden}
    environment["SR3_CLUSTER_FILE"] = str(cluster.cluster_file)
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", "sr3", *args],
        env=environment, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _ok(cluster: LocalCluster, *args: str, **env: str) -> str:
    done = _sr3(cluster, *args, **env)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _one_line_error(done: subprocess.CompletedProcess[str], needle: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sr3: ") and needle in lines[0], lines


def test_a_tree_goes_in_and_comes_back(
    ring: LocalCluster, rng: random.Random, tmp_path: Path
) -> None:
    source = tmp_path / "tree"
    files = {
        "offsets/0": rng.randbytes(100),
        "state/0/1/1.delta": rng.randbytes(300_000),
        "metadata": b'{"id": "x"}',
    }
    for name, data in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    root = f"sr3:///cli/tree-{rng.randrange(10**9)}"
    assert "3 files" in _ok(ring, "fs", "put", str(source), root)
    listed = _ok(ring, "fs", "ls", root)
    assert [line.split()[-1].rsplit("/", 1)[1] for line in listed.splitlines()] == [
        "metadata", "offsets", "state",
    ]  # fmt: skip
    assert _ok(ring, "fs", "ls", "-R", root).count("\n") == 7  # 3 files and 4 directories
    du = _ok(ring, "fs", "du", "-s", root)
    assert du.split()[0] == str(sum(len(d) for d in files.values())), du
    assert _ok(ring, "fs", "cat", f"{root}/metadata") == '{"id": "x"}'
    _ok(ring, "fs", "get", root, str(tmp_path / "back"))
    for name, data in files.items():
        assert (tmp_path / "back" / name).read_bytes() == data
    _one_line_error(_sr3(ring, "fs", "put", str(source / "metadata"), f"{root}/metadata"), "exists")
    _one_line_error(_sr3(ring, "fs", "cat", f"{root}/missing"), "no such file")
    _one_line_error(_sr3(ring, "fs", "rm", root), "not empty")
    moved = f"{root}-moved"
    assert "(directory)" in _ok(ring, "fs", "mv", root, moved)
    _one_line_error(_sr3(ring, "fs", "ls", root), "no such file")
    assert _ok(ring, "fs", "cat", f"{moved}/metadata") == '{"id": "x"}'
    assert "deleted" in _ok(ring, "fs", "rm", "-r", moved)
    _one_line_error(_sr3(ring, "fs", "ls", moved), "no such file")


async def test_spark_conf_holds_a_scoped_credential_never_the_secret(
    ring: LocalCluster, rng: random.Random
) -> None:
    conf = spark_conf(ring.ring, ring.secret, prefix="spark/conf-test")
    assert conf["spark.hadoop.fs.sr3.impl"] == "sr3.hadoop.Sr3FileSystem"
    assert conf["spark.hadoop.fs.AbstractFileSystem.sr3.impl"] == "sr3.hadoop.Sr3Fs"
    manager = "sr3.hadoop.Sr3CheckpointFileManager"
    assert conf["spark.sql.streaming.checkpointFileManagerClass"] == manager
    assert conf["spark.jars"].endswith(".jar")
    assert ring.secret not in json.dumps(conf)
    credential = conf["spark.hadoop.fs.sr3.token"]
    assert parse_credential(credential).prefix == "/spark/conf-test"
    async with FsClient(conf["spark.hadoop.fs.sr3.ring"], credential) as fs:
        await fs.write(f"/spark/conf-test/{rng.randrange(10**9)}", b"ok")
        with pytest.raises(FsRefused) as refused:
            await fs.write("/spark/other", b"no")
        assert refused.value.code == "forbidden"
    printed = _ok(ring, "spark", "conf", "--prefix", "spark/conf-test")
    flags = shlex.split(printed)
    assert flags[::2] == ["--conf"] * len(conf)
    pairs = dict(flag.split("=", 1) for flag in flags[1::2])
    assert set(pairs) == set(conf)
    assert {k: v for k, v in pairs.items() if not k.endswith(".token")} == {
        k: v for k, v in conf.items() if not k.endswith(".token")
    }
    assert ring.secret not in printed
