"""plnt's connection to an external Temporal over TLS with a client certificate, for real.

A TLS-terminating TCP proxy (Python's ssl: ALPN h2, client certificate required, certificates
made here with `cryptography`) stands in front of the real Temporal dev server, the way a TLS
frontend or a load balancer does; plnt connects through it as it would to Temporal Cloud or a
cluster with mTLS. The proxy is test plumbing, not a stand-in: every RPC reaches the real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from plnt.reconciler.saga.temporal_server import TemporalConnectError, client_options, connect_external
from plnt.reconciler.settings import Settings
from pydantic import SecretStr, ValidationError
from typer.testing import CliRunner

from tests.conftest import SpecRepo
from tests.e2e.harness import invoke, running_plnt, settings_for, wait_phase

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


@dataclass
class Issued:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        cert.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        key.write_bytes(self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert, key


def issue(name: str, ca: Issued | None = None, *, client: bool = False) -> Issued:
    """A CA (no `ca`), or a server / client certificate signed by `ca`."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(ca.cert.subject if ca else subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(NOW - datetime.timedelta(days=1)).not_valid_after(NOW + datetime.timedelta(days=3650)))
    if ca is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        builder = builder.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                      content_commitment=False, key_encipherment=False,
                                                      data_encipherment=False, key_agreement=False,
                                                      encipher_only=False, decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if not client:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    signer = ca.key if ca else key
    return Issued(key, builder.sign(signer, hashes.SHA256()))


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path          # a CA that signed nothing plnt meets


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca, other = issue("plnt test CA"), issue("somebody else's CA")
    server, client = issue("temporal", ca), issue("plnt-worker", ca, client=True)
    server_cert, server_key = server.write(tmp_path, "server")
    client_cert, client_key = client.write(tmp_path, "client")
    return Pki(ca=ca.write(tmp_path, "ca")[0], server_cert=server_cert, server_key=server_key,
               client_cert=client_cert, client_key=client_key, other_ca=other.write(tmp_path, "other-ca")[0])


@contextlib.asynccontextmanager
async def tls_proxy(pki: Pki, upstream: str) -> AsyncIterator[str]:
    """TLS (h2, client certificate required) on a free port, plain TCP to `upstream`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.load_verify_locations(cafile=pki.ca)
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    host, port = upstream.rsplit(":", 1)
    tasks: set[asyncio.Task[None]] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

    def track(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(handle(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(track, "127.0.0.1", 0, ssl=context)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def tls_settings(address: str, namespace: str, pki: Pki, **changes: object) -> Settings:
    values: dict[str, object] = dict(repo="unused", temporal_address=address, temporal_namespace=namespace,
                                     temporal_tls_ca=pki.ca, temporal_tls_cert=pki.client_cert,
                                     temporal_tls_key=pki.client_key)
    values.update(changes)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.mark.integration
async def test_plnt_deploys_through_temporal_over_mutual_tls(spec_repo: SpecRepo, tmp_path: Path, pki: Pki,
                                                            temporal_address: str, temporal_namespace: str) -> None:
    async with tls_proxy(pki, temporal_address) as proxied:
        settings = settings_for(spec_repo.path, tmp_path / "state", proxied, temporal_namespace,
                                temporal_tls_ca=pki.ca, temporal_tls_cert=pki.client_cert,
                                temporal_tls_key=pki.client_key, task_queue="plnt-over-tls")
        async with running_plnt(settings) as plnt:
            await wait_phase(plnt, "Ready", version="1.2.0")
            assert (await invoke(plnt)).status_code == 200


@pytest.mark.integration
@pytest.mark.parametrize(("changes", "checks"), [
    ({"temporal_tls_cert": None, "temporal_tls_key": None},
     "whether it requires a client certificate (--temporal-tls-cert/--temporal-tls-key)"),
    ({"temporal_tls_ca": "other"}, "that its certificate chains to --temporal-tls-ca"),
    ({"temporal_tls_ca": None, "temporal_tls_cert": None, "temporal_tls_key": None, "temporal_tls": False},
     "whether it serves TLS only (--temporal-tls, --temporal-tls-ca)"),
])
async def test_a_refused_tls_connection_names_the_address_and_what_to_check(
        pki: Pki, temporal_address: str, temporal_namespace: str, changes: dict[str, object], checks: str) -> None:
    if changes.get("temporal_tls_ca") == "other":
        changes = {**changes, "temporal_tls_ca": pki.other_ca}
    async with tls_proxy(pki, temporal_address) as proxied:
        with pytest.raises(TemporalConnectError) as caught:
            await connect_external(tls_settings(proxied, temporal_namespace, pki, **changes), timeout_s=1.0)
    message = str(caught.value)
    assert message.startswith(f"cannot connect to Temporal at {proxied} (namespace {temporal_namespace!r}")
    assert checks in message


@pytest.mark.integration
async def test_a_namespace_the_server_lacks_is_named_at_connect(pki: Pki, temporal_address: str) -> None:
    async with tls_proxy(pki, temporal_address) as proxied:
        with pytest.raises(TemporalConnectError) as caught:
            await connect_external(tls_settings(proxied, "no-such-namespace", pki), timeout_s=5.0)
    assert str(caught.value) == (f"Temporal at {proxied} has no namespace 'no-such-namespace': create it, "
                                 f"or name another with --temporal-namespace")


def test_connection_options_as_temporal_clients_take_them(pki: Pki, tmp_path: Path) -> None:
    options = client_options(tls_settings("t:7233", "ns", pki, temporal_api_key=SecretStr("k3y")))
    assert options["api_key"] == "k3y"
    assert options["tls"].server_root_ca_cert == pki.ca.read_bytes()
    assert options["tls"].client_cert == pki.client_cert.read_bytes()
    assert client_options(Settings(repo="r", temporal_address="t:7233", temporal_tls=True)) == {"tls": True}
    assert client_options(Settings(repo="r", temporal_address="t:7233")) == {}
    with pytest.raises(TemporalConnectError, match="cannot read --temporal-tls-ca .*missing.pem"):
        client_options(tls_settings("t:7233", "ns", pki, temporal_tls_ca=tmp_path / "missing.pem"))
    with pytest.raises(ValidationError, match="--temporal-tls-cert and --temporal-tls-key go together"):
        tls_settings("t:7233", "ns", pki, temporal_tls_key=None)


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--temporal-tls"], {}, "TLS and API key options are for an external Temporal: add --temporal-address"),
    (["--temporal-address", "t:1", "--temporal-api-key-env", "PLNT_TEST_NO_SUCH_VAR"], {},
     "--temporal-api-key-env PLNT_TEST_NO_SUCH_VAR: the environment variable is not set or empty"),
    (["--temporal-address", "t:1", "--temporal-api-key-file", "/nonexistent/key"], {},
     "--temporal-api-key-file /nonexistent/key: cannot read it"),
    (["--temporal-address", "t:1", "--temporal-api-key-env", "K", "--temporal-api-key-file", "/k"], {"K": "v"},
     "give --temporal-api-key-env or --temporal-api-key-file, not both"),
])
def test_cli_temporal_options_fail_with_one_clear_line(args: list[str], env: dict[str, str], message: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from plnt.reconciler.cli import main as cli
    from plnt.reconciler.cli import up as cli_up

    monkeypatch.setattr(cli_up, "setup_logging", lambda verbose: None)  # `up` sets process-wide log levels
    result = CliRunner().invoke(cli.app, ["up", "--repo", "/nonexistent", *args], env=env)
    assert result.exit_code == 2
    assert f"error: {message}" in result.output
