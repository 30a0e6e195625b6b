"""The secrets in sr3's Spark conf stay out of what Spark shows and keeps.

``spark_conf`` carries two secrets: the scoped credential and, with TLS, the client's
private key (PEM text, so that executors need no file). Spark shows its conf on the UI's
Environment page and its REST API's environment endpoint and writes it to the event log
(``SparkListenerEnvironmentUpdate``), hiding the values of keys its
``spark.redaction.regex`` matches.

What it breaks: nothing; a real application on ``local-cluster`` (executors in JVMs of
their own) with its UI on loopback and an event log, against a ring that serves HTTPS
only and requires client certificates. Must hold: the key's and the credential's values
are in none of those places (their names are, marked redacted), nor in the driver's
output or the executors' logs; the driver's Hadoop conf has them, and the executors
write and read ``sr3://`` over TLS with them. A core-site.xml saved with the former
names (``fs.sr3.credential``, ``fs.sr3.tls.key``) still works, with a warning.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import client_tls, require_spark, spark_credential, start_cluster

from ring.tls import ClientTls
from spark_connector.conf import CONF_SECRETS, core_site_xml, spark_conf
from spark_connector.jar import fs_jar, spark_jars_dir
from sr3.certs import init_ca, issue
from sr3.local import LocalCluster

# The default spark.redaction.regex of Spark 4.0, the oldest Spark sr3 runs on (later
# ones add "credential").
SPARK_4_0_REDACTION = re.compile(r"(?i)secret|password|token|access[.]?key")
REDACTED = "*********(redacted)"
APP_S_MAX = 300.0
SHELL_S_MAX = 120.0
HTTP_TIMEOUT_S = 30.0
ROWS = 1000


def _require_jar() -> None:
    require_spark()
    if shutil.which("javac") is None:
        pytest.skip("no javac")


def test_every_secret_of_the_conf_has_a_name_spark_redacts(tmp_path: Path) -> None:
    """Must hold: the values that are secrets (the credential, the PEM private key) sit
    under keys the default redaction regex of every supported Spark matches; no other
    value holds a private key; ``sr3 spark conf --core-site`` keeps the same names."""
    _require_jar()
    init_ca(tmp_path / "ca")
    client = issue(tmp_path / "ca", tmp_path, "client", ["client"])
    tls = ClientTls(tmp_path / "ca" / "ca.pem", client.cert, client.key)
    credential = spark_credential("a-cluster-secret-long-enough-to-sign")
    conf = spark_conf("127.0.0.1:7401", credential=credential, tls=tls)
    key_text = client.key.read_text()
    secrets = {name for name, value in conf.items() if value in (credential, key_text)}
    assert secrets == set(CONF_SECRETS), conf.keys()
    for name in secrets:
        assert SPARK_4_0_REDACTION.search(name), name
    shown = [name for name, value in conf.items() if not SPARK_4_0_REDACTION.search(name)]
    assert not [name for name in shown if "PRIVATE KEY" in conf[name]], shown
    xml = core_site_xml(conf)
    for name in secrets:
        assert f"<name>{name.removeprefix('spark.hadoop.')}</name>" in xml


@pytest.fixture(scope="module")
def tls_ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One peer serving HTTPS only and requiring a client certificate from its CA."""
    home = tmp_path_factory.mktemp("secrets-ring")
    cluster = start_cluster(home, 1, tls=True, replication=1, write_quorum=1)
    try:
        yield cluster
    finally:
        cluster.down(purge=True)


def _key_lines(ring: LocalCluster) -> list[str]:
    """The private key's base64 lines: none may show anywhere."""
    key_file = client_tls(ring).key_file
    assert key_file is not None
    lines = [line for line in key_file.read_text().splitlines() if "-----" not in line]
    assert lines
    return lines


def _assert_hidden(where: str, text: str, ring: LocalCluster, credential: str) -> None:
    assert "PRIVATE KEY" not in text, where
    for line in _key_lines(ring):
        assert line not in text, where
    assert credential not in text, where
    assert ring.secret not in text, where


