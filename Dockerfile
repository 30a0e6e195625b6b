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
USER sr3
VOLUME ["/data"]
EXPOSE 7401/tcp 7401/udp
HEALTHCHECK --interval=5s --timeout=2s --retries=6 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7401/v1/health', timeout=1)"
ENTRYPOINT ["sr3", "peer"]
