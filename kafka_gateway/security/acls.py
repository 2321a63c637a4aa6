"""ACLs in Kafka's model: bindings, filters, and which operations each resource has.

A binding says: *permission* (ALLOW or DENY) for *principal* from *host* to
do *operation* on resources of *resource type* whose name matches
*pattern* (LITERAL: this name, or ``*`` for every name; PREFIXED: names
starting with it). Filters (DescribeAcls, DeleteAcls) match bindings, with
ANY for any value and, for patterns, MATCH for every binding that applies
to one resource name. Codes are the protocol's (AclOperation, ResourceType,
PatternType, AclPermissionType).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeVar


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class Operation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"

# Kafka's AclEntry.supportedOperations (ALL is accepted for every type too).
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[Operation]] = {
    ResourceType.TOPIC: frozenset({Operation.READ, Operation.WRITE, Operation.CREATE,
                                   Operation.DESCRIBE, Operation.DELETE, Operation.ALTER,
                                   Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS}),
    ResourceType.GROUP: frozenset({Operation.READ, Operation.DESCRIBE, Operation.DELETE}),
    ResourceType.CLUSTER: frozenset({Operation.CREATE, Operation.CLUSTER_ACTION,
                                     Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
                                     Operation.IDEMPOTENT_WRITE, Operation.ALTER,
                                     Operation.DESCRIBE}),
    ResourceType.TRANSACTIONAL_ID: frozenset({Operation.DESCRIBE, Operation.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({Operation.DESCRIBE}),
    ResourceType.USER: frozenset({Operation.CREATE_TOKENS, Operation.DESCRIBE_TOKENS}),
}

# Allowing one of these also allows the key (Kafka's ACL inheritance).
IMPLIED_BY: dict[Operation, tuple[Operation, ...]] = {
    Operation.DESCRIBE: (Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE,
                         Operation.ALTER),
    Operation.DESCRIBE_CONFIGS: (Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
}


class InvalidAcl(ValueError):
    """A binding that cannot be created (INVALID_REQUEST)."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def encode(self) -> bytes:
        return json.dumps([int(self.resource_type), self.name, int(self.pattern_type),
                           self.principal, self.host, int(self.operation),
                           int(self.permission)], separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> AclBinding:
        rtype, name, pattern, principal, host, operation, permission = json.loads(raw)
        return cls(ResourceType(rtype), name, PatternType(pattern), principal, host,
                   Operation(operation), Permission(permission))

    def validate(self) -> None:
        """Kafka's checks before an ACL is created."""
        if self.resource_type not in SUPPORTED_OPERATIONS:
            raise InvalidAcl(f"Invalid resource type {self.resource_type.name}")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAcl(f"Invalid pattern type {self.pattern_type.name}")
        if self.pattern_type is PatternType.PREFIXED and self.name == WILDCARD:
            raise InvalidAcl("A prefixed pattern cannot be the wildcard '*'")
        if not self.name:
            raise InvalidAcl("The resource name must not be empty")
        if self.resource_type is ResourceType.CLUSTER and self.name != CLUSTER_NAME:
            raise InvalidAcl(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        kind, sep, name = self.principal.partition(":")
        if not sep or not kind or not name:
            raise InvalidAcl(f"Invalid principal {self.principal!r}: expected TYPE:NAME")
        if not self.host:
            raise InvalidAcl("The host must not be empty (use '*' for every host)")
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            raise InvalidAcl(f"Invalid permission type {self.permission.name}")
        if self.operation is not Operation.ALL and (
                self.operation not in SUPPORTED_OPERATIONS[self.resource_type]):
            raise InvalidAcl(f"Operation {self.operation.name} is not supported by resource "
                             f"type {self.resource_type.name}")

    def applies_to(self, name: str) -> bool:
        """Does this binding's pattern cover resource ``name``?"""
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.name)
        return self.name in (name, WILDCARD)


@dataclass(frozen=True, slots=True)
class AclFilter:
    """None matches any value of a field (the protocol's null or ANY)."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def validate(self) -> None:
        for value, enum in ((self.resource_type, "resource type"),
                            (self.pattern_type, "pattern type"), (self.operation, "operation"),
                            (self.permission, "permission type")):
            if value == 0:
                raise InvalidAcl(f"Filter has an UNKNOWN {enum}")

    def matches(self, binding: AclBinding) -> bool:
        if self.resource_type is not ResourceType.ANY and (
                binding.resource_type is not self.resource_type):
            return False
        if not self._pattern_matches(binding):
            return False
        return (
            (self.principal is None or self.principal == binding.principal)
            and (self.host is None or self.host == binding.host)
            and self.operation in (Operation.ANY, binding.operation)
            and self.permission in (Permission.ANY, binding.permission)
        )

    def _pattern_matches(self, binding: AclBinding) -> bool:
        pattern = self.pattern_type
        if pattern is PatternType.MATCH:
            return self.name is None or binding.applies_to(self.name)
        if pattern is not PatternType.ANY and pattern is not binding.pattern_type:
            return False
        return self.name is None or self.name == binding.name


_Acl = TypeVar("_Acl", AclBinding, AclFilter)


def from_wire(kind: type[_Acl], resource_type: int, name: str | None, pattern_type: int,
              principal: str | None, host: str | None, operation: int,
              permission: int) -> _Acl:
    """A binding (CreateAcls) or a filter (DescribeAcls, DeleteAcls) from a
    request's fields, checked as Kafka checks it: a value outside an enum, or
    what ``validate`` refuses, raises InvalidAcl (INVALID_REQUEST)."""
    try:
        made = kind(ResourceType(resource_type), name,  # type: ignore[arg-type]
                    PatternType(pattern_type), principal, host, Operation(operation),
                    Permission(permission))
    except ValueError as exc:
        raise InvalidAcl(str(exc)) from None
    made.validate()
    return made
