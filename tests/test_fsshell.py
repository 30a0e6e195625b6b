"""Hadoop's own shell (``org.apache.hadoop.fs.FsShell``, the ``hadoop fs`` operators
know, from the jars inside pyspark) on ``sr3://``, configured by the core-site.xml that
``sr3 spark conf --core-site`` writes.

What it breaks: nothing; a scripted round trip of the everyday commands. Must hold: each
works as on HDFS (bytes compared where it moves them), and what sr3 does not support
(append) fails with one line and no Java stack trace.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import require_spark

from spark_connector.jar import fs_jar, spark_jars_dir
from sr3.local import LocalCluster

pytestmark = pytest.mark.slow

SHELL_TIMEOUT_S = 120.0


@pytest.fixture
def hadoop_fs(ring: LocalCluster, tmp_path: Path) -> object:
    require_spark()
    if shutil.which("javac") is None:
        pytest.skip("no javac")
    conf_dir = tmp_path / "conf"
    env = {**os.environ, "SR3_RING": ring.ring, "SR3_SECRET": ring.secret}
    subprocess.run(
        [sys.executable, "-m", "sr3", "spark", "conf", "--prefix", "/",
         "--core-site", str(conf_dir / "core-site.xml")],
        env=env, check=True, capture_output=True, timeout=SHELL_TIMEOUT_S,
    )  # fmt: skip
    assert (conf_dir / "core-site.xml").stat().st_mode & 0o777 == 0o600
    jars, _version = spark_jars_dir()
    classpath = f"{conf_dir}:{fs_jar()}:{jars}/*"

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["java", "-cp", classpath, "org.apache.hadoop.fs.FsShell", *args],
            capture_output=True, text=True, timeout=SHELL_TIMEOUT_S, check=False,
        )  # fmt: skip
        if ok:
            assert done.returncode == 0, (args, done.stdout, done.stderr[-3000:])
        return done

    return run


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_everyday_hadoop_fs_commands_work_on_sr3(
    hadoop_fs: object, rng: random.Random, tmp_path: Path
) -> None:
    run = hadoop_fs
    assert callable(run)
    root = f"sr3:///tests/fsshell-{rng.randrange(10**9)}"
    local = tmp_path / "local"
    (local / "sub").mkdir(parents=True)
    (local / "big.bin").write_bytes(rng.randbytes(6 * 1024 * 1024 + 5))
    (local / "sub" / "note 100%.txt").write_text("line one\nline two\n")
    run("-mkdir", "-p", f"{root}/in/deep")
    run("-put", str(local), f"{root}/in/")
    run("-put", str(local / "big.bin"), f"{root}/in/big-copy.bin")
    listing = run("-ls", "-R", root).stdout
    assert f"{root}/in/local/sub/note 100%.txt" in listing, listing
    assert run("-cat", f"{root}/in/local/sub/note 100%.txt").stdout == "line one\nline two\n"
    assert run("-head", f"{root}/in/local/sub/note 100%.txt").stdout.startswith("line one")
    assert run("-tail", f"{root}/in/local/sub/note 100%.txt").stdout.endswith("line two\n")
    size = 6 * 1024 * 1024 + 5 + len("line one\nline two\n")
    count = run("-count", f"{root}/in/local").stdout.split()
    assert count[:3] == ["2", "2", str(size)], count  # directories, files, bytes
    assert run("-du", "-s", f"{root}/in/local").stdout.split()[0] == str(size)
    df = run("-df", f"{root}/").stdout.splitlines()[-1].split()
    assert df[0] == "sr3:///" and 0 < int(df[1]) < 2**63 - 1, df  # the ring's real disks
    assert int(df[2]) >= size and int(df[1]) == int(df[2]) + int(df[3]), df
    stat = run("-stat", "%n %b %F", f"{root}/in/local/big.bin").stdout.strip()
    assert stat == f"big.bin {6 * 1024 * 1024 + 5} regular file", stat
    run("-test", "-d", f"{root}/in/local")
    assert run("-test", "-e", f"{root}/in/missing", ok=False).returncode == 1
    run("-touchz", f"{root}/in/empty")
    assert run("-stat", "%b", f"{root}/in/empty").stdout.strip() == "0"
    # Checksums: equal for equal bytes, so distcp -update can skip unchanged files.
    one = run("-checksum", f"{root}/in/local/big.bin").stdout.split()
    two = run("-checksum", f"{root}/in/big-copy.bin").stdout.split()
    assert one[1:] == two[1:] and one[1] == "XXH3-128", (one, two)
    run("-mv", f"{root}/in/big-copy.bin", f"{root}/in/deep/moved.bin")  # a file
    run("-mv", f"{root}/in/local", f"{root}/moved")  # a directory
    run("-cp", f"{root}/moved", f"{root}/copied")
    run("-get", f"{root}/copied", str(tmp_path / "back"))
    for name in ("big.bin", "sub/note 100%.txt"):
        assert _digest(tmp_path / "back" / name) == _digest(local / name), name
    run("-getmerge", f"{root}/moved/sub", str(tmp_path / "merged"))
    assert (tmp_path / "merged").read_text() == "line one\nline two\n"
    found = run("-find", root, "-name", "moved.bin").stdout.split()
    assert found == [f"{root}/in/deep/moved.bin"], found
    refused = run("-appendToFile", str(local / "big.bin"), f"{root}/in/empty", ok=False)
    assert refused.returncode == 1
    assert "append is not supported" in refused.stderr
    assert "\tat " not in refused.stderr, refused.stderr  # one line, no stack trace
    run("-rm", "-r", f"{root}/copied", f"{root}/moved")
    remaining = run("-ls", "-R", root).stdout
    assert "copied" not in remaining and f"{root}/moved" not in remaining, remaining
