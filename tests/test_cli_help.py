"""Every option of every ``kafka-gateway`` command is explained, with its default
and, where there is one, the Kafka property behind it; client options parse
anywhere on the line."""

from __future__ import annotations

import argparse
import importlib.metadata
import tomllib
from pathlib import Path

import pytest

from kafka_gateway import settings
from kafka_gateway.cli import build_parser
from kafka_gateway.cli.common import bootstrap_servers
from testkit.cli import run_cli

ROOT = Path(__file__).resolve().parent.parent


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def _options(parser: argparse.ArgumentParser):
    return [a for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_every_option_of_every_command_has_help():
    parsers = list(_parsers(build_parser()))
    assert len(parsers) > 20
    for path, parser in parsers:
        for action in _options(parser):
            assert action.help and len(action.help) > 10, (path, action.option_strings)
        for action in parser._actions:
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert action.help, (path, action.dest)


def test_serve_help_shows_every_default_and_property():
    serve = dict(_parsers(build_parser()))[("serve",)]
    helps = {a.option_strings[0]: a.help for a in _options(serve)}
    for setting in settings.SETTINGS:
        text = helps[setting.flag]
        assert f"[{setting.prop}]" in text and "(default " in text, text
    assert "(default 604800000) [log.retention.ms]" in helps["--log-retention-ms"]
    assert "(default true) [auto.create.topics.enable]" in helps["--auto-create-topics-enable"]
    assert "Produce and Fetch never create" in helps["--auto-create-topics-enable"]
    assert "(default 127.0.0.1:9092) [listeners]" in helps["--listen"]
    assert "(default INFO)" in helps["--log-level"]


def test_client_options_say_default_and_property():
    for path, parser in _parsers(build_parser()):
        for action in _options(parser):
            if action.dest == "bootstrap_server":
                assert "(default 127.0.0.1:9092) [bootstrap.servers]" in action.help, path


@pytest.mark.parametrize("argv", [
    ["--bootstrap-server", "h:1", "topics", "list"],
    ["topics", "--bootstrap-server", "h:1", "list"],
    ["topics", "list", "--bootstrap-server", "h:1"],
    ["groups", "describe", "g", "--bootstrap-server", "h:1"],
    ["groups", "reset-offsets", "--bootstrap-server", "h:1", "--group", "g", "--all-topics",
     "--to-earliest"],
    ["transactions", "list", "--bootstrap-server", "h:1"],
    ["consume", "--topic", "t", "--bootstrap-server", "h:1"],
])
def test_bootstrap_server_anywhere(argv):
    assert bootstrap_servers(build_parser().parse_args(argv)) == [("h", 1)]


def test_bootstrap_server_default_and_list():
    assert bootstrap_servers(build_parser().parse_args(["topics", "list"])) == \
        [("127.0.0.1", 9092)]
    parsed = build_parser().parse_args(["topics", "list", "--bootstrap-server", "a:1,b:2"])
    assert bootstrap_servers(parsed) == [("a", 1), ("b", 2)]
    # the last one given wins, wherever it is
    parsed = build_parser().parse_args(["--bootstrap-server", "a:1", "topics", "list",
                                        "--bootstrap-server", "b:2"])
    assert bootstrap_servers(parsed) == [("b", 2)]


def test_version_prints_the_installed_version_and_exits_0():
    """``kafka-gateway --version`` answers as Kafka's tools do (``kafka-topics.sh
    --version``): the version alone, exit 0, no usage."""
    installed = importlib.metadata.version("kafka-gateway")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert installed == declared
    result = run_cli(None, "--version")
    assert result.stdout == f"{installed}\n"
    assert "usage" not in result.stdout + result.stderr