@pytest.mark.slow
def test_spark_shows_no_secret_of_the_conf_and_executors_still_use_them(
    tls_ring: LocalCluster, tmp_path: Path
) -> None:
    """The module's promise, on a real application (module docstring)."""
    _require_jar()
    credential = spark_credential(tls_ring.secret)
    tls = client_tls(tls_ring)
    events, out = tmp_path / "events", tmp_path / "out"
    events.mkdir()
    out.mkdir()
    job = {
        "ring": tls_ring.ring, "credential": credential, "ca": str(tls.ca_file),
        "cert": str(tls.cert_file), "key": str(tls.key_file), "events": events.as_uri(),
        "out": str(out), "path": f"/spark/secrets-{os.getpid()}/table",
    }  # fmt: skip
    # The application gets the ring, the credential and the TLS files from the job only.
    hidden = {"SR3_RING", "SR3_SECRET", "SR3_CREDENTIAL", "SR3_CLUSTER_FILE"}
    hidden |= {"SR3_TLS_CA", "SR3_TLS_CERT", "SR3_TLS_KEY"}
    env = {name: value for name, value in os.environ.items() if name not in hidden}
    env |= {"SPARK_LOCAL_IP": "127.0.0.1", "SR3_JVM_SCRATCH": str(tmp_path / "jvm")}
    done = subprocess.run(
        [sys.executable, __file__, json.dumps(job)],
        env=env, capture_output=True, text=True, timeout=APP_S_MAX, check=False,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    seen: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    work = Path(seen["spark_home"]) / "work" / seen["app_id"]
    try:
        executor_logs = [path for path in work.rglob("std*") if path.is_file()]
        event_logs = [path for path in events.rglob("*") if path.is_file()]
        shown = {
            "the REST API": (out / "environment.json").read_text(),
            "the Environment page": (out / "environment.html").read_text(),
            "the event log": "\n".join(path.read_text() for path in event_logs),
            "the driver's output": done.stdout + done.stderr,
            "the executors' logs": "\n".join(path.read_text() for path in executor_logs),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for where, text in shown.items():
        _assert_hidden(where, text, tls_ring, credential)

    # The secrets were there to hide, and did their work.
    assert seen["rows"] == ROWS, seen
    assert seen["driver_has_key"] and seen["driver_has_token"], seen
    environment = json.loads(shown["the REST API"])
    for name in CONF_SECRETS:
        assert [name, REDACTED] in environment["sparkProperties"], name
        hadoop_name = name.removeprefix("spark.hadoop.")
        assert [hadoop_name, REDACTED] in environment["hadoopProperties"], name
        assert hadoop_name in shown["the event log"], name
    assert "SparkListenerEnvironmentUpdate" in shown["the event log"]
    # Spark 4.0 renders the tables into the page; later ones fill them from the REST
    # endpoint above (environmentpage.js).
    page = shown["the Environment page"]
    assert "fs.sr3.tls.secret.key" in page or "/environmentpage.js" in page, page[-3000:]
    assert executor_logs, f"no executor log under {work}"


@pytest.mark.slow
def test_a_core_site_with_the_former_names_still_reaches_the_ring(
    tls_ring: LocalCluster, tmp_path: Path
) -> None:
    """Breaks: a core-site.xml written before the secrets were renamed
    (``fs.sr3.credential``, ``fs.sr3.tls.key``). Must hold: Hadoop's shell lists and
    reads sr3:// over TLS with it, and warns once per name that Spark shows it."""
    _require_jar()
    tls = client_tls(tls_ring)
    conf = spark_conf(tls_ring.ring, credential=spark_credential(tls_ring.secret), tls=tls)
    former = {"fs.sr3.token": "fs.sr3.credential", "fs.sr3.tls.secret.key": "fs.sr3.tls.key"}
    for name, old in former.items():
        conf[f"spark.hadoop.{old}"] = conf.pop(f"spark.hadoop.{name}")
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "core-site.xml").write_text(core_site_xml(conf))
    source = tmp_path / "hello.txt"
    source.write_text("over tls with the former names\n")
    folder = f"sr3:///spark/former-{os.getpid()}"
    target = f"{folder}/hello.txt"
    jars, _version = spark_jars_dir()
    classpath = f"{conf_dir}:{fs_jar()}:{jars}/*"
    # Log4j without a configuration shows errors only: warnings too here.
    level = "-Dorg.apache.logging.log4j.level=WARN"
    shell = ["java", level, "-cp", classpath, "org.apache.hadoop.fs.FsShell"]

    def run(*args: str) -> str:
        done = subprocess.run(
            [*shell, *args], capture_output=True, text=True, timeout=SHELL_S_MAX, check=False
        )
        assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
        return done.stdout + done.stderr

    said = run("-mkdir", "-p", folder)
    for name, old in former.items():
        assert f"sr3: {old} is the former name of {name}" in said, said[-3000:]
    run("-put", str(source), target)
    assert source.read_text() in run("-cat", target)


# -- the application (run as a script) ----------------------------------------------------


def _application(job: dict[str, str]) -> dict[str, Any]:
    """A local-cluster application with its UI on loopback and an event log: executors
    write a table to sr3:// and read it back; the environment as the REST API and the UI
    page show it goes to files in ``job["out"]``."""
    from pyspark.sql import SparkSession

    from spark_connector.conf import CONF_CREDENTIAL, CONF_TLS_KEY
    from sr3.cluster_app import BASE_CONF, local_cluster_conf, spark_home
    from sr3.spark_demo import scratch_conf

    def hadoop_name(name: str) -> str:
        return name.removeprefix("spark.hadoop.")

    tls = ClientTls(Path(job["ca"]), Path(job["cert"]), Path(job["key"]))
    conf = {
        **BASE_CONF, **scratch_conf(), **local_cluster_conf(),
        "spark.ui.enabled": "true", "spark.ui.port": "0",
        "spark.eventLog.enabled": "true", "spark.eventLog.dir": job["events"],
        "spark.eventLog.compress": "false",
        **spark_conf(job["ring"], credential=job["credential"], tls=tls),
    }  # fmt: skip
    builder = SparkSession.builder.master("local-cluster[1,1,1024]").appName("sr3-secrets")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    context = spark.sparkContext
    path = f"sr3://{job['path']}"
    spark.range(ROWS).repartition(2).write.parquet(path)
    rows = spark.read.parquet(path).count()
    out = Path(job["out"])
    for route, name in (
        (
            f"/api/v1/applications/{context.applicationId}/environment",
            "environment.json",
        ),
        ("/environment/", "environment.html"),
    ):
        with urllib.request.urlopen(context.uiWebUrl + route, timeout=HTTP_TIMEOUT_S) as answer:
            (out / name).write_bytes(answer.read())
    hadoop = context._jsc.hadoopConfiguration()
    seen = {
        "rows": rows,
        "app_id": context.applicationId,
        "spark_home": spark_home(),
        "driver_has_key": hadoop.get(hadoop_name(CONF_TLS_KEY)) == Path(job["key"]).read_text(),
        "driver_has_token": hadoop.get(hadoop_name(CONF_CREDENTIAL)) == job["credential"],
    }
    spark.stop()
    return seen


if __name__ == "__main__":
    print("RESULT " + json.dumps(_application(json.loads(sys.argv[1]))))
