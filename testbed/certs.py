"""Certificates and keys for the test control plane, made with ``cryptography`` in milliseconds.

The apiserver runs with its secure port only and RBAC on, exactly like a production cluster, so the
harness needs a small PKI: one CA (which also signs CSRs through the controller-manager), a serving
certificate for the apiserver, client certificates that carry each component's RBAC identity in the
subject (CN = user, O = groups), and the service-account signing key pair.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_SERVICE_CIDR = "10.96.0.0/16"
"""Service ClusterIP range of the test apiserver; its first IP is the ``kubernetes`` Service."""

_VALIDITY = dt.timedelta(days=365)
_BACKDATE = dt.timedelta(minutes=5)  # tolerate small clock differences between processes


@dataclass(frozen=True)
class CertPair:
    """Paths of a PEM certificate and its PEM private key."""

    cert: Path
    key: Path


def first_service_ip(service_cidr: str = DEFAULT_SERVICE_CIDR) -> str:
    """Return the first host address of the service range: the ClusterIP of ``kubernetes``.

    In-cluster clients (the operator in a pod, later) dial that address, so the apiserver's serving
    certificate must name it.
    """
    network = ipaddress.ip_network(service_cidr, strict=False)
    return str(network.network_address + 1)


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256 keys are generated in microseconds, unlike RSA; every Kubernetes component accepts them.
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.write_bytes(pem)
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


class CertificateAuthority:
    """A self-signed CA that issues the cluster's serving and client certificates."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, paths: CertPair):
        self.certificate = cert
        self._key = key
        self.paths = paths

    @classmethod
    def create(
        cls, directory: Path, common_name: str = "torchkube-test-ca", name: str = "ca"
    ) -> CertificateAuthority:
        """Make a fresh CA and write ``<name>.crt`` / ``<name>.key`` into ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        key = _new_key()
        now = dt.datetime.now(dt.UTC)
        subject = _name(common_name)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + 10 * _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        paths = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
        _write_cert(paths.cert, cert)
        _write_key(paths.key, key)
        return cls(cert, key, paths)

    def issue(
        self,
        directory: Path,
        name: str,
        common_name: str,
        *,
        organizations: Sequence[str] = (),
        dns_names: Iterable[str] = (),
        ip_addresses: Iterable[str] = (),
        server: bool = False,
        client: bool = False,
    ) -> CertPair:
        """Issue a leaf certificate, written as ``<name>.crt`` / ``<name>.key`` in ``directory``.

        For client certificates the apiserver takes the user from ``common_name`` and the groups
        from ``organizations``; serving certificates need the names clients dial as SANs.
        """
        if not (server or client):
            raise ValueError("a certificate must be for a server, a client, or both")
        directory.mkdir(parents=True, exist_ok=True)
        key = _new_key()
        now = dt.datetime.now(dt.UTC)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(dns) for dns in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
        _write_cert(pair.cert, cert)
        _write_key(pair.key, key)
        return pair


def write_service_account_keys(directory: Path) -> CertPair:
    """Write the RSA key pair the apiserver signs service-account tokens with.

    Returns the pair as (``cert`` = public key ``sa.pub``, ``key`` = private key ``sa.key``). RSA,
    because RS256 is what every token consumer (and the OIDC discovery document) expects.
    """
    directory.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = directory / "sa.pub"
    private = directory / "sa.key"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    _write_key(private, key)
    return CertPair(cert=public, key=private)


@dataclass(frozen=True)
class ClusterPki:
    """Everything the control plane's TLS and identities need, as files in one folder."""

    ca: CertificateAuthority
    apiserver: CertPair
    admin: CertPair
    controller_manager: CertPair
    scheduler: CertPair
    apiserver_kubelet_client: CertPair
    service_account: CertPair
    front_proxy_ca: CertificateAuthority
    front_proxy_client: CertPair

    @property
    def ca_cert(self) -> Path:
        """The CA certificate every client trusts."""
        return self.ca.paths.cert


def apiserver_sans(
    service_cidr: str = DEFAULT_SERVICE_CIDR, extra: Iterable[str] = ()
) -> tuple[list[str], list[str]]:
    """Return (DNS names, IP addresses) the apiserver's serving certificate must carry.

    Loopback for the harness and for people, the in-cluster ``kubernetes`` Service names and
    ClusterIP for pods, plus ``extra`` (e.g. a bridge address that real nodes dial later).
    """
    dns = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    ips = ["127.0.0.1", first_service_ip(service_cidr)]
    for entry in extra:
        try:
            ipaddress.ip_address(entry)
        except ValueError:
            dns.append(entry)
        else:
            ips.append(entry)
    return dns, ips


def generate_cluster_pki(
    directory: Path, service_cidr: str = DEFAULT_SERVICE_CIDR, extra_sans: Iterable[str] = ()
) -> ClusterPki:
    """Create the whole PKI of a test cluster in ``directory`` and return where each file is."""
    ca = CertificateAuthority.create(directory)
    # The aggregation layer's own CA: the apiserver proxies to extension servers with this client
    # cert, and delegated authentication (controller-manager, scheduler) trusts its headers.
    front_proxy_ca = CertificateAuthority.create(
        directory, "torchkube-test-front-proxy-ca", name="front-proxy-ca"
    )
    dns, ips = apiserver_sans(service_cidr, extra_sans)
    return ClusterPki(
        ca=ca,
        apiserver=ca.issue(
            directory, "apiserver", "kube-apiserver", dns_names=dns, ip_addresses=ips, server=True
        ),
        admin=ca.issue(
            directory, "admin", "kubernetes-admin", organizations=["system:masters"], client=True
        ),
        # The RBAC bootstrap policy grants these exact user names what each component needs.
        controller_manager=ca.issue(
            directory, "controller-manager", "system:kube-controller-manager", client=True
        ),
        scheduler=ca.issue(directory, "scheduler", "system:kube-scheduler", client=True),
        apiserver_kubelet_client=ca.issue(
            directory,
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            organizations=["system:masters"],
            client=True,
        ),
        service_account=write_service_account_keys(directory),
        front_proxy_ca=front_proxy_ca,
        front_proxy_client=front_proxy_ca.issue(
            directory, "front-proxy-client", "front-proxy-client", client=True
        ),
    )
