"""The exactly-once resharding check (compat_tests/reshard_chaos.py) with
confluent-kafka workers and with Java-client workers: workers SIGKILLed, hung past their session
timeout and resumed (zombies), the gateway killed with ``kill -9`` - and
afterwards every source record is in the target exactly once, in order."""

from __future__ import annotations

from reshard_chaos import java_worker, python_worker, run


def test_reshard_exactly_once_under_chaos(gateway, tmp_path):
    report = run(gateway, python_worker, rounds=6, messages=3000, seed=20261123,
                 log_dir=tmp_path)
    print("\nreshard (confluent-kafka workers):", report.line(), report.events)
    assert report.kills + report.hangs + report.restarts == 6
    assert (report.lost, report.duplicated, report.reordered) == (0, 0, 0), report.line()
    assert report.misrouted == 0


def test_reshard_exactly_once_under_chaos_with_java_workers(gateway, tmp_path):
    """The same check with Java-client 3.4.1 workers (jvm/src/javatxn/ReshardWorker.java):
    KafkaConsumer (read_committed) and a transactional KafkaProducer per worker,
    sendOffsetsToTransaction with the consumer's groupMetadata()."""
    report = run(gateway, java_worker, rounds=6, messages=3000, seed=20261124,
                 log_dir=tmp_path)
    print("\nreshard (Java workers):", report.line(), report.events)
    assert report.kills + report.hangs + report.restarts == 6
    assert (report.lost, report.duplicated, report.reordered) == (0, 0, 0), report.line()
    assert report.misrouted == 0
