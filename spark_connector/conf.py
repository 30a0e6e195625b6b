"""What a SparkSession needs to checkpoint to ``sr3://`` (``spark_conf``).

    for key, value in spark_conf(prefix="spark/").items():
        builder = builder.config(key, value)

The conf names the jar of the Java FileSystem (built on first use, ``spark.jars``: merge
it with jars of your own), the FileSystem classes, Spark's checkpoint file manager for
``sr3://`` (one request per state file; other schemes keep Spark's), the seeds, and a
credential scoped to ``prefix``: minted here from the cluster secret, so the secret
itself never reaches a conf, an executor or a log. ``sr3 spark conf`` prints the same
as ``--conf`` flags.

Spark shows its conf (the UI's Environment page and REST API, the event log) with the
values of the keys ``spark.redaction.regex`` matches hidden. The keys that carry a
secret, the credential (``fs.sr3.token``) and the client's TLS key
(``fs.sr3.tls.secret.key``), are named so that the default regex of every Spark sr3
runs on (4.0: ``(?i)secret|password|token|access[.]?key``) matches them; executors
still get them, as every ``spark.hadoop.*`` conf. The Java FileSystem still reads their
former names, ``fs.sr3.credential`` and ``fs.sr3.tls.key``, whose values Spark shows.
"""

from __future__ import annotations

import time
from pathlib import Path
from xml.sax.saxutils import escape as xml_escape

from ring.auth import is_credential, parse_credential, scoped_credential
from ring.client.view import parse_seeds
from ring.config import resolve, resolve_tls
from ring.errors import ConfigError, ProtocolError
from ring.tls import ClientTls
from spark_connector.fs_checkpoints import fs_path_of
from spark_connector.jar import JAR_CLASSES, fs_jar

__all__ = ["CREDENTIAL_S_DEFAULT", "core_site_xml", "spark_conf"]

# Spark hands its spark.hadoop.* confs to Hadoop without the prefix.
HADOOP_PREFIX = "spark.hadoop."
CONF_CREDENTIAL = HADOOP_PREFIX + "fs.sr3.token"
CONF_TLS_KEY = HADOOP_PREFIX + "fs.sr3.tls.secret.key"
# The confs whose values are secrets: Spark's default spark.redaction.regex matches them.
CONF_SECRETS = (CONF_CREDENTIAL, CONF_TLS_KEY)

CREDENTIAL_S_DEFAULT = 30 * 86400
CREDENTIAL_S_MAX = 366 * 86400


def spark_conf(
    ring: str | None = None,
    secret: str | None = None,
    credential: str | None = None,
    prefix: str = "spark/",
    *,
    expires_s: int = CREDENTIAL_S_DEFAULT,
    tls: ClientTls | None = None,
) -> dict[str, str]:
    """Every conf a session needs for ``sr3://`` paths under ``prefix``. Ring and secret
    are found as for ``Client`` (arguments, ``SR3_RING``/``SR3_SECRET``, the cluster
    file); given ``credential`` (``sr3 token scoped``), the secret is not needed.

    With TLS (``tls``, else ``SR3_TLS_*`` or the cluster file, as for ``Client``), the
    conf carries the cluster's CA certificates and the client certificate and key
    themselves (PEM), so that executors need no file: never the CA's key. Spark hides
    the credential's and the key's values where it shows its conf."""
    if not 0 < expires_s <= CREDENTIAL_S_MAX:
        raise ConfigError(f"a credential lives 1 s to {CREDENTIAL_S_MAX // 86400} days")
    if credential is not None:
        if not is_credential(credential):
            raise ConfigError("credential: a scoped credential (sr3 token scoped), not a secret")
        try:
            parse_credential(credential)
        except ProtocolError as exc:
            raise ConfigError(f"credential: {exc}") from exc
        settings = resolve(ring, "-" * 16, ring_hint="ring=")
        seeds = settings.ring
    else:
        settings = resolve(ring, secret, ring_hint="ring=", secret_hint="secret=")
        seeds = settings.ring
        now = int(time.time())
        credential = scoped_credential(
            settings.secret, fs_path_of(prefix), expires_at=now + expires_s, issued_at=now
        )
    filesystem, abstract, manager = JAR_CLASSES
    tls = tls if tls is not None else resolve_tls(settings.cluster)
    return {
        **(_tls_conf(tls) if tls is not None else {}),
        "spark.jars": str(fs_jar()),
        "spark.hadoop.fs.sr3.impl": filesystem,
        "spark.hadoop.fs.AbstractFileSystem.sr3.impl": abstract,
        # One PUT per state file instead of a temporary file and a rename; other schemes
        # keep Spark's own manager.
        "spark.sql.streaming.checkpointFileManagerClass": manager,
        "spark.hadoop.fs.sr3.ring": ",".join(parse_seeds(seeds)),
        CONF_CREDENTIAL: credential,
    }


def _tls_conf(tls: ClientTls) -> dict[str, str]:
    """The Java FileSystem's TLS settings, the PEM texts themselves."""

    def read(path: Path) -> str:
        try:
            text = path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {path} for the Spark conf: {exc}") from exc
        if "PRIVATE KEY" in text and path == tls.ca_file:
            raise ConfigError(f"{path} holds a private key: give the CA's certificate only")
        return text

    conf = {"spark.hadoop.fs.sr3.tls.ca": read(tls.ca_file)}
    if tls.cert_file is not None and tls.key_file is not None:
        conf["spark.hadoop.fs.sr3.tls.cert"] = read(tls.cert_file)
        conf[CONF_TLS_KEY] = read(tls.key_file)
    return conf


def core_site_xml(conf: dict[str, str]) -> str:
    """Hadoop's ``core-site.xml`` holding the ``spark.hadoop.*`` keys of ``conf`` (as
    ``spark_conf`` gives them), for Hadoop's own tools: ``hadoop fs`` (``FsShell``) and
    ``distcp`` with ``HADOOP_CONF_DIR`` at its folder and the jar on the classpath."""
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<configuration>"]
    for key, value in conf.items():
        if key.startswith(HADOOP_PREFIX):
            name = xml_escape(key.removeprefix(HADOOP_PREFIX))
            lines.append(
                f"  <property><name>{name}</name><value>{xml_escape(value)}</value></property>"
            )
    lines.append("</configuration>")
    return "\n".join(lines) + "\n"
