"""python -m bench.fuzz: a long structure-aware fuzzing run against a gateway subprocess.

The same frames as tests/test_fuzz.py (testkit/fuzz.py: the boundary sweep
of every field of every advertised API and version, then random mutations),
for as many frames as asked:

  python -m bench.fuzz --frames 500000 --seed 7
  python -m bench.fuzz --frames 200000 --seed 1 --by-api      # outcomes per API version

Prints the totals; exits 1 if the gateway crashed, an answer went to the
wrong request, a handler raised, or the canary lost an acknowledged batch.
The gateway's log is kept next to its data directory (``--data-dir``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from testkit.fuzz_run import GATEWAY_FLAGS, run
from testkit.gateway import GatewayProcess


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=500_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=8, help="connections sending at once")
    parser.add_argument("--wait", type=float, default=1.0,
                        help="seconds to wait for an answer before closing the connection")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="the gateway's data directory (default: a new temporary one)")
    parser.add_argument("--by-api", action="store_true", help="outcomes per API version")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="fuzz-") as scratch:
        data_dir = args.data_dir or Path(scratch) / "data"
        with GatewayProcess(data_dir, *GATEWAY_FLAGS) as gateway:
            print(f"fuzzing {gateway.bootstrap} with {args.frames} frames, seed {args.seed}; "
                  f"log: {gateway.log_path}", flush=True)
            totals = run(gateway, args.frames, args.seed, args.workers, args.wait)
    print(totals.line())
    if args.by_api:
        table: dict[str, dict[str, int]] = defaultdict(dict)
        for key, count in totals.by_api.items():
            name, outcome = key.rsplit(" ", 1)
            table[name][outcome] = count
        for name in sorted(table):
            print(f"  {name:32} " + ", ".join(f"{k} {v}" for k, v in sorted(table[name].items())))
    return 0 if totals.ok else 1


if __name__ == "__main__":
    sys.exit(main())
