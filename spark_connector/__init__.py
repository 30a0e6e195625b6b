"""Spark Structured Streaming connector: checkpoint directories to manifests and back.

The consistent cut of a checkpoint per committed batch (``checkpoint``), manifests
(``manifest``), and ``StateSync``, which pushes cuts to the ring (by hand or from a
``StreamingQueryListener`` after every commit), keeps the newest few per query, and
restores the newest (or a given) one along a recovery topology.
"""

from spark_connector.checkpoint import CheckpointError, Cut, FileEntry, read_cut
from spark_connector.manifest import Manifest
from spark_connector.sync import PushReport, RestoreReport, StateSync, forget, ring_queries

__all__ = [
    "CheckpointError",
    "Cut",
    "FileEntry",
    "Manifest",
    "PushReport",
    "RestoreReport",
    "StateSync",
    "forget",
    "read_cut",
    "ring_queries",
]
