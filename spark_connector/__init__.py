"""Spark Structured Streaming connector: checkpoint directories to manifests and back.

The consistent cut of a checkpoint per committed batch (``cut``, read from disk by
``checkpoint``), manifests (``manifest``), and ``StateSync`` (``sync``), which pushes cuts
to the ring (``push``: by hand or from a ``StreamingQueryListener`` after every commit),
keeps the newest few per query (``catalog``), and restores the newest (or a given) one
along a recovery topology (``restore``). Before each batch runs, its plan (what fixes the
batch's input) reaches the ring (``plans``, handed over by sr3's checkpoint file manager:
``plan_hook``; a session gets it from ``local_conf``), so that whoever resumes the query
runs that batch with the same input.

On a cluster, executors write state straight to the ring through the ``sr3://`` Hadoop
FileSystem (Java, ``java/``, built by ``jar``) and the namespace peers serve (the
``filesystem`` package, below this one); ``spark_conf`` gives a session what it needs.
"""

from spark_connector.catalog import forget, ring_queries
from spark_connector.checkpoint import read_cut
from spark_connector.conf import spark_conf
from spark_connector.cut import CheckpointError, Cut, FileEntry
from spark_connector.manifest import Manifest
from spark_connector.plan_hook import local_conf
from spark_connector.push import PushReport
from spark_connector.restore import RestoreReport
from spark_connector.sync import StateSync

__all__ = [
    "CheckpointError",
    "Cut",
    "FileEntry",
    "Manifest",
    "PushReport",
    "RestoreReport",
    "StateSync",
    "forget",
    "local_conf",
    "read_cut",
    "ring_queries",
    "spark_conf",
]
