"""PKI for splitrl's gRPC links: one CA and one certificate per service or edge device, all EC P-256.

`generate(out, hosts)` writes, under `out`:

- `ca.pem` (the CA certificate every process trusts) and `ca-key.pem` (kept to issue more; never mounted),
- `<host>.pem` / `<host>-key.pem` for each host: a certificate for the names `host`, `host.<suffix>` and
  `*.host.<suffix>` per DNS suffix (Kubernetes Service FQDNs, and the pods of a StatefulSet that Service
  governs: `host-K.host.<suffix>`, how inference replicas are dialled), every extra name, `localhost`,
  127.0.0.1 and ::1, usable both as a server and as a client (mtls), so each service needs one pair. No
  `*.host` without a suffix: gRPC refuses a wildcard over a single label ("invalid toplevel subdomain").
- for each edge device id in `edges`: `edge-encoder-<id>.pem` and `environment-<id>.pem` (+ keys), the two
  processes of that device, each named by the role it runs and the device's id.

Each certificate also carries its holder's identity as a SPIFFE ID URI SAN,
`spiffe://splitrl/<role>/<instance>` (authz.Identity), which servers authorise by. With `reuse_ca` the CA
already in `out` signs the new certificates: an edge added later needs nothing else reissued.

`splitrl up` makes a set per run under `<run_dir>/tls/`; `splitrl certs` makes one for compose and k8s
secrets. EC keys keep generation to milliseconds, so `splitrl up` starts as fast as before.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from splitrl.core.authz import Identity, role_of
from splitrl.core.state_files import write_atomic

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


def _subject_alt_names(names: Sequence[str], identity: Identity) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):  # keep order, drop repeats
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    entries.append(x509.UniformResourceIdentifier(identity.uri))
    return x509.SubjectAlternativeName(entries)


@dataclass(frozen=True)
class _Holder:
    """One certificate to issue: the file stem, who holds it, and the names it answers to as a server."""

    stem: str
    identity: Identity
    names: tuple[str, ...]
    #: Takes the extra names (the cloud's external name): an edge device's certificate never answers to them,
    #: so a stolen one cannot stand in for the cloud towards other edges.
    cloud: bool


def _holders(hosts: Sequence[str], edges: Sequence[str], dns_suffixes: Sequence[str]) -> list[_Holder]:
    """A host is NAME (its role read from the name, role_of) or NAME=ROLE; an edge id gives two holders."""
    holders = []
    for host in hosts:
        name, _, role = host.partition("=")
        identity = Identity(role or role_of(name), name)
        names = (name, *(f"{name}.{s}" for s in dns_suffixes), *(f"*.{name}.{s}" for s in dns_suffixes))
        holders.append(_Holder(name, identity, names, cloud=True))
    for edge in edges:
        for role in ("edge-encoder", "environment"):
            # The edge-encoder serves its environment by the service's own name (compose, the edge pod).
            holders.append(_Holder(f"{role}-{edge}", Identity(role, edge), (role, f"{role}-{edge}"), cloud=False))
    return holders


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    _write(path, pem, 0o600)  # owner-only from the first byte


def _write(path: Path, data: bytes, mode: int) -> None:
    """Whole or not at all (state_files.write_atomic): a service re-reading a renewed file never sees half."""
    write_atomic(path, lambda file: file.write(data), durable=False, mode=mode)


def generate(
    out: Path,
    hosts: Sequence[str],
    valid_days: int = 365,
    dns_suffixes: Sequence[str] = (),
    extra_names: Sequence[str] = (),
    edges: Sequence[str] = (),
    reuse_ca: bool = False,
) -> Pki:
    """Create a CA (or, with `reuse_ca`, load the one in `out`) and one certificate per host and edge device.

    `hosts`: NAME or NAME=ROLE each (authz.role_of reads the role from NAME). `edges`: edge device ids, each
    given an edge-encoder and an environment certificate. `dns_suffixes` add `host.<suffix>` to each host's
    certificate (e.g. `splitrl.svc` for Kubernetes Service names); `extra_names` go into every certificate
    (e.g. the external name edges in another cluster dial, which one --tls-server-name must match for every
    cloud service). Files of the same names are replaced.
    """
    if not hosts and not edges:
        raise ValueError("at least one host name or edge id is needed")
    bad = [host for host in [*hosts, *edges] if not host or "/" in host or host.startswith(".")]
    if bad:
        raise ValueError(f"host names and edge ids must be plain names (they become file names): {bad}")
    bad = [name for name in [*dns_suffixes, *extra_names] if not name or name.startswith(".") or "/" in name]
    if bad:
        raise ValueError(f"DNS suffixes and extra names must be names without a leading dot: {bad}")
    holders = _holders(hosts, edges, dns_suffixes)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=valid_days)
    pki = Pki(out / "ca.pem", out / "ca-key.pem", {})
    ca_cert, ca_key = _load_ca(pki) if reuse_ca else _new_ca(pki, not_before, not_after)
    for holder in holders:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(holder.stem))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(min(not_after, ca_cert.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                _subject_alt_names(
                    [*holder.names, *(extra_names if holder.cloud else ()), *LOOPBACK_NAMES], holder.identity
                ),
                critical=False,
            )
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        pair = (out / f"{holder.stem}.pem", out / f"{holder.stem}-key.pem")
        _write_key(pair[1], key)  # the key first: a running server re-reads the pair once the certificate changes
        _write(pair[0], cert.public_bytes(serialization.Encoding.PEM), 0o644)
        pki.pairs[holder.stem] = pair
    return pki


def _new_ca(
    pki: Pki, not_before: datetime.datetime, not_after: datetime.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
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
    _write(pki.ca, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write_key(pki.ca_key, ca_key)
    return ca_cert, ca_key


def _load_ca(pki: Pki) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The CA `pki` names, read back to sign more certificates; ValueError says which file is wrong."""
    try:
        ca_cert = x509.load_pem_x509_certificate(pki.ca.read_bytes())
        ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    except OSError as error:
        raise ValueError(f"--reuse-ca needs {pki.ca} and {pki.ca_key}: {error.strerror} ({error.filename})") from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey) or ca_key.public_key() != ca_cert.public_key():
        raise ValueError(f"{pki.ca_key} is not the private key of {pki.ca}")
    return ca_cert, ca_key
