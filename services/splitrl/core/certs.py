"""Throwaway PKI for splitrl's gRPC links: one CA and one certificate per service, all EC P-256.

`generate(out, hosts)` writes, under `out`:

- `ca.pem` (the CA certificate every process trusts) and `ca-key.pem` (kept to issue more; never mounted),
- `<host>.pem` / `<host>-key.pem` for each host: a certificate for the names `host`, `host.<suffix>` and
  `*.host.<suffix>` per DNS suffix (Kubernetes Service FQDNs, and the pods of a StatefulSet that Service
  governs: `host-K.host.<suffix>`, how inference replicas are dialled), every extra name, `localhost`,
  127.0.0.1 and ::1, usable both as a server and as a client (mtls), so each service needs one pair. No
  `*.host` without a suffix: gRPC refuses a wildcard over a single label ("invalid toplevel subdomain").

`splitrl up` makes a set per run under `<run_dir>/tls/`; `splitrl certs` makes one for compose and k8s
secrets. EC keys keep generation to milliseconds, so `splitrl up` starts as fast as before.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Names every certificate also holds, so a service is reachable on loopback under its own certificate.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Pki:
    """Where `generate` wrote the files: `ca` (PEM) and, per host, (certificate, private key) paths."""

    ca: Path
    ca_key: Path
    pairs: dict[str, tuple[Path, Path]]


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "splitrl"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _subject_alt_names(names: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):  # keep order, drop repeats
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # owner-only from the first byte
    with os.fdopen(fd, "wb") as file:
        file.write(pem)


def generate(
    out: Path,
    hosts: Sequence[str],
    valid_days: int = 365,
    dns_suffixes: Sequence[str] = (),
    extra_names: Sequence[str] = (),
) -> Pki:
    """Create a new CA and one certificate per host under `out` (created; existing files are replaced).

    `dns_suffixes` add `host.<suffix>` to each host's certificate (e.g. `splitrl.svc` for Kubernetes Service
    names); `extra_names` go into every certificate (e.g. the external name edges in another cluster dial,
    which one --tls-server-name must match for every cloud service).
    """
    if not hosts:
        raise ValueError("at least one host name is needed")
    bad = [host for host in hosts if not host or "/" in host or host.startswith(".")]
    if bad:
        raise ValueError(f"host names must be plain names (they become file names): {bad}")
    bad = [name for name in [*dns_suffixes, *extra_names] if not name or name.startswith(".") or "/" in name]
    if bad:
        raise ValueError(f"DNS suffixes and extra names must be names without a leading dot: {bad}")
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=valid_days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("splitrl CA"))
        .issuer_name(_name("splitrl CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(out / "ca.pem", out / "ca-key.pem", {})
    pki.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.ca_key, ca_key)
    for host in hosts:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(host))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                _subject_alt_names(
                    [
                        host,
                        *(f"{host}.{suffix}" for suffix in dns_suffixes),
                        *(f"*.{host}.{suffix}" for suffix in dns_suffixes),
                        *extra_names,
                        *LOOPBACK_NAMES,
                    ]
                ),
                critical=False,
            )
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        pair = (out / f"{host}.pem", out / f"{host}-key.pem")
        pair[0].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair[1], key)
        pki.pairs[host] = pair
    return pki
