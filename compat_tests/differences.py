"""The table of intended differences from Apache Kafka 3.4.1, for the differential tests.

Each entry names where a difference shows (``step:field path``, ``*`` for
anything), what each server answers there, and its entry in docs/compatibility.md,
"Differences from Apache Kafka", which gives the reason. A difference found
and not listed here fails the test that found it; so does an entry whose
difference no longer shows in the steps that ran. test_differential_admin
checks that every ``doc`` named here is in the docs.
"""

from __future__ import annotations

from testkit.differential import ABSENT, ANY, Expected


def _is_partial_batch(value: object) -> bool:
    return isinstance(value, dict) and "partial_bytes" in value


def _is_text(value: object) -> bool:
    return isinstance(value, str) and len(value) > 20


EXPECTED: list[Expected] = [
    # Free text: the gateway explains an error where Kafka leaves the message null.
    Expected("*:*error_message", kafka=None, gateway="<message>", doc="error messages",
             required=False),
    # compression.type is kept, but batches stay as the producer compressed them.
    *(Expected(f"describe/compression-type-fetch:*.records[0].{field}", doc="compression.type")
      for field in ("attributes", "batch_length", "crc")),
    # Kafka's own failures, where the gateway answers with the protocol's error.
    Expected("config/alter-unknown-operation:responses[0].error_code",
             kafka="unknown_server_error", gateway="invalid_request",
             doc="unknown config operation"),
    Expected("config/alter-32k-value:responses[0].error_code",
             kafka="unknown_server_error", gateway="invalid_config", doc="32 KB config value"),
    # No dynamic broker configs.
    Expected("config/alter-broker:responses[0].error_code", kafka="none",
             gateway="invalid_request", doc="dynamic broker configs"),
    *(Expected(f"node/describe-broker:results[0].configs.{name}.read_only", kafka=False,
               gateway=True, doc="dynamic broker configs")
      for name in ("log.retention.ms", "log.retention.bytes", "message.max.bytes")),
    # Auto-creation: the gateway creates the topic before it answers.
    Expected("metadata/auto-create-first:topics.*.error_code",
             kafka=lambda v: v in ("unknown_topic_or_partition", "leader_not_available"),
             gateway="none", doc="auto-created topics"),
    Expected("metadata/auto-create-first:topics.*.topic_id", kafka=None, gateway=ANY,
             doc="auto-created topics"),
    Expected("metadata/auto-create-first:topics.*.partitions.0", kafka=ABSENT, gateway=ANY,
             doc="auto-created topics"),
    Expected("collision/auto-create:topics.*.error_code", kafka="unknown_topic_or_partition",
             gateway="invalid_topic_exception", doc="auto-created topics"),
    # Kafka's documentation strings are not shipped.
    Expected("describe/documentation:results[0].configs.retention.ms.documentation",
             kafka=_is_text, gateway=None, doc="config documentation"),
    # A static member replaced by a new instance: whose client id is shown.
    Expected("static/describe:groups[0].members.instance-1-*.client_id",
             kafka="static-first", gateway="static-second", doc="replaced static member"),
    # Max timestamp once DeleteRecords removed every record of a partition.
    *(Expected(f"java-log/list-offsets-*-max-timestamp:[1].p1.{field}", kafka=k, gateway=g,
               doc="max timestamp of deleted records")
      for field, k, g in (("offset", 7, -1), ("timestamp", ANY, -1), ("leader_epoch", 0, None))),
    # Fetch: whole batches only.
    Expected("fetch/partition-limit-200:responses[0].partitions.0.records[*]",
             kafka=_is_partial_batch, gateway=ABSENT, doc="partial batches"),
]
