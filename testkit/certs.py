"""Certificates made at test time (the ``cryptography`` package): a CA, a server
certificate for 127.0.0.1/localhost, and client certificates, good and bad.

    pki = make_pki(tmp_path)
    pki.server        # PEM: the server's key and certificate (ssl.keystore.location)
    pki.ca            # PEM: the CA certificate (ssl.truststore.location / ssl.ca.location)
    pki.client("CN=alice,O=Acme")          # PEM key + certificate, signed by the CA
    pki.client("CN=old", expired=True)     # expired a day ago
    pki.rogue_client("CN=mallory")          # signed by a CA nobody trusts

Each PEM file holds the private key first, then the certificate, which is
what Kafka's PEM keystores, Python's ``load_cert_chain`` and the Java
client's ``ssl.keystore.type=PEM`` read.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_ATTRS = {"CN": NameOID.COMMON_NAME, "O": NameOID.ORGANIZATION_NAME,
          "OU": NameOID.ORGANIZATIONAL_UNIT_NAME, "C": NameOID.COUNTRY_NAME,
          "L": NameOID.LOCALITY_NAME, "ST": NameOID.STATE_OR_PROVINCE_NAME}


def _name(subject: str) -> x509.Name:
    """"CN=alice,O=Acme" (most specific first, as RFC 2253) -> an X.509 name."""
    parts = [part.split("=", 1) for part in subject.split(",")]
    return x509.Name([x509.NameAttribute(_ATTRS[k.strip()], v.strip())
                      for k, v in reversed(parts)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()) + cert.public_bytes(
        serialization.Encoding.PEM)


def _certificate(subject: str, key, issuer: x509.Name, issuer_key, *, ca: bool = False,
                 server: bool = False, expired: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    start, end = (now - datetime.timedelta(days=10), now - datetime.timedelta(days=1)) \
        if expired else (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2))
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@dataclass
class Pki:
    directory: Path
    ca: Path
    server: Path
    _ca_key: object
    _ca_cert: x509.Certificate

    def _write(self, name: str, data: bytes) -> Path:
        path = self.directory / name
        path.write_bytes(data)
        return path

    def client(self, subject: str, expired: bool = False) -> Path:
        key = _key()
        cert = _certificate(subject, key, self._ca_cert.subject, self._ca_key, expired=expired)
        label = "".join(c if c.isalnum() else "_" for c in subject)
        return self._write(f"client-{label}{'-expired' if expired else ''}.pem",
                           _pem(key, cert))

    def rogue_client(self, subject: str) -> Path:
        rogue_key = _key()
        rogue = _certificate("CN=Rogue CA", rogue_key, _name("CN=Rogue CA"), rogue_key, ca=True)
        key = _key()
        cert = _certificate(subject, key, rogue.subject, rogue_key)
        return self._write("client-rogue.pem", _pem(key, cert))


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("CN=Test CA,O=kafka-gateway tests")
    ca_cert = _certificate("CN=Test CA,O=kafka-gateway tests", ca_key, ca_name, ca_key, ca=True)
    ca = directory / "ca.pem"
    ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    server_key = _key()
    server_cert = _certificate("CN=localhost", server_key, ca_name, ca_key, server=True)
    server = directory / "server.pem"
    server.write_bytes(_pem(server_key, server_cert))
    return Pki(directory, ca, server, ca_key, ca_cert)
