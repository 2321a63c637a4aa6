"""A confluent-kafka transactional producer in its own process, for kill -9 tests.

    python txn_commit_worker.py BOOTSTRAP TRANSACTIONAL_ID RECORDS TOPIC:PARTITIONS...

It opens one transaction, writes RECORDS records to every partition of the
topics, flushes, prints ``committing``, commits, prints ``committed`` and
then waits to be killed (at most a minute). The test kills it, and the
gateway, while the commit is under way.
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Producer


def main() -> None:
    bootstrap, transactional_id, records, *specs = sys.argv[1:]
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "linger.ms": 5})
    producer.init_transactions(30)
    producer.begin_transaction()
    for spec in specs:
        topic, partitions = spec.rsplit(":", 1)
        for partition in range(int(partitions)):
            for i in range(int(records)):
                producer.produce(topic, value=f"{topic}:{partition}:{i}".encode(),
                                 partition=partition)
                producer.poll(0)
    assert producer.flush(30) == 0
    print("committing", flush=True)
    producer.commit_transaction(30)
    print("committed", flush=True)
    time.sleep(60)


if __name__ == "__main__":
    main()
