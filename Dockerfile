# The gateway: one process, one embedded RocksDB store under /data by default,
# or PostgreSQL with --store (docs/cluster.md; the image has asyncpg).
# The wheel is built where a C compiler is (the record walker, tablets/_records.c);
# the image that runs it has none.
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kafka_gateway ./kafka_gateway
COPY tablets ./tablets
COPY txn ./txn
COPY common ./common
COPY pgstore ./pgstore
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
WORKDIR /app
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/*.whl)[postgres]" && rm -rf /wheels
VOLUME /data
EXPOSE 9092 9644
ENTRYPOINT ["kafka-gateway", "serve"]
CMD ["--listen", "0.0.0.0:9092", "--advertise", "gateway:9092", "--data-dir", "/data", \
     "--admin-listen", "0.0.0.0:9644"]
