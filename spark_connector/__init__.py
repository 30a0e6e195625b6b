"""Spark Structured Streaming connector: checkpoint directories to manifests and back.

Not built yet: the connector arrives with a later capability.
"""

__all__: list[str] = []
