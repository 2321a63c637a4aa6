"""key_value.parse_pairs: the one KEY=VALUE parser of the kafka-gateway commands and
of python -m spark_jobs (which used to carry three copies of it)."""

from __future__ import annotations

import pytest

from common.key_value import parse_pairs


def test_split_at_the_first_equals_sign_and_the_last_repeat_wins():
    assert parse_pairs(["a=1", "b=x=y", "c=", "a=2"], "t") == {"a": "2", "b": "x=y", "c": ""}
    assert parse_pairs([], "t") == {}


def test_an_item_without_equals_sign_ends_the_command_naming_the_option():
    with pytest.raises(SystemExit) as exc:
        parse_pairs(["a=1", "retention.ms"], "kafka-gateway: --config")
    assert str(exc.value) == "kafka-gateway: --config: expected KEY=VALUE, got 'retention.ms'"


def test_the_spark_launcher_refuses_a_bad_conf_before_starting_spark():
    from spark_jobs.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["reshard", "--bootstrap-servers", "h:1", "--source", "s", "--target", "t",
              "--checkpoint", "/nonexistent", "--conf", "spark.ui.enabled"])
    assert str(exc.value) == "spark_jobs: --conf: expected KEY=VALUE, got 'spark.ui.enabled'"
