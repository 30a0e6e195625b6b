# The image of spark-example.yaml's driver and executors: Spark with Python, and the
# sr3 FileSystem jar on Spark's classpath. The jar is built against the installed
# pyspark (`sr3 spark conf` prints its path; `make jar` builds it): use a Spark image of
# the same major version.
#
#   mkdir -p build/sr3-spark && cp "$(python -c 'from spark_connector.jar import fs_jar; print(fs_jar())')" build/sr3-spark/sr3-fs.jar
#   docker build -f deploy/kubernetes/spark.Dockerfile -t sr3-spark:latest build/sr3-spark
ARG SPARK_IMAGE=apache/spark:4.0.1-python3
FROM ${SPARK_IMAGE}
COPY sr3-fs.jar /opt/spark/jars/sr3-fs.jar
