"""TLS for SSL and SASL_SSL listeners, with the stdlib ``ssl``.

One server context per TLS listener: the key and certificate chain of
``ssl.keystore.location`` (PEM), TLS 1.2 at the least, and client
certificates per ``ssl.client.auth`` checked against
``ssl.truststore.location``. On an SSL listener the principal of a client
that presented a certificate is ``User:`` and its subject as an RFC 2253
distinguished name (``CN=alice,OU=eng,O=Acme,C=US``), as Kafka's default
principal builder makes it; without one it is ``User:ANONYMOUS``.

A failed handshake (plaintext sent to a TLS port, an untrusted or expired
client certificate, an old protocol) never reaches the Kafka connection: the
TLS layer drops it. ``HandshakeWatch`` counts and logs those failures from
the TLS object itself, where the reason is known (the peer address is not:
the stdlib's TLS object does not know its socket).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable

from ..settings import SETTINGS, GatewayConfig
from .listeners import Listener

ANONYMOUS = "User:ANONYMOUS"
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_ATTR = {setting.prop: setting.attr for setting in SETTINGS}
# Short names of the attributes Java's X500Principal.getName() (RFC 2253) writes.
_RDN_NAMES = {
    "commonName": "CN", "countryName": "C", "localityName": "L",
    "stateOrProvinceName": "ST", "organizationName": "O", "organizationalUnitName": "OU",
    "streetAddress": "STREET", "domainComponent": "DC", "userId": "UID",
}


class TlsSettingError(ValueError):
    """A TLS listener cannot be set up from the settings; the gateway does not start."""


def listener_setting(config: GatewayConfig, listener: Listener, prop: str) -> str:
    """A setting as this listener sees it: its own ``listener.name.`` value, or the node's."""
    if prop in listener.settings:
        return listener.settings[prop]
    value = getattr(config, _ATTR[prop])
    return str(value).lower() if isinstance(value, bool) else str(value)


def server_context(config: GatewayConfig, listener: Listener,
                   on_failure: Callable[[BaseException], None]) -> ssl.SSLContext:
    def setting(prop: str) -> str:
        return listener_setting(config, listener, prop)

    keystore = setting("ssl.keystore.location")
    if not keystore:
        raise TlsSettingError(f"listener {listener.name} ({listener.protocol}) needs "
                              "ssl.keystore.location: a PEM file with the key and certificate")
    versions = [v.strip() for v in setting("ssl.enabled.protocols").split(",") if v.strip()]
    unknown = [v for v in versions if v not in _VERSIONS]
    if unknown or not versions:
        raise TlsSettingError(f"ssl.enabled.protocols: only TLSv1.2 and TLSv1.3, got "
                              f"{setting('ssl.enabled.protocols')!r}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = min(_VERSIONS[v] for v in versions)
    context.maximum_version = max(_VERSIONS[v] for v in versions)
    try:
        context.load_cert_chain(keystore, password=setting("ssl.key.password") or None)
        if setting("ssl.cipher.suites"):
            context.set_ciphers(setting("ssl.cipher.suites"))
    except (OSError, ssl.SSLError) as exc:
        raise TlsSettingError(f"listener {listener.name}: cannot load {keystore}: {exc}") from exc
    auth = setting("ssl.client.auth")
    if auth in ("required", "requested"):
        context.verify_mode = ssl.CERT_REQUIRED if auth == "required" else ssl.CERT_OPTIONAL
        truststore = setting("ssl.truststore.location")
        try:
            if truststore:
                context.load_verify_locations(cafile=truststore)
            else:
                context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        except (OSError, ssl.SSLError) as exc:
            raise TlsSettingError(f"listener {listener.name}: cannot load {truststore}: "
                                  f"{exc}") from exc
    elif auth != "none":
        raise TlsSettingError(f"ssl.client.auth must be required, requested or none, "
                              f"got {auth!r}")
    context.sslobject_class = _watched(on_failure)
    return context


def _watched(on_failure: Callable[[BaseException], None]) -> type[ssl.SSLObject]:
    class WatchedSSLObject(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise
            except Exception as exc:
                on_failure(exc)
                raise

    return WatchedSSLObject


class HandshakeWatch:
    """Counts failed TLS handshakes and logs them, a few lines a minute per reason."""

    def __init__(self, listener: Listener, metrics: object, log: object) -> None:
        self.listener = listener
        self.metrics = metrics
        self.log = log  # a bad_input.BadInputLog

    def __call__(self, exc: BaseException) -> None:
        self.metrics.tls_handshake_failures += 1  # type: ignore[attr-defined]
        reason = getattr(exc, "reason", None) or type(exc).__name__
        self.log.log(f"tls:{reason}", logging.WARNING,  # type: ignore[attr-defined]
                     "TLS handshake failed on listener %s: %s", self.listener.name, exc)


def principal_from_certificate(ssl_object: ssl.SSLObject | None) -> str:
    """``User:<subject as RFC 2253>`` of the client's certificate, or ``User:ANONYMOUS``."""
    if ssl_object is None:
        return ANONYMOUS
    cert = ssl_object.getpeercert()
    if not cert or not cert.get("subject"):
        return ANONYMOUS
    return "User:" + rfc2253(cert["subject"])


def rfc2253(subject: tuple) -> str:
    """A subject from ``getpeercert()`` written as Java's X500Principal.getName() does:
    most specific RDN first, multi-valued RDNs joined by '+', values escaped."""
    rdns = []
    for rdn in reversed(subject):
        rdns.append("+".join(f"{_RDN_NAMES.get(name, name)}={_escape(value)}"
                             for name, value in rdn))
    return ",".join(rdns)


def _escape(value: str) -> str:
    out = []
    for index, char in enumerate(value):
        if char in ',+"\\<>;' or (char == "#" and index == 0) or (
                char == " " and index in (0, len(value) - 1)):
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)
