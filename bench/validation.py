"""python -m bench.validation: what checking every produced record costs.

Appends 1 MiB batches of 1 KiB records through a StorageEngine (RocksDB,
fsync=never), in each codec, eight appends in flight, and reports records/s
and the process's CPU seconds per GB of records (all threads: the event loop,
the validation workers, the RocksDB writer). Run it against another checkout
to compare: ``PYTHONPATH=/path/to/checkout python3 bench/validation.py``.

    python3 -m bench.validation                 # all codecs, 256 MiB each
    python3 -m bench.validation --mib 64 --codecs none,zstd --values text
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import random
import resource
import tempfile
import time

import cramjam
import lz4.frame
import zstandard

from tablets import EngineSettings, StorageEngine
from tablets.batch import build_batch

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
RECORD_SIZE = 1024
BATCH_RECORDS = 1000  # ~1 MiB, librdkafka's default batch.size
IN_FLIGHT = 8


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint(value: int) -> bytes:
    return _uvarint((value << 1) ^ (value >> 63))


def records(values: list[bytes]) -> bytes:
    out = []
    for delta, value in enumerate(values):
        body = b"\x00" + _varint(0) + _varint(delta) + _varint(-1)
        body += _varint(len(value)) + value + _varint(0)
        out.append(_varint(len(body)) + body)
    return b"".join(out)


def compress(codec: int, data: bytes) -> bytes:
    if codec == 1:
        return gzip.compress(data, 6)
    if codec == 2:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == 3:
        return lz4.frame.compress(data, block_linked=False)  # as Kafka reads them
    if codec == 4:
        return zstandard.ZstdCompressor(level=3).compress(data)
    return data


def batch(codec: int, kind: str, seed: int) -> bytes:
    rng = random.Random(seed)
    if kind == "x":  # what the throughput benchmark sends
        values = [b"x" * RECORD_SIZE] * BATCH_RECORDS
    else:  # text-like: compresses about 2:1
        words = [bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9)))
                 for _ in range(2000)]
        values = [b" ".join(rng.choices(words, k=200))[:RECORD_SIZE]
                  for _ in range(BATCH_RECORDS)]
    now = int(time.time() * 1000)
    return build_batch(compress(codec, records(values)), record_count=BATCH_RECORDS,
                       base_timestamp=now, max_timestamp=now, attributes=codec)


async def run_codec(engine: StorageEngine, codec_name: str, mib: int, kind: str) -> dict:
    codec = CODECS[codec_name]
    topic = f"bench-{codec_name}"
    await engine.create_topic(topic, 1, {})
    tablet = engine.partition(topic, 0)
    samples = [batch(codec, kind, seed) for seed in range(8)]
    count = max(1, mib * (1 << 20) // (RECORD_SIZE * BATCH_RECORDS))
    in_flight: set[asyncio.Future] = set()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for i in range(count):
        in_flight.add(tablet.append(samples[i % len(samples)], int(time.time() * 1000)))
        if len(in_flight) >= IN_FLIGHT:
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                future.result()
    for future in in_flight:
        await future
    elapsed = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    gigabytes = count * BATCH_RECORDS * RECORD_SIZE / 1e9
    return {"codec": codec_name, "records_per_s": count * BATCH_RECORDS / elapsed,
            "cpu_s_per_gb": cpu / gigabytes, "mb_per_s": gigabytes * 1e3 / elapsed,
            "wire_ratio": sum(map(len, samples)) / (len(samples) * BATCH_RECORDS * RECORD_SIZE)}


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        engine = StorageEngine(data_dir, EngineSettings(fsync="never"))
        engine.start(asyncio.get_running_loop())
        try:
            for name in args.codecs.split(","):
                r = await run_codec(engine, name, args.mib, args.values)
                print(f"{r['codec']:7s} {r['records_per_s'] / 1e3:8.0f} k records/s "
                      f"{r['mb_per_s']:7.0f} MB/s {r['cpu_s_per_gb']:6.2f} CPU s/GB "
                      f"(wire {r['wire_ratio']:.2f} of the records' size)", flush=True)
        finally:
            engine.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256, help="MiB of records per codec")
    parser.add_argument("--codecs", default=",".join(CODECS))
    parser.add_argument("--values", choices=("x", "text"), default="text",
                        help="x: b'x'*1024 as the throughput benchmark; text: ~2:1 compressible")
    asyncio.run(main(parser.parse_args()))
