# The gateway: one process, one embedded RocksDB store under /data.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY kafka_gateway ./kafka_gateway
COPY tablets ./tablets
COPY txn ./txn
RUN pip install --no-cache-dir .
VOLUME /data
EXPOSE 9092 9644
ENTRYPOINT ["kafka-gateway", "serve"]
CMD ["--listen", "0.0.0.0:9092", "--advertise", "gateway:9092", "--data-dir", "/data", \
     "--admin-listen", "0.0.0.0:9644"]
