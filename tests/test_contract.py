"""The handlers' typed contract (contract.py) matches what dispatch hands them.

Each handler is typed ``handle(broker, request: Request[Body])``; mypy checks
every field it reads against each member of ``Body``, so the union must hold
exactly the classes the body is decoded into: kio's request class for each
version in the module's VERSIONS (codec.decode_request reads a body with
that class), or, for an API that reads its own requests, what its decoder
returns. The unions are built only for the type checker (``if
TYPE_CHECKING:`` in each module: importing every version's schema would cost
the gateway's start ~0.4 s), so this test runs those blocks to read them.
"""

from __future__ import annotations

import ast
import inspect
import sys
import types
import typing

import pytest

from kafka_gateway.apis import APIS, Api
from kafka_gateway.codec import Request, _request_class, decode_request, read_header


def _body_classes(annotation: object) -> set[type]:
    """The classes of ``Request[Body]``: the members of a union, or the one class."""
    assert typing.get_origin(annotation) is Request, annotation
    (body,) = typing.get_args(annotation)
    if isinstance(body, types.UnionType) or typing.get_origin(body) is typing.Union:
        return set(typing.get_args(body))
    assert isinstance(body, type), body
    return {body}


def _type_namespace(function: typing.Callable[..., object]) -> dict[str, object]:
    """The globals of ``function``'s module, with what its ``if TYPE_CHECKING:``
    blocks import and define."""
    module = sys.modules[function.__module__]
    namespace = dict(vars(module))
    blocks = [node for node in ast.parse(inspect.getsource(module)).body
              if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    for block in blocks:
        exec(compile(ast.Module(block.body, type_ignores=[]), module.__file__ or "?", "exec"),
             namespace)
    return namespace


def _hints(function: typing.Callable[..., object]) -> dict[str, object]:
    return typing.get_type_hints(function, globalns=_type_namespace(function))


def _handler_body(api: Api[object]) -> set[type]:
    return _body_classes(_hints(api.handle)["request"])


@pytest.mark.parametrize("api", sorted(APIS.values(), key=lambda a: a.key),
                         ids=lambda a: a.name)
def test_handler_body_is_what_is_decoded(api: Api[object]) -> None:
    declared = _handler_body(api)
    if api.decode is not None:
        returned = _hints(api.decode)["return"]
        assert declared == {returned}
        return
    decoded = {_request_class(api.key, version)
               for version in range(api.min_version, api.max_version + 1)}
    assert None not in decoded, f"{api.name}: kio has no schema for a version served"
    assert declared == decoded, (
        f"{api.name}: handle's body type has {sorted(c.__module__ for c in declared - decoded)} "
        f"more and {sorted(c.__module__ for c in decoded - declared)} fewer than "
        f"v{api.min_version}-{api.max_version}")


def test_every_version_has_its_own_class() -> None:
    # The premise of the check above: one class per version, so a union that
    # misses a version misses a class.
    api = APIS[3]  # Metadata, v0-12
    classes = {_request_class(api.key, v) for v in range(api.min_version, api.max_version + 1)}
    assert len(classes) == api.max_version - api.min_version + 1
    assert len(_handler_body(api)) == len(classes)


def test_a_decoded_body_is_a_member_of_the_handlers_union() -> None:
    # Heartbeat v4, as a client sends it: decode_request's body is one of the
    # classes handle() is typed for.
    from kio.schema.heartbeat.v4.request import HeartbeatRequest
    from kio.serial import entity_writer

    from kafka_gateway.codec import ChunkWriter

    body = HeartbeatRequest(group_id="g", generation_id=1, member_id="m", group_instance_id=None)
    out = ChunkWriter()
    entity_writer(HeartbeatRequest)(out, body)
    client = b"c"
    frame = (b"\x00\x0c" + b"\x00\x04" + b"\x00\x00\x00\x07"
             + len(client).to_bytes(2, "big") + client + b"\x00" + b"".join(out.chunks))
    header, pos = read_header(frame)
    decoded = decode_request(frame, header, pos, APIS[header.api_key].decode)
    assert decoded.body == body
    assert type(decoded.body) in _handler_body(APIS[12])
