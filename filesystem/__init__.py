"""The ``sr3://`` file namespace's server side, run by every storage peer: files and
directories as records on the ring (``entries``), the operations over a ring client
(``namespace``) and their HTTP routes (``service``), which commit no write their peer
stalled across (``freshness``). Clients are elsewhere: the Python
``spark_connector.fs_client`` and the Java FileSystem the connector builds.

Layers: ``ring`` <- ``recovery`` <- ``filesystem`` <- ``spark_connector`` <- ``sr3``.
"""
