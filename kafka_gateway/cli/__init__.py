"""``kafka-gateway``: run the gateway, or manage a running one.

    kafka-gateway serve [--listen HOST:PORT] [--data-dir DIR] [...]
    kafka-gateway topics list|describe|create|delete|alter [...]
    kafka-gateway groups list|describe|delete|delete-offsets|reset-offsets [...]
    kafka-gateway transactions list|describe|producers|abort [...]
    kafka-gateway produce|consume --topic TOPIC [...]
    kafka-gateway users add|delete|list [...]
    kafka-gateway acls list|add|remove [...]

Every command but ``serve`` speaks the Kafka protocol to the gateway (or to any
Kafka broker) named by --bootstrap-server, which may come anywhere on the line,
like kafka-topics.sh, kafka-consumer-groups.sh, kafka-transactions.sh and the
console producer and consumer. ``kafka-gateway COMMAND --help`` tells more.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import sys

from .. import settings
from ..allocator import tune_malloc
from .common import add_client_options
from .console import add_console_parsers, run_consume, run_produce
from .groups import add_groups_parser, run_groups
from .security import add_security_parsers, run_acls, run_users
from .topics import add_topics_parser, run_topics
from .transactions import add_transactions_parser, run_transactions


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        _serve(args)
    elif args.command == "groups":
        sys.exit(asyncio.run(run_groups(args)))
    elif args.command == "transactions":
        sys.exit(asyncio.run(run_transactions(args)))
    elif args.command == "produce":
        sys.exit(run_produce(args))
    elif args.command == "consume":
        sys.exit(run_consume(args))
    elif args.command == "users":
        sys.exit(asyncio.run(run_users(args)))
    elif args.command == "acls":
        sys.exit(asyncio.run(run_acls(args)))
    else:
        sys.exit(asyncio.run(run_topics(args)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    # As Kafka's tools (kafka-topics.sh --version prints "3.4.1 (Commit:...)"): the
    # version of the installed distribution, so a wheel and its metadata agree.
    parser.add_argument("--version", action="version", version=_version(),
                        help="print the version of kafka-gateway and exit")
    add_client_options(parser)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway",
                                description="Run the gateway until SIGTERM or SIGINT.")
    settings.add_arguments(serve)
    serve.add_argument("--log-level", default="INFO",
                       choices=("DEBUG", "INFO", "WARNING", "ERROR"), type=str.upper,
                       help="least severe log lines printed (default INFO)")

    add_topics_parser(commands)
    add_groups_parser(commands)
    add_transactions_parser(commands)
    add_console_parsers(commands)
    add_security_parsers(commands)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("kafka-gateway")
    except importlib.metadata.PackageNotFoundError:  # a source tree run without pip install
        from .. import __version__

        return f"{__version__} (source tree, not installed)"


def _serve(args: argparse.Namespace) -> None:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = settings.from_arguments(args)
    except (ValueError, OSError) as exc:
        sys.exit(f"kafka-gateway: {exc}")
    tune_malloc()  # before the first batch is allocated (allocator.py)
    import uvloop

    from ..server import serve

    uvloop.run(serve(config))
