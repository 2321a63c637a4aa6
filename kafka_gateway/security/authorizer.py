"""The ACL authorizer (Kafka's AclAuthorizer semantics), and the one check handlers call.

With ``authorizer.class.name`` unset there is no authorizer and every
``authorize`` is a no-op: the handlers' cost is one attribute test. With it
set, an operation on a resource is allowed when:

- the principal is a super user (``super.users``); else
- no ACL applies to the resource at all and ``allow.everyone.if.no.acl.found``; else
- no DENY applies, and an ALLOW does, for the operation or one implying it
  (READ, WRITE, DELETE, ALTER imply DESCRIBE; ALTER_CONFIGS implies
  DESCRIBE_CONFIGS).

An ACL applies when its pattern covers the name (literal, ``*``, prefixed),
its principal is the client's or ``User:*``, its host the client's address
or ``*``, and its operation the one asked or ALL. Denials are counted in
``/metrics`` and logged with principal, address, operation and resource, a
few lines a minute per address (not those Kafka does not log either: topics
left out of an all-topics listing).

Handlers call ``authorize(broker, request, operation, resource type, name)``,
which raises the error Kafka answers for that resource type
(``TopicAuthorizationFailed``, ...: kafka_gateway/errors.py); ``allowed`` asks
the same without an error, where Kafka filters a listing.
ACLs live in the store (``keys.ACL``), all of them in memory.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from functools import partial

from kio.schema.errors import ErrorCode

from common.logtext import client_text
from tablets.seam import NodeRecordStore

from ..bad_input import BadInputLog
from ..errors import (
    ClusterAuthorizationFailed,
    GroupAuthorizationFailed,
    KafkaError,
    SecurityDisabled,
    TopicAuthorizationFailed,
    TransactionalIdAuthorizationFailed,
)
from ..metrics import Metrics
from ..slicing import LARGE_RESPONSE_ITEMS, off_loop, sliced
from .acls import (
    CLUSTER_NAME,
    IMPLIED_BY,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from .session import ANONYMOUS

DENIED: dict[ResourceType, type[KafkaError]] = {
    ResourceType.TOPIC: TopicAuthorizationFailed,
    ResourceType.GROUP: GroupAuthorizationFailed,
    ResourceType.TRANSACTIONAL_ID: TransactionalIdAuthorizationFailed,
    ResourceType.CLUSTER: ClusterAuthorizationFailed,
}


def parse_super_users(value: str) -> frozenset[str]:
    return frozenset(user.strip() for user in value.split(";") if user.strip())


class Authorizer:
    def __init__(self, records: NodeRecordStore, super_users: frozenset[str],
                 allow_if_no_acl: bool, metrics: Metrics, log: BadInputLog) -> None:
        self.records = records
        self.super_users = super_users
        self.allow_if_no_acl = allow_if_no_acl
        self.metrics = metrics
        self.log = log
        self._index()

    def _index(self) -> None:
        self.bindings: set[AclBinding] = set()
        # (type, name) -> literal bindings; type -> prefixed bindings.
        self._literal: dict[tuple[ResourceType, str], list[AclBinding]] = defaultdict(list)
        self._prefixed: dict[ResourceType, list[AclBinding]] = defaultdict(list)
        for raw in self.records.records:
            self._add(AclBinding.decode(raw))

    # Changes update the index binding by binding, a slice at a time (a
    # request may name 100,000 of them: see slicing.py).
    def _add(self, binding: AclBinding) -> None:
        if binding in self.bindings:
            return
        self.bindings.add(binding)
        if binding.pattern_type is PatternType.PREFIXED:
            self._prefixed[binding.resource_type].append(binding)
        else:
            self._literal[(binding.resource_type, binding.name)].append(binding)

    def _remove(self, binding: AclBinding) -> None:
        if binding not in self.bindings:
            return
        self.bindings.discard(binding)
        if binding.pattern_type is PatternType.PREFIXED:
            self._prefixed[binding.resource_type].remove(binding)
        else:
            key = (binding.resource_type, binding.name)
            self._literal[key].remove(binding)
            if not self._literal[key]:
                del self._literal[key]

    def _candidates(self, acl_filter: AclFilter) -> Iterable[AclBinding]:
        """The bindings ``acl_filter`` may match: one resource's for a filter naming
        one literal resource, else all."""
        if (acl_filter.resource_type is not ResourceType.ANY and acl_filter.name is not None
                and acl_filter.pattern_type is PatternType.LITERAL):
            return tuple(self._literal.get((acl_filter.resource_type, acl_filter.name), ()))
        return self.bindings

    # ---------------------------------------------------------------- checks
    def _applicable(self, rtype: ResourceType, name: str) -> list[AclBinding]:
        found = [*self._literal.get((rtype, name), ()), *self._literal.get((rtype, WILDCARD), ())]
        found.extend(b for b in self._prefixed.get(rtype, ()) if name.startswith(b.name))
        return found

    def allows(self, principal: str, host: str, operation: Operation, rtype: ResourceType,
               name: str) -> bool:
        if principal in self.super_users:
            return True
        acls = self._applicable(rtype, name)
        if not acls:
            return self.allow_if_no_acl
        mine = [acl for acl in acls if acl.principal in (principal, WILDCARD_PRINCIPAL)
                and acl.host in (host, WILDCARD)]
        if any(acl.permission is Permission.DENY and acl.operation in (operation, Operation.ALL)
               for acl in mine):
            return False
        granted = IMPLIED_BY.get(operation, (operation,))
        return any(acl.permission is Permission.ALLOW
                   and (acl.operation is Operation.ALL or acl.operation in granted)
                   for acl in mine)

    def allows_any(self, principal: str, host: str, operation: Operation,
                   rtype: ResourceType) -> bool:
        """May the principal do ``operation`` on some resource of this type?
        (Kafka's authorizeByResourceType: an idempotent producer needs WRITE on
        any topic.) Any ALLOW not cancelled by a DENY of the same or a
        broader pattern counts."""
        if principal in self.super_users:
            return True

        def mine(acl: AclBinding, permission: Permission) -> bool:
            return (acl.resource_type is rtype and acl.permission is permission
                    and acl.principal in (principal, WILDCARD_PRINCIPAL)
                    and acl.host in (host, WILDCARD)
                    and acl.operation in (operation, Operation.ALL))

        denies = [acl for acl in self.bindings if mine(acl, Permission.DENY)]
        if any(d.pattern_type is PatternType.LITERAL and d.name == WILDCARD for d in denies):
            return False
        if self.allow_if_no_acl:
            return True
        deny_literal = {d.name for d in denies if d.pattern_type is PatternType.LITERAL}
        deny_prefixes = [d.name for d in denies if d.pattern_type is PatternType.PREFIXED]
        for allow in (acl for acl in self.bindings if mine(acl, Permission.ALLOW)):
            if allow.pattern_type is PatternType.LITERAL and allow.name == WILDCARD:
                return True
            if any(allow.name.startswith(prefix) for prefix in deny_prefixes):
                continue
            if allow.pattern_type is PatternType.LITERAL and allow.name in deny_literal:
                continue
            return True
        return False

    def denied(self, principal: str, address: str, operation: Operation, rtype: ResourceType,
               name: str) -> None:
        self.metrics.authorization_failures += 1
        self.log.log(address, logging.WARNING,
                     "authorization failed: %s from %s may not %s %s %s", client_text(principal),
                     address, operation.name, rtype.name, client_text(name))

    # --------------------------------------------------------------- changes
    async def create(self, bindings: list[AclBinding]) -> None:
        await self.records.change({b.encode(): b"" async for b in sliced(bindings)})
        async for binding in sliced(bindings):
            self._add(binding)

    async def delete(self, filters: list[AclFilter]) -> list[list[AclBinding]]:
        """Delete every binding each filter matches; per filter, what it deleted."""
        matched = [sorted([b async for b in sliced(self._candidates(f)) if f.matches(b)],
                          key=_order) async for f in sliced(filters)]
        gone = {b for found in matched for b in found}
        if gone:
            await self.records.change({}, [b.encode() async for b in sliced(gone)])
            async for binding in sliced(gone):
                self._remove(binding)
        return matched

    async def describe(self, acl_filter: AclFilter) -> list[AclBinding]:
        found = [b async for b in sliced(self._candidates(acl_filter)) if acl_filter.matches(b)]
        # Sorting 50,000 bindings takes a while: on the worker thread (immutable values).
        return await off_loop(len(found) > LARGE_RESPONSE_ITEMS, partial(sorted, key=_order),
                              found)


def _order(binding: AclBinding) -> tuple:
    return (binding.resource_type, binding.pattern_type, binding.name, binding.principal,
            binding.host, binding.operation, binding.permission)


def _who(request) -> tuple[str, str]:
    session = request.session
    return (session.principal, session.address) if session is not None else (ANONYMOUS, "")


def allowed(broker, request, operation: Operation, rtype: ResourceType, name: str,
            log: bool = False) -> bool:
    """May the request's principal? A question, answered without an error:
    where Kafka filters (a listing) or tries another check first; ``log`` a
    denial where Kafka does."""
    authorizer: Authorizer | None = broker.authorizer
    if authorizer is None:
        return True
    principal, address = _who(request)
    if authorizer.allows(principal, address, operation, rtype, name):
        return True
    if log:
        authorizer.denied(principal, address, operation, rtype, name)
    return False


def authorize(broker, request, operation: Operation, rtype: ResourceType, name: str,
              message: str | None = None) -> None:
    """Raise the error Kafka answers for this resource type
    (TopicAuthorizationFailed, ...) unless the request's principal may; the
    denial is counted and logged."""
    if not allowed(broker, request, operation, rtype, name, log=True):
        raise DENIED[rtype](message)


def authorize_any(broker, request, operation: Operation, rtype: ResourceType) -> bool:
    """May the request's principal do ``operation`` on some resource of ``rtype``?"""
    authorizer: Authorizer | None = broker.authorizer
    if authorizer is None:
        return True
    principal, address = _who(request)
    return authorizer.allows_any(principal, address, operation, rtype)


