"""The work folder of ``local-cluster`` workers does not grow with every run.

Workers of a ``local-cluster`` application keep each application's executor logs in
``<Spark home>/work``; for a pip-installed pyspark that is inside the package, and every
demo, drill and cluster test used to leave a folder there for good. sr3's applications
set Spark's standalone clean-up (``sr3.cluster_app.local_cluster_conf``): a folder of an
application that is not running and wrote nothing for a day is removed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support import require_spark

from sr3.cluster_app import WORK_KEEP_S, local_cluster_conf, spark_home
from sr3.spark_demo import with_scratch

pytestmark = pytest.mark.slow

APP_S_MAX = 180.0
# The clean-up's interval in this test (the default is WORK_CLEANUP_INTERVAL_S).
INTERVAL_S = 2
CLEANED_S_MAX = 60.0

# The application: a local-cluster session with sr3's conf, a short clean-up interval,
# kept open until the old folder is gone (or CLEANED_S_MAX); prints what it saw.
APP = """
import json, sys, time
from pathlib import Path
from pyspark.sql import SparkSession
from sr3.cluster_app import BASE_CONF, MASTER, local_cluster_conf
from sr3.spark_demo import scratch_conf

old, interval, wait_s = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
builder = SparkSession.builder.master(MASTER).appName("sr3-work-cleanup")
conf = {**BASE_CONF, **scratch_conf(), **local_cluster_conf(),
        "spark.worker.cleanup.interval": interval}
for key, value in conf.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
count = spark.sparkContext.parallelize(range(8), 2).count()
app_id = spark.sparkContext.applicationId
deadline = time.monotonic() + wait_s
while old.exists() and time.monotonic() < deadline:
    time.sleep(0.5)
own = (old.parent / app_id).is_dir()
spark.stop()
print(json.dumps({"count": count, "app_id": app_id, "old_gone": not old.exists(),
                  "own_kept_while_running": own}))
"""


def _plant(folder: Path, age_s: float) -> None:
    """A finished application's folder whose newest file is ``age_s`` old."""
    log = folder / "0" / "stderr"
    log.parent.mkdir(parents=True)
    log.write_text("an executor's log\n")
    stamp = time.time() - age_s
    for path in (log, log.parent, folder):
        os.utime(path, (stamp, stamp))


def test_conf_names_the_clean_up_spark_reads() -> None:
    """Must hold: the keys are the ones Spark's Worker reads, with a day's retention."""
    conf = local_cluster_conf()
    assert conf["spark.worker.cleanup.enabled"] == "true"
    assert int(conf["spark.worker.cleanup.appDataTtl"]) == WORK_KEEP_S == 24 * 3600
    assert 0 < int(conf["spark.worker.cleanup.interval"]) <= 60
    assert conf["spark.test.home"] == spark_home()


def test_workers_remove_old_application_folders_and_keep_recent_ones(tmp_path: Path) -> None:
    """Breaks: folders of finished applications left in the workers' work folder, one
    two days old and one an hour old. Must hold: while a local-cluster application of
    sr3 runs, its workers remove the old one and keep the recent one and their own."""
    require_spark()
    work = Path(spark_home()) / "work"
    tag = uuid.uuid4().hex[:12]
    old, recent = work / f"app-sr3-test-old-{tag}", work / f"app-sr3-test-recent-{tag}"
    _plant(old, 2 * WORK_KEEP_S)
    _plant(recent, 3600)
    env = with_scratch(dict(os.environ), tmp_path / "jvm")
    own: Path | None = None
    try:
        done = subprocess.run(
            [sys.executable, "-c", APP, str(old), str(INTERVAL_S), str(CLEANED_S_MAX)],
            env=env, capture_output=True, text=True, timeout=APP_S_MAX, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        own = work / seen["app_id"]
        assert seen["count"] == 8
        assert seen["old_gone"], f"{old} is still there after {CLEANED_S_MAX:.0f} s"
        assert seen["own_kept_while_running"]
        assert recent.is_dir(), "a folder newer than the retention was removed"
    finally:
        for folder in (old, recent, own):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
