"""Spark Structured Streaming connector: checkpoint directories to manifests and back.

So far: the consistent cut of a checkpoint per committed batch (``checkpoint``),
manifests (``manifest``), and ``StateSync``, which pushes cuts to the ring (by hand or
from a ``StreamingQueryListener`` after every commit) and restores the newest one.
"""

from spark_connector.checkpoint import CheckpointError, Cut, FileEntry, read_cut
from spark_connector.manifest import Manifest
from spark_connector.sync import PushReport, StateSync

__all__ = ["CheckpointError", "Cut", "FileEntry", "Manifest", "PushReport", "StateSync", "read_cut"]