def authorize_cluster(broker, request, operation: Operation) -> None:
    authorize(broker, request, operation, ResourceType.CLUSTER, CLUSTER_NAME)


def cluster_allowed(broker, request, operation: Operation, log: bool = False) -> bool:
    return allowed(broker, request, operation, ResourceType.CLUSTER, CLUSTER_NAME, log)


def authorize_txn(broker, request, transactional_id: str, group_id: str | None = None) -> None:
    """The transactional requests' check: WRITE on the transactional id, then
    READ on the group for those that name one (AddOffsetsToTxn, TxnOffsetCommit)."""
    authorize(broker, request, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
    if group_id is not None:
        authorize(broker, request, Operation.READ, ResourceType.GROUP, group_id)


def acl_authorizer(broker, request, operation: Operation, no_authorizer: str) -> Authorizer:
    """The authorizer, for the ACL APIs: ``operation`` on the cluster first
    (CLUSTER_AUTHORIZATION_FAILED), then SECURITY_DISABLED (``no_authorizer``,
    Kafka's message of that API) when none is configured."""
    authorize_cluster(broker, request, operation)
    if broker.authorizer is None:
        raise SecurityDisabled(no_authorizer)
    return broker.authorizer


def denied_names(broker, request, operation: Operation, rtype: ResourceType,
                 names, log: bool = True) -> dict[str, ErrorCode]:
    """Of ``names``, those the principal may not: name -> the code to answer
    (each name checked once, however many partitions name it). Empty without
    an authorizer (the common case costs one test)."""
    if broker.authorizer is None:
        return {}
    code = DENIED[rtype].code
    return {name: code for name in set(names)
            if not allowed(broker, request, operation, rtype, name, log)}


_CONFIG_TOPIC, _CONFIG_BROKER, _CONFIG_BROKER_LOGGER = 2, 4, 8


def authorize_config(broker, request, operation: Operation, resource_type: int,
                     name: str) -> None:
    """DESCRIBE_CONFIGS / ALTER_CONFIGS on a config resource: a topic's are the
    topic's operation, a broker's (and its loggers') the cluster's."""
    if resource_type == _CONFIG_TOPIC:
        authorize(broker, request, operation, ResourceType.TOPIC, name)
    elif resource_type in (_CONFIG_BROKER, _CONFIG_BROKER_LOGGER):
        authorize_cluster(broker, request, operation)
