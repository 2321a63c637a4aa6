# Spark for the jobs of spark_jobs/: the master, the worker (whose executors run
# the jobs' Python tasks), the driver (spark-submit) and the feeder all use this
# image, so they import the same spark_jobs package. The Spark version is the
# pinned pyspark's (pyproject.toml, the `spark` extra: Spark 4, Scala 2.13);
# tests/test_deployment.py checks that they agree. Ubuntu 22.04 under it.
FROM apache/spark:4.2.0-scala2.13-java17-python3-ubuntu
USER root
# reshard's transactional producer runs in every task.
RUN pip install --no-cache-dir "confluent-kafka>=2.6,<3"
COPY spark_jobs /opt/kafka-gateway/spark_jobs
# spark_jobs' KEY=VALUE parser, shared with the gateway's commands (common/key_value.py).
COPY common /opt/kafka-gateway/common
# Owned by spark, so the reshard job's checkpoint volume mounted here is too.
RUN mkdir -p /checkpoints && chown spark:spark /checkpoints
ENV PYTHONPATH=/opt/kafka-gateway
USER spark
