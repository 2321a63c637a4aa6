"""/metrics in the Prometheus text format, rendered by ``prometheus_client``.

The request path only bumps plain counters (``metrics.py``, the store's
``WriterStats``); this collector reads them, the partitions, the groups'
committed offsets and the transaction coordinator at scrape time, so a
scrape costs what it reads and a request costs nothing more. Every name
starts with ``kafka_gateway_``; docs/operations.md lists them all.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from common.clock import now_ms
from common.histogram import Histogram
from tablets.seam import NodeStorage

from .apis import APIS
from .cluster_metrics import cluster_families
from .context import HandlerContext
from .important_metrics import important_families

PREFIX = "kafka_gateway_"
API_NAMES = sorted(api.name for api in APIS.values())


def render(broker: HandlerContext) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(broker))
    return generate_latest(registry)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def _add_histogram(family: HistogramMetricFamily, labels: list[str], hist: Histogram) -> None:
    family.add_metric(labels, [(floatToGoString(bound), count)
                               for bound, count in hist.cumulative()], hist.total)


class GatewayCollector(Collector):
    def __init__(self, broker: HandlerContext) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        yield from self._requests()
        yield from self._traffic()
        yield from self._store()
        yield from self._partitions()
        yield from self._groups()
        yield from self._transactions()
        yield from compaction_families(self.broker.engine)
        yield from important_families(self.broker.engine)  # important_metrics.py
        yield from cluster_families(self.broker.engine)  # cluster_metrics.py

    def _requests(self) -> Iterator[Metric]:
        metrics = self.broker.metrics
        # Every API has its series from the start (at 0), so rate() and alerts see
        # the first request too.
        requests = CounterMetricFamily(PREFIX + "requests", "Requests served, per API",
                                       labels=["api"])
        failed = CounterMetricFamily(
            PREFIX + "request_errors",
            "Requests whose handler failed (the connection was closed), per API",
            labels=["api"])
        for api in API_NAMES:
            requests.add_metric([api], metrics.requests.get(api, 0))
            failed.add_metric([api], metrics.request_errors.get(api, 0))
        yield requests
        yield failed
        codes = CounterMetricFamily(
            PREFIX + "response_errors",
            "Error codes in answers (per partition, resource or request), per API and error",
            labels=["api", "error"])
        for (api, error), count in sorted(metrics.response_errors.items()):
            codes.add_metric([api, error], count)
        yield codes
        latency = HistogramMetricFamily(PREFIX + "request_seconds",
                                        "Time from reading a request to its answer, per API",
                                        labels=["api"])
        for api, hist in sorted(metrics.latency.items()):
            _add_histogram(latency, [api], hist)
        yield latency
        lag = HistogramMetricFamily(
            PREFIX + "event_loop_lag_seconds",
            "How late the event loop ran a timer (sampled every 250 ms)")
        _add_histogram(lag, [], metrics.loop_lag)
        yield lag

    def _traffic(self) -> Iterator[Metric]:
        metrics = self.broker.metrics
        yield _counter("bytes_in", "Bytes read from client sockets", metrics.bytes_in)
        yield _counter("bytes_out", "Bytes written to client sockets", metrics.bytes_out)
        yield _counter("produced_bytes", "Bytes of record batches produced",
                       metrics.produced_bytes)
        yield _counter("fetched_bytes", "Bytes of record batches fetched", metrics.fetched_bytes)
        engine = self.broker.engine
        for name, doc, counts in (
                ("topic_bytes_in", "Bytes of record batches produced, per topic",
                 metrics.topic_bytes_in),
                ("topic_bytes_out", "Bytes of record batches fetched, per topic",
                 metrics.topic_bytes_out)):
            family = CounterMetricFamily(PREFIX + name, doc, labels=["topic"])
            for topic_id in list(counts):
                topic = engine.topic_by_id(topic_id)
                if topic is None:  # deleted: its series ends, as in Kafka
                    del counts[topic_id]
                    continue
                family.add_metric([topic.name], counts[topic_id])
            yield family
        yield _gauge("connections", "Open client connections", metrics.connections)
        # Not "connections_total": that would be a second family named "connections".
        yield _counter("connections_accepted", "Client connections accepted",
                       metrics.connections_total)
        yield _counter("bad_frames", "Malformed or oversized frames (connection closed)",
                       metrics.bad_frames)
        yield _counter("response_write_failures",
                       "Answers the socket refused to take (the connection closed unanswered)",
                       metrics.response_write_failures)
        yield _counter("sendfile_bytes",
                       "Record bytes sent from segment files with os.sendfile (plaintext)",
                       metrics.sendfile_bytes)
        yield _counter("file_region_read_bytes",
                       "Record bytes read from segment files to be sent (TLS listeners)",
                       metrics.file_region_read_bytes)
        yield _counter("log_lines_suppressed", "Bad-input log lines over the per-address rate",
                       metrics.log_lines_suppressed)
        yield _counter("connections_expired", "Connections closed idle or stalled mid-frame",
                       metrics.connections_expired)
        yield _counter("authentication_successes", "SASL authentications that succeeded",
                       metrics.authentication_successes)
        yield _counter("authentication_failures",
                       "SASL authentications refused (credentials, mechanism, messages)",
                       metrics.authentication_failures)
        yield _counter("tls_handshake_failures",
                       "TLS handshakes that failed (plaintext on a TLS port, certificates)",
                       metrics.tls_handshake_failures)
        yield _counter("authorization_failures", "Operations an ACL (or no ACL) denied",
                       metrics.authorization_failures)
        yield _gauge("tls_handshakes_in_progress",
                     "Connections to TLS listeners whose TLS handshake is not done",
                     metrics.tls_handshakes_in_progress)
        yield _counter("tls_handshake_timeouts",
                       "Connections closed for gateway.ssl.handshake.timeout.ms",
                       metrics.tls_handshake_timeouts)
        refused = CounterMetricFamily(
            PREFIX + "connections_refused",
            "New connections closed at once for a limit (max.connections, "
            "max.connections.per.ip)", labels=["limit"])
        for limit in ("max.connections", "max.connections.per.ip"):
            refused.add_metric([limit], metrics.connections_refused.get(limit, 0))
        yield refused
        yield _gauge("request_memory_bytes",
                     "Request buffers charged to queued.max.request.bytes",
                     metrics.request_memory_bytes)

    def _store(self) -> Iterator[Metric]:
        engine = self.broker.engine
        stats = engine.write_stats()
        yield _counter("store_writes", "Store writes: RocksDB writes, or PostgreSQL "
                       "transactions with --store (one per group commit)", stats.writes)
        yield _counter("store_loop_writes", "Of those, small ones made on the event loop "
                       "while the writer thread was idle", stats.loop_writes)
        yield _counter("store_changes", "Atomic changes written (several per group commit)",
                       stats.changes)
        yield _counter("store_fsyncs", "Group commits fsynced", stats.fsyncs)
        yield _counter("store_written_bytes", "Bytes of keys and values written",
                       stats.bytes)
        yield _counter("store_write_seconds", "Time spent in store writes",
                       stats.write_seconds)
        latency = HistogramMetricFamily(PREFIX + "store_write_latency_seconds",
                                        "Duration of one store write (a group commit)")
        _add_histogram(latency, [], stats.write_latency)
        yield latency
        sizes = HistogramMetricFamily(PREFIX + "store_group_commit_changes",
                                      "Atomic changes gathered into one store write")
        _add_histogram(sizes, [], stats.group_sizes)
        yield sizes
        yield _gauge("store_failed",
                     "1 once a store write failed: writes are refused until a restart",
                     int(engine.store_failure() is not None))
        yield _gauge("topics", "Topics", len(engine.list_topics()))

    def _partitions(self) -> Iterator[Metric]:
        labels = ["topic", "partition"]
        high = GaugeMetricFamily(PREFIX + "high_watermark", "High watermark (log end offset)",
                                 labels=labels)
        start = GaugeMetricFamily(PREFIX + "log_start_offset", "Log start offset",
                                  labels=labels)
        size = GaugeMetricFamily(PREFIX + "partition_bytes", "Bytes of record batches stored",
                                 labels=labels)
        for topic in self.broker.engine.list_topics():
            for tablet in topic.partitions:
                values = [topic.name, str(tablet.partition)]
                high.add_metric(values, tablet.high_watermark)
                start.add_metric(values, tablet.log_start_offset)
                size.add_metric(values, tablet.size_bytes)
        yield from (high, start, size)

    def _groups(self) -> Iterator[Metric]:
        groups = self.broker.groups
        yield _counter("group_rebalances", "Completed group rebalances", groups.rebalances)
        states = GaugeMetricFamily(PREFIX + "groups", "Consumer groups, per state",
                                   labels=["state"])
        counts: dict[str, int] = {}
        for _group_id, _protocol, state in groups.list_groups():
            counts[state] = counts.get(state, 0) + 1
        for state, count in sorted(counts.items()):
            states.add_metric([state], count)
        yield states
        lag = GaugeMetricFamily(
            PREFIX + "consumer_lag",
            "High watermark minus the group's committed offset, per group and partition",
            labels=["group", "topic", "partition"])
        offsets = self.broker.engine.consumer_offsets
        engine = self.broker.engine
        if offsets is not None:
            for group in offsets.groups():
                for (topic, partition), committed in offsets.group_offsets(group).items():
                    if not engine.has_partition(topic, partition):
                        continue
                    tablet = engine.partition(topic, partition)
                    behind = tablet.high_watermark - max(committed.offset,
                                                         tablet.log_start_offset)
                    lag.add_metric([group, topic, str(partition)], max(behind, 0))
        yield lag

    def _transactions(self) -> Iterator[Metric]:
        txns = self.broker.txns
        stats = txns.stats
        yield _counter("txn_commits", "Transactions committed", stats.commits)
        yield _counter("txn_aborts", "Transactions aborted (by the producer or a timeout)",
                       stats.aborts)
        yield _counter("txn_timeouts", "Transactions aborted for passing their timeout",
                       stats.timeouts)
        yield _counter("txn_conflicts",
                       "Commits refused by the offset-range conflict check", stats.conflicts)
        yield _counter("txn_fenced", "Requests of fenced producers refused", stats.fenced)
        yield _counter("txn_stale_end_txn", "EndTxn of a finished transaction refused",
                       stats.stale_end_txn)
        yield _gauge("txn_open", "Open transactions", txns.open_count)
        yield _gauge("transactional_ids",
                     "Transactional ids known (kept until transactional.id.expiration.ms)",
                     len(txns.txns))
        yield _gauge("txn_pending_stored_bytes",
                     "Batches of open transactions stored until their commit (limits: "
                     "gateway.txn.pending.disk.bytes, gateway.txn.max.bytes)",
                     txns.pending_bytes)
        yield _gauge("txn_pending_memory_bytes",
                     "Batches of open transactions also held in memory "
                     "(gateway.txn.pending.memory.bytes)", txns.pending_memory_bytes)
        over = CounterMetricFamily(
            PREFIX + "txn_pending_limit_doomed",
            "Transactions doomed (abort only) because a batch would have crossed a "
            "pending-bytes limit, per limit (transaction: gateway.txn.max.bytes, node: "
            "gateway.txn.pending.disk.bytes)", labels=["limit"])
        for limit, count in sorted(stats.over_limit.items()):
            over.add_metric([limit], count)
        yield over
        kept, evicted = self.broker.engine.producer_stats()
        yield _gauge("producer_ids", "Producer ids whose sequences partitions keep", kept)
        yield _counter("producer_ids_evicted", "Producer ids forgotten to stay within "
                       "gateway.producer.state.max.per.partition", evicted)


def compaction_families(engine: NodeStorage) -> Iterator[Metric]:
    """The log cleaner's totals, and per compacted partition what is
    cleanable now and how far compaction has got."""
    stats = engine.cleaner_stats()
    now = now_ms()
    labels = ["topic", "partition"]
    per_partition = {
        name: family(PREFIX + name, doc, labels=labels)
        for name, doc, family in (
            ("compaction_cleanable_bytes", "Bytes of closed segments not compacted yet",
             GaugeMetricFamily),
            ("compaction_dirty_ratio", "Dirty share of the cleanable log (compacts at "
             "min.cleanable.dirty.ratio)", GaugeMetricFamily),
            ("compaction_lag_ms", "Age of the oldest record not compacted yet",
             GaugeMetricFamily),
            ("compaction_clean_offset", "Offset up to which the log is compacted",
             GaugeMetricFamily),
            ("compaction_partition_runs", "Compaction runs of this partition",
             CounterMetricFamily),
            ("compaction_partition_bytes_reclaimed", "Bytes compaction removed from this "
             "partition", CounterMetricFamily),
        )
    }
    uncleanable = 0
    for each in engine.compaction_statuses(now):
        status = each.status
        uncleanable += status.failure is not None
        lag = now - status.dirty_since_ms if status.dirty_since_ms > 0 else 0
        values = [each.topic, str(each.partition)]
        for name, value in (
                ("compaction_cleanable_bytes", status.cleanable_bytes),
                ("compaction_dirty_ratio", status.dirty_ratio),
                ("compaction_lag_ms", max(lag, 0)),
                ("compaction_clean_offset", each.clean_offset),
                ("compaction_partition_runs", status.runs),
                ("compaction_partition_bytes_reclaimed", status.bytes_reclaimed)):
            per_partition[name].add_metric(values, value)
    yield from per_partition.values()
    for name, doc, value in (
            ("compaction_runs", "Compaction runs", stats.runs),
            ("compaction_chunks", "Compacted chunks swapped into logs", stats.chunks),
            ("compaction_bytes_read", "Bytes the log cleaner read", stats.bytes_read),
            ("compaction_bytes_reclaimed", "Bytes compaction removed", stats.bytes_reclaimed),
            ("compaction_seconds", "Time spent compacting", stats.seconds),
            ("compaction_failures", "Compaction runs that failed", stats.failures)):
        yield CounterMetricFamily(PREFIX + name, doc, value=value)
    yield GaugeMetricFamily(PREFIX + "compaction_running", "1 while a compaction run goes on",
                            value=int(stats.running))
    yield GaugeMetricFamily(PREFIX + "compaction_uncleanable_partitions",
                            "Compacted partitions whose last run failed", value=uncleanable)
