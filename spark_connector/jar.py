"""The jar of the ``sr3://`` Hadoop FileSystem, built on first use (with the rest of
sr3's JVM side: the plan hook, and the rescale of the HDFS-backed state store
provider's state, ``sr3.hadoop.HdfsStateRepartition``, which uses Spark's own classes).

The Java sources ship with this package (``spark_connector/java``); ``fs_jar()``
compiles them with ``javac --release 17`` against the jars inside the installed pyspark
package (Hadoop's client API, Jackson: what every Spark executor already has), so no
Maven repository is needed, and packs the classes into a jar with a service entry for
Hadoop's ``FileSystem`` loader. The jar is cached under ``$SR3_HOME/jars`` (default
``~/.sr3/jars``), named by a digest of the sources and the pyspark version, and built
in a temporary directory then renamed, so processes building at once do not clash.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

import xxhash

from ring.config import sr3_home
from ring.errors import ConfigError

__all__ = ["JAR_CLASSES", "fs_jar", "java_sources", "spark_jars_dir"]

SOURCES_DIR = Path(__file__).parent / "java"
# The FileSystem (fs.sr3.impl), its FileContext binding (fs.AbstractFileSystem.sr3.impl),
# and Spark's checkpoint file manager (spark.sql.streaming.checkpointFileManagerClass).
JAR_CLASSES = (
    "sr3.hadoop.Sr3FileSystem",
    "sr3.hadoop.Sr3Fs",
    "sr3.hadoop.Sr3CheckpointFileManager",
)
JAVAC_TIMEOUT_S = 300
SERVICE = "META-INF/services/org.apache.hadoop.fs.FileSystem"


def java_sources() -> list[Path]:
    sources = sorted(SOURCES_DIR.rglob("*.java"))
    if not sources:
        raise ConfigError(f"no Java sources under {SOURCES_DIR}: a broken sr3 installation")
    return sources


def spark_jars_dir() -> tuple[Path, str]:
    """The installed pyspark's jar directory and version."""
    try:
        import pyspark
    except ImportError as exc:
        raise ConfigError("sr3:// needs pyspark: pip install 'sr3[spark]'") from exc
    jars = Path(pyspark.__file__).parent / "jars"
    if not any(jars.glob("hadoop-client-api-*.jar")):
        raise ConfigError(f"no Hadoop client jar in {jars}: pyspark is incomplete")
    return jars, pyspark.__version__


def fs_jar(cache_dir: Path | None = None) -> Path:
    """The path of the built jar (built now if this source and pyspark have none)."""
    jars, version = spark_jars_dir()
    sources = java_sources()
    digest = xxhash.xxh3_64(version.encode())
    for source in sources:
        digest.update(str(source.relative_to(SOURCES_DIR)).encode() + b"\0")
        digest.update(source.read_bytes())
    directory = cache_dir or sr3_home() / "jars"
    jar = directory / f"sr3-fs-{digest.hexdigest()}.jar"
    if jar.exists():
        return jar
    directory.mkdir(parents=True, exist_ok=True)
    javac = shutil.which("javac")
    if javac is None:
        raise ConfigError("sr3:// builds its FileSystem with javac: install a JDK 17")
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as temporary:
        classes = Path(temporary) / "classes"
        done = subprocess.run(
            [
                javac, "--release", "17", "-proc:none", "-encoding", "UTF-8", "-nowarn",
                "-cp", str(jars / "*"), "-d", str(classes), *map(str, sources),
            ],
            capture_output=True, text=True, timeout=JAVAC_TIMEOUT_S, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise ConfigError(f"javac failed on the sr3:// FileSystem:\n{done.stderr[-4000:]}")
        built = Path(temporary) / "sr3-fs.jar"
        with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            archive.writestr(SERVICE, "sr3.hadoop.Sr3FileSystem\n")
            for path in sorted(classes.rglob("*.class")):
                archive.write(path, path.relative_to(classes).as_posix())
        os.replace(built, jar)
    return jar
