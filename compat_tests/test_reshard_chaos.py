"""The exactly-once resharding check with confluent-kafka workers
(compat_tests/reshard_chaos.py): workers SIGKILLed, hung past their session
timeout and resumed (zombies), the gateway killed with ``kill -9`` - and
afterwards every source record is in the target exactly once, in order."""

from __future__ import annotations

from reshard_chaos import python_worker, run


def test_reshard_exactly_once_under_chaos(gateway, tmp_path):
    report = run(gateway, python_worker, rounds=6, messages=3000, seed=20261123,
                 log_dir=tmp_path)
    print("\nreshard (confluent-kafka workers):", report.line(), report.events)
    assert report.kills + report.hangs + report.restarts == 6
    assert (report.lost, report.duplicated, report.reordered) == (0, 0, 0), report.line()
