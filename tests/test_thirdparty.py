"""kafka_gateway/thirdparty.py: the private parts of kio and scramp the gateway
uses still exist and behave as relied on. A failure here means an upgrade
changed them: adapt thirdparty.py (and nothing else) to the new version."""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
from dataclasses import fields

import pytest
from kio.schema.fetch.v12.request import FetchRequest
from kio.schema.produce.v9.request import ProduceRequest, TopicProduceData
from scramp import ScramException, ScramMechanism
from scramp import core as scramp_core

from kafka_gateway import thirdparty


def test_kio_introspection_classifies_fields_as_relied_on():
    by_name = {f.name: f for f in fields(ProduceRequest)}
    kinds = {name: type(thirdparty.classify_field(f)) for name, f in by_name.items()}
    assert kinds == {"transactional_id": thirdparty.PrimitiveField,
                     "acks": thirdparty.PrimitiveField,
                     "timeout": thirdparty.PrimitiveField,
                     "topic_data": thirdparty.EntityTupleField}
    assert thirdparty.get_schema_field_type(by_name["acks"]) == "int16"
    assert thirdparty.get_schema_field_type(by_name["transactional_id"]) == "string"
    assert thirdparty.get_schema_field_type(by_name["timeout"]) == "timedelta_i32"
    assert thirdparty.is_optional(by_name["transactional_id"])
    assert not thirdparty.is_optional(by_name["acks"])
    assert thirdparty.classify_field(by_name["topic_data"]).type_ is TopicProduceData
    assert all(thirdparty.get_field_tag(f) is None for f in by_name.values())
    tags = {f.name: thirdparty.get_field_tag(f) for f in fields(FetchRequest)}
    assert tags["cluster_id"] == 0 and tags["topics"] is None


def test_kio_introspection_signatures():
    for function in (thirdparty.classify_field, thirdparty.get_field_tag,
                     thirdparty.get_schema_field_type, thirdparty.is_optional):
        assert list(inspect.signature(function).parameters) == ["field"], function
    for kind in (thirdparty.EntityField, thirdparty.EntityTupleField):
        assert set(kind.__dataclass_fields__) == {"is_array", "type_"}, kind


def test_scramp_private_functions_keep_their_signatures():
    assert list(inspect.signature(scramp_core._set_client_final).parameters) == [
        "hf", "msg", "nonce", "stored_key", "server_key", "client_first_bare",
        "server_first", "channel_binding", "gs2_header"]
    assert list(inspect.signature(scramp_core._get_server_final).parameters) == [
        "server_signature", "error"]


def _librdkafka_final(mechanism: str = "SCRAM-SHA-256", prefix: str | None = None,
                      forge: bool = False):
    """A scramp server after server-first, a client-final whose nonce is ``prefix``
    (default: the client nonce) then the full nonce, with the proof computed over
    that message as librdkafka does (RFC 5802), and the server-final expected."""
    hash_name = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    salt, stored_key, server_key, iterations = ScramMechanism(mechanism).make_auth_info(
        "secret", iteration_count=4096)
    server = ScramMechanism(mechanism).make_server(
        lambda _user: (salt, stored_key, server_key, iterations))
    client_nonce = "fyko+d2lbbFgONRv9qkxdawL"
    client_first_bare = f"n=alice,r={client_nonce}"
    server.set_client_first(f"n,,{client_first_bare}")
    server_first = server.get_server_first()
    nonce = f"{client_nonce if prefix is None else prefix}{server.nonce!s}"
    without_proof = f"c=biws,r={nonce}"
    auth = f"{client_first_bare},{server_first},{without_proof}".encode()
    salted = hashlib.pbkdf2_hmac(hash_name, b"secret", salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", hash_name)
    signature = hmac.digest(hashlib.new(hash_name, client_key).digest(), auth, hash_name)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    if forge:
        proof = bytes(b ^ 1 for b in proof)
    expected = hmac.digest(hmac.digest(salted, b"Server Key", hash_name), auth, hash_name)
    final = f"{without_proof},p={base64.b64encode(proof).decode()}"
    return server, final, f"v={base64.b64encode(expected).decode()}"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_final_for_a_repeated_nonce(mechanism):
    server, final, expected = _librdkafka_final(mechanism)
    with pytest.raises(ScramException):
        _librdkafka_final(mechanism)[0].set_client_final(final)  # scramp alone refuses it
    assert thirdparty.scram_server_final_for_nonce(server, final) == expected


def test_scram_final_for_a_foreign_nonce_or_a_wrong_proof_fails():
    server, final, _expected = _librdkafka_final(prefix="")  # the plain nonce: scramp's case
    with pytest.raises(ScramException):
        thirdparty.scram_server_final_for_nonce(server, final)
    server, final, _expected = _librdkafka_final(forge=True)
    with pytest.raises(ScramException):
        thirdparty.scram_server_final_for_nonce(server, final)
    server, final, _expected = _librdkafka_final()
    with pytest.raises(ScramException):  # the server's nonce is not all in it
        cut = final.replace(f"{str(server.nonce)[-4:]},", ",")
        thirdparty.scram_server_final_for_nonce(server, cut)
