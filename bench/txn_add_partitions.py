"""python -m bench.txn_add_partitions: what one AddPartitionsToTxn costs the
coordinator as an open transaction grows (issue 19).

One transaction adds the partitions of a topic one call at a time, on a real
storage engine in a temporary directory (no network: the coordinator call,
which includes its store write). Prints the median time per call over each
window of ``--window`` calls, e.g. at the start and after 3,000 partitions:

  python -m bench.txn_add_partitions --partitions 3100 --window 100
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from tablets import StorageEngine
from txn import TransactionCoordinator


async def measure(data_dir: str, partitions: int) -> list[float]:
    """Seconds per add_partitions call, the n-th call adding partition n."""
    engine = StorageEngine(data_dir)
    engine.start(asyncio.get_running_loop())
    try:
        await engine.create_topic("many", partitions, {})
        txns = TransactionCoordinator(engine)
        txns.load()
        pid, epoch = await txns.init_producer_id("bench", 60_000)
        times = []
        for index in range(partitions):
            started = time.perf_counter()
            await txns.add_partitions("bench", pid, epoch, [("many", index)])
            times.append(time.perf_counter() - started)
        await txns.end_txn("bench", pid, epoch, False)
        return times
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.txn_add_partitions",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=3100)
    parser.add_argument("--window", type=int, default=100)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="txn-add-") as scratch:
        times = asyncio.run(measure(scratch, args.partitions))
    for start in range(0, len(times), args.window):
        window = times[start:start + args.window]
        if start == 0 or start + args.window >= len(times) or start % 1000 == 0:
            print(f"partitions {start:>6}..{start + len(window) - 1:<6} median "
                  f"{statistics.median(window) * 1000:.3f} ms per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
