"""``kafka-gateway users`` and ``kafka-gateway acls``: SCRAM users and ACLs, like
``kafka-configs.sh --entity-type users`` and ``kafka-acls.sh``.

    kafka-gateway users add alice --password s3cret [--mechanism SCRAM-SHA-512]
    kafka-gateway users delete alice [--mechanism SCRAM-SHA-256]
    kafka-gateway users list
    kafka-gateway acls add --allow-principal User:alice --operation Read --topic orders
    kafka-gateway acls list [--topic orders] [--principal User:alice]
    kafka-gateway acls remove --allow-principal User:alice --operation Read --topic orders

Both speak the Kafka protocol (Describe/AlterUserScramCredentials,
Describe/Create/DeleteAcls) to ``--bootstrap-server``, through a listener's
security given as Kafka tools take it: ``--command-config FILE`` with
``security.protocol``, ``sasl.mechanism``, ``sasl.jaas.config`` and
``ssl.truststore.location``. ``users`` also works on a stopped gateway's
store with ``--data-dir`` (the first user of a SASL-only gateway, as
``kafka-storage format --add-scram`` does for Kafka). A password given
neither with ``--password`` nor in ``$KAFKA_GATEWAY_PASSWORD`` is read from
the terminal.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import os
import sys

from kio.schema.alter_user_scram_credentials.v0 import request as alter_scram
from kio.schema.create_acls.v3 import request as create_acls
from kio.schema.delete_acls.v3 import request as delete_acls
from kio.schema.describe_acls.v3 import request as describe_acls
from kio.schema.describe_user_scram_credentials.v0 import request as describe_scram
from kio.schema.errors import ErrorCode

from ..cluster_client import ClusterClient
from ..security.acls import Operation, PatternType, Permission, ResourceType
from ..security.scram import BY_CODE, DEFAULT_ITERATIONS, MECHANISMS, Credentials, from_password
from .common import client_command, connect

_OPERATIONS = {op.name.lower().replace("_", ""): op for op in Operation
               if op not in (Operation.UNKNOWN, Operation.ANY)}
_PATTERNS = {"literal": PatternType.LITERAL, "prefixed": PatternType.PREFIXED,
             "any": PatternType.ANY, "match": PatternType.MATCH}


def add_security_parsers(commands: argparse._SubParsersAction) -> None:
    users = client_command(commands, "users", help="SCRAM users (SASL PLAIN and SCRAM logins)")
    users.add_argument("--data-dir", help="change a stopped gateway's store directly")
    actions = users.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="create a user or set its password")
    add.add_argument("name", help="the user (the SASL username)")
    add.add_argument("--password", help="its password (default: $KAFKA_GATEWAY_PASSWORD)")
    add.add_argument("--mechanism", action="append", choices=sorted(MECHANISMS),
                     help="default: both SCRAM-SHA-256 and SCRAM-SHA-512")
    add.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                     help=f"SCRAM iterations (default {DEFAULT_ITERATIONS})")
    delete = actions.add_parser("delete", help="delete a user's credentials")
    delete.add_argument("name", help="the user")
    delete.add_argument("--mechanism", action="append", choices=sorted(MECHANISMS),
                        help="default: every mechanism it has")
    actions.add_parser("list", help="users with their mechanisms and iterations")

    acls = client_command(commands, "acls", help="ACLs (with authorizer.class.name set)")
    verbs = acls.add_subparsers(dest="action", required=True)
    for verb, text in (("list", "ACLs matching the filter"), ("add", "create ACLs"),
                       ("remove", "delete the ACLs matching the filter")):
        parser = verbs.add_parser(verb, help=text)
        resources = parser.add_argument_group("resource")
        resources.add_argument("--topic", help="a topic resource (or a prefix, with "
                                                    "--resource-pattern-type prefixed)")
        resources.add_argument("--group", help="a consumer group resource")
        resources.add_argument("--transactional-id", help="a transactional id resource")
        resources.add_argument("--cluster", action="store_true",
                               help="the cluster resource (admin operations)")
        default = "literal" if verb == "add" else "any"
        parser.add_argument("--resource-pattern-type", choices=sorted(_PATTERNS),
                            default=default,
                            help=f"how the resource name matches (default {default})")
        if verb == "list":
            parser.add_argument("--principal", help="only ACLs of this principal (User:NAME)")
            continue
        parser.add_argument("--allow-principal", action="append", default=[],
                            help="principal allowed (User:NAME, repeatable)")
        parser.add_argument("--deny-principal", action="append", default=[],
                            help="principal denied (User:NAME, repeatable)")
        parser.add_argument("--allow-host", action="append", default=[],
                            help="host allowed from (default: any, *)")
        parser.add_argument("--deny-host", action="append", default=[],
                            help="host denied from (default: any, *)")
        parser.add_argument("--operation", action="append", default=[],
                            help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
                                 "DescribeConfigs, AlterConfigs, IdempotentWrite, All")


async def _connect(args: argparse.Namespace) -> ClusterClient:
    return await connect(args)


def _password(args: argparse.Namespace) -> str:
    password = args.password or os.environ.get("KAFKA_GATEWAY_PASSWORD")
    if not password:
        password = getpass.getpass(f"password of {args.name}: ") if sys.stdin.isatty() else (
            sys.stdin.readline().rstrip("\n"))
    if not password:
        raise SystemExit("users add: an empty password")
    return password


# ------------------------------------------------------------------- users
async def run_users(args: argparse.Namespace) -> int:
    if args.data_dir:
        return _users_offline(args)
    client = await _connect(args)
    try:
        if args.action == "list":
            answer = await client.request(describe_scram.DescribeUserScramCredentialsRequest(
                users=None))
            _check(answer.error_code, answer.error_message, "users list")
            for result in answer.results:
                _print_user(result.user, [(BY_CODE[c.mechanism], c.iterations)
                                          for c in result.credential_infos])
            return 0
        mechanisms = args.mechanism or sorted(MECHANISMS)
        if args.action == "add":
            password = _password(args).encode()
            upsertions = []
            for name in mechanisms:
                salt = os.urandom(32)
                digest = MECHANISMS[name][0]().name
                upsertions.append(alter_scram.ScramCredentialUpsertion(
                    name=args.name, mechanism=MECHANISMS[name][1], iterations=args.iterations,
                    salt=salt, salted_password=hashlib.pbkdf2_hmac(
                        digest, password, salt, args.iterations)))
            request = alter_scram.AlterUserScramCredentialsRequest(
                deletions=(), upsertions=tuple(upsertions))
        else:
            if not args.mechanism:
                answer = await client.request(describe_scram.DescribeUserScramCredentialsRequest(
                    users=(describe_scram.UserName(name=args.name),)))
                [result] = answer.results
                _check(result.error_code, result.error_message, f"users delete {args.name}")
                mechanisms = [BY_CODE[c.mechanism] for c in result.credential_infos]
            request = alter_scram.AlterUserScramCredentialsRequest(upsertions=(), deletions=tuple(
                alter_scram.ScramCredentialDeletion(name=args.name, mechanism=MECHANISMS[m][1])
                for m in mechanisms))
        answer = await client.request(request)
        for result in answer.results:
            _check(result.error_code, result.error_message, f"users {args.action} {result.user}")
        print(f"{'Set' if args.action == 'add' else 'Deleted'} {', '.join(mechanisms)} "
              f"credentials of {args.name}.")
        return 0
    finally:
        await client.close()


def _users_offline(args: argparse.Namespace) -> int:
    from tablets import open_node_records

    records = open_node_records(args.data_dir, "scram")
    try:
        credentials = Credentials(records)
        users = credentials.users()
        if args.action == "list":
            for user, found in users.items():
                _print_user(user, [(c.mechanism, c.iterations) for c in found])
            return 0
        if args.action == "add":
            password = _password(args)
            mechanisms = args.mechanism or sorted(MECHANISMS)
            credentials.change_now([(args.name, from_password(m, password, args.iterations))
                                    for m in mechanisms], [])
            print(f"Set {', '.join(mechanisms)} credentials of {args.name}.")
            return 0
        have = [c.mechanism for c in users.get(args.name, [])]
        mechanisms = args.mechanism or have
        missing = [m for m in mechanisms if m not in have]
        if missing or not mechanisms:
            raise SystemExit(f"users delete {args.name}: no {', '.join(missing) or 'SCRAM'} "
                             "credential")
        credentials.change_now([], [(args.name, m) for m in mechanisms])
        print(f"Deleted {', '.join(mechanisms)} credentials of {args.name}.")
        return 0
    finally:
        records.close()


def _print_user(user: str, credentials: list[tuple[str, int]]) -> None:
    print(f"{user}\t" + ", ".join(f"{m} (iterations {i})" for m, i in credentials))


# -------------------------------------------------------------------- acls
def _resource(args: argparse.Namespace, required: bool) -> tuple[ResourceType, str | None]:
    chosen = [(ResourceType.TOPIC, args.topic), (ResourceType.GROUP, args.group),
              (ResourceType.TRANSACTIONAL_ID, args.transactional_id),
              (ResourceType.CLUSTER, "kafka-cluster" if args.cluster else None)]
    given = [(rtype, name) for rtype, name in chosen if name is not None]
    if len(given) > 1:
        raise SystemExit("acls: name one resource (--topic, --group, --transactional-id or "
                         "--cluster)")
    if not given:
        if required:
            raise SystemExit("acls: --topic, --group, --transactional-id or --cluster is needed")
        return ResourceType.ANY, None
    return given[0]


def _operation(name: str) -> Operation:
    found = _OPERATIONS.get(name.lower().replace("_", "").replace("-", ""))
    if found is None:
        raise SystemExit(f"acls: unknown operation {name!r}")
    return found


def _entries(args: argparse.Namespace) -> list[tuple[str, str, Operation, Permission]]:
    """(principal, host, operation, permission) of --allow/--deny-principal x --operation."""
    operations = [_operation(op) for op in args.operation] or [Operation.ANY]
    out = []
    for principals, hosts, permission in (
            (args.allow_principal, args.allow_host, Permission.ALLOW),
            (args.deny_principal, args.deny_host, Permission.DENY)):
        for principal in principals:
            for host in hosts or ["*"]:
                out.extend((principal, host, op, permission) for op in operations)
    return out


async def run_acls(args: argparse.Namespace) -> int:
    pattern = _PATTERNS[args.resource_pattern_type]
    client = await _connect(args)
    try:
        if args.action == "list":
            rtype, name = _resource(args, required=False)
            answer = await client.request(describe_acls.DescribeAclsRequest(
                resource_type_filter=rtype, resource_name_filter=name,
                pattern_type_filter=pattern, principal_filter=args.principal, host_filter=None,
                operation=Operation.ANY, permission_type=Permission.ANY))
            _check(answer.error_code, answer.error_message, "acls list")
            for resource in answer.resources:
                print(f"Current ACLs for resource `ResourcePattern(resourceType="
                      f"{ResourceType(resource.resource_type).name}, name={resource.resource_name}"
                      f", patternType={PatternType(resource.pattern_type).name})`:")
                for entry in resource.acls:
                    print(f"\t(principal={entry.principal}, host={entry.host}, operation="
                          f"{Operation(entry.operation).name}, permissionType="
                          f"{Permission(entry.permission_type).name})")
            return 0
        rtype, name = _resource(args, required=args.action == "add")
        entries = _entries(args)
        if args.action == "add":
            if not entries or any(op is Operation.ANY for _p, _h, op, _perm in entries):
                raise SystemExit("acls add: give --allow-principal or --deny-principal and "
                                 "--operation")
            answer = await client.request(create_acls.CreateAclsRequest(creations=tuple(
                create_acls.AclCreation(resource_type=rtype, resource_name=name,
                                        resource_pattern_type=pattern, principal=principal,
                                        host=host, operation=op, permission_type=permission)
                for principal, host, op, permission in entries)))
            for result in answer.results:
                _check(result.error_code, result.error_message, "acls add")
            print(f"Added {len(entries)} ACL(s).")
            return 0
        filters = [(p, h, op, perm) for p, h, op, perm in entries] or [
            (None, None, Operation.ANY, Permission.ANY)]
        answer = await client.request(delete_acls.DeleteAclsRequest(filters=tuple(
            delete_acls.DeleteAclsFilter(
                resource_type_filter=rtype, resource_name_filter=name,
                pattern_type_filter=pattern, principal_filter=principal, host_filter=host,
                operation=op, permission_type=permission)
            for principal, host, op, permission in filters)))
        removed = 0
        for result in answer.filter_results:
            _check(result.error_code, result.error_message, "acls remove")
            removed += len(result.matching_acls)
        print(f"Removed {removed} ACL(s).")
        return 0
    finally:
        await client.close()


def _check(code: ErrorCode, message: str | None, what: str) -> None:
    if code is not ErrorCode.none:
        raise SystemExit(f"{what}: {code.name.upper()}{': ' + message if message else ''}")
