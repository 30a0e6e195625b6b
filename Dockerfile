# One sr3 storage peer. The image runs `sr3 peer`; configuration comes from SR3_* variables
# (see docker-compose.yml and `sr3 peer --help`). Peers do not need Spark or Java.
ARG BASE=python:3.11-slim
FROM ${BASE}
WORKDIR /opt/sr3
COPY pyproject.toml README.md ./
COPY sr3 ./sr3
COPY ring ./ring
COPY recovery ./recovery
COPY filesystem ./filesystem
COPY spark_connector ./spark_connector
RUN pip install --no-cache-dir . && useradd --system --uid 7401 sr3 && mkdir /data && chown sr3 /data
COPY deploy/healthcheck.py ./healthcheck.py
USER sr3
VOLUME ["/data"]
EXPOSE 7401/tcp 7401/udp
# Healthy once the peer has learned the member table ("ready"), not merely up; over HTTPS
# when the peer serves TLS (SR3_TLS_CERT), at the port of SR3_LISTEN: the check reads the
# peer's own configuration, so it holds with or without docker-compose.yml.
HEALTHCHECK --interval=5s --timeout=2s --retries=6 CMD ["python", "/opt/sr3/healthcheck.py"]
ENTRYPOINT ["sr3", "peer"]
