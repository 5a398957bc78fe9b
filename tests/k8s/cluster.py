"""A real Kubernetes control plane on 127.0.0.1 for tests: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok (fake nodes that report Ready and run no containers), started as processes.

    with LocalCluster(bin_dir, work_dir) as cluster:
        api = kubernetes.client.CoreV1Api(cluster.api_client())

The binaries come from tools/build_k8s.sh. Everything a cluster writes stays under its work dir:
certificates and keys (pki/), kubeconfigs, etcd's data, the audit log (audit.log) and one log per
process (logs/NAME.log), so a failed test can be read afterwards. Every port is picked free, so two
clusters (two work dirs) run side by side. Each process runs in a process group of its own, which
close() ends.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
KWOK_STAGES = "kwok-stages.yaml"  # written beside the binaries by tools/build_k8s.sh, from kwok's own source
SERVICE_CIDR = "10.0.0.0/24"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"  # kwok manages the nodes that carry it (value "fake")
GPU_RESOURCE = "nvidia.com/gpu"
GPU_CLASS_LABEL = "plnt.dev/gpu-class"
FRONT_PROXY_CLIENT = "front-proxy-client"  # the aggregator's client certificate's name (--requestheader-allowed-names)


class ClusterError(RuntimeError):
    """The cluster could not start (a process died, or something was not ready in time)."""


@dataclass(frozen=True)
class FakeNode:
    """A Node object kwok keeps Ready. gpus > 0 advertises nvidia.com/gpu capacity, as a device plugin would."""

    name: str
    gpus: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    cpu: str = "32"
    memory: str = "256Gi"
    pods: str = "110"

    def manifest(self) -> dict[str, Any]:
        resources = {"cpu": self.cpu, "memory": self.memory, "pods": self.pods}
        if self.gpus:
            resources[GPU_RESOURCE] = str(self.gpus)
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "annotations": {KWOK_ANNOTATION: "fake"},
                "labels": {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64", "type": "kwok", **self.labels},
            },
            # Node status is accepted on create (a kubelet registers this way); kwok keeps it afterwards.
            "status": {"capacity": resources, "allocatable": resources},
        }


DEFAULT_NODES: tuple[FakeNode, ...] = (
    FakeNode("node-a"),
    FakeNode("node-b"),
    FakeNode("gpu-a100-0", gpus=1, labels={GPU_CLASS_LABEL: "a100"}),
    FakeNode("gpu-l4-0", gpus=1, labels={GPU_CLASS_LABEL: "l4"}),
)


# -- certificates -------------------------------------------------------------------------------------

def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())  # P-256: fast to make, accepted by every component


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@dataclass
class _CA:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, common_name: str) -> _CA:
        key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    def issue(self, common_name: str, *, organizations: Sequence[str] = (), server: bool = False,
              client: bool | None = None, dns: Sequence[str] = (), ips: Sequence[str] = ()
              ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        """A leaf certificate for a server, a client (the default), or both (server=True, client=True:
        one certificate at both ends of mutual TLS, as KEDA's operator and metrics adapter share theirs)."""
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        if client if client is not None else not server:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        key = _key()
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = datetime.datetime.now(datetime.UTC)
        builder = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False))
        if dns or ips:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return key, builder.sign(self.key, hashes.SHA256())


# -- processes ------------------------------------------------------------------------------------------

_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def free_port() -> int:
    """A port free on 127.0.0.1 now, never the same one twice in this process (two clusters starting
    at once in one test run must not be handed the same port before either binds it)."""
    with _ports_lock:
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    args: tuple[str, ...] = ()
    executable: Path | None = None  # None: the binary NAME in the cluster's bin dir
    env: dict[str, str] | None = None
    stopped: bool = False  # once stopped, its group id is never signalled again: the number may be reused

    def check_alive(self) -> None:
        code = self.popen.poll()
        if code is not None:
            raise ClusterError(f"{self.name} exited with code {code} while the cluster was starting; "
                               f"the end of {self.log}:\n{_tail(self.log)}")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to its process group, then SIGKILL after `grace` seconds."""
        if self.stopped:
            return
        self.stopped = True
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        # Whatever else is left in the group (nothing, normally).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)


# -- the cluster ----------------------------------------------------------------------------------------

class LocalCluster:
    """One control plane. start() returns once /readyz says ok and every fake node is Ready."""

    def __init__(self, bin_dir: Path, work_dir: Path, *, nodes: Sequence[FakeNode] = DEFAULT_NODES,
                 start_timeout: float = 180.0, kwok_stages: Path | None = None,
                 service_cidr: str = SERVICE_CIDR, hpa_sync_period: str | None = None) -> None:
        """kwok_stages: kwok's Stage documents (default: kwok's own, which make every pod Running and
        Ready at once); tests/k8s/pod_network.py passes a set without pod readiness, which its node
        stand-in reports instead. hpa_sync_period: kube-controller-manager's
        --horizontal-pod-autoscaler-sync-period (its default, 15s, when None)."""
        self.bin_dir = Path(bin_dir)
        self.work_dir = Path(work_dir)
        self.nodes = tuple(nodes)
        self.start_timeout = start_timeout
        missing = [b for b in (*BINARIES, KWOK_STAGES) if not (self.bin_dir / b).is_file()]
        if missing:
            raise ClusterError(f"{self.bin_dir} lacks {', '.join(missing)}: build them with tools/build_k8s.sh")
        self.kwok_stages = kwok_stages or self.bin_dir / KWOK_STAGES
        self.service_cidr = service_cidr
        self.hpa_sync_period = hpa_sync_period
        self.pki = self.work_dir / "pki"
        self.logs = self.work_dir / "logs"
        self.audit_log = self.work_dir / "audit.log"
        self.kubeconfig = self.work_dir / "admin.kubeconfig"
        self.port = 0
        self._processes: list[_Process] = []
        self._log_files: list[IO[bytes]] = []
        self._stopped: dict[str, tuple[str, ...]] = {}  # components stopped by stop_component: their arguments

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # -- lifecycle

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        if self._processes:
            raise ClusterError(f"{self.work_dir}: this cluster was started already; make a new LocalCluster")
        for d in (self.pki, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.start_timeout
        try:
            self._write_pki()
            etcd_url = self._start_etcd(deadline)
            self._start_apiserver(etcd_url, deadline)
            self._start_controllers()
            self._create_nodes()
            self._wait(deadline, "every fake node Ready", self._nodes_ready)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stops every process, the last started first. Logs and data stay in the work dir."""
        for proc in reversed(self._processes):
            proc.stop()
        for f in self._log_files:
            f.close()
        self._log_files.clear()

    # -- clients

    def api_client(self) -> Any:
        """A `kubernetes.client.ApiClient` authenticated as the admin (system:masters)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def get(self, path: str, timeout: float = 10.0) -> bytes:
        """GET a raw API path as the admin (e.g. /version, /readyz)."""
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        with urllib.request.urlopen(self.server + path, context=ctx, timeout=timeout) as response:
            return response.read()

    def audit_events(self) -> list[dict[str, Any]]:
        """The audit log so far, one dict per event (audit.k8s.io/v1 Event)."""
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]

    def requests_of(self, user: str) -> set[tuple[str, str, str, str, int]]:
        """(group, resource[/subresource], verb, namespace, response code) of each request `user` made."""
        used = set()
        for event in self.audit_events():
            if event.get("user", {}).get("username") != user or event.get("stage") != "ResponseComplete":
                continue
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            used.add((ref.get("apiGroup", ""), resource, event["verb"], ref.get("namespace", ""),
                      event.get("responseStatus", {}).get("code", 0)))
        return used

    def token_kubeconfig(self, account: str, namespace: str, path: Path) -> Path:
        """A kubeconfig holding a token the TokenRequest API issued for ServiceAccount namespace/account."""
        from kubernetes import client as k8s

        request = k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
        token = k8s.CoreV1Api(self.api_client()).create_namespaced_service_account_token(
            account, namespace, request).status.token
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "local",
            "clusters": [{"name": "local", "cluster": {"server": self.server,
                                                       "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": account}}]}, indent=2))
        path.chmod(0o600)
        return path

    def issue(self, name: str, into: Path, *, server: bool = False, client: bool | None = None,
              dns: Sequence[str] = (), ips: Sequence[str] = ()) -> None:
        """A key (tls.key) and certificate (tls.crt) from the cluster's CA, with the CA (ca.crt), in `into`:
        the layout of a kubernetes.io/tls Secret, for a process run beside the cluster (run_beside)."""
        ca = _CA(serialization.load_pem_private_key((self.pki / "ca.key").read_bytes(), password=None),  # type: ignore[arg-type]
                 x509.load_pem_x509_certificate((self.pki / "ca.crt").read_bytes()))
        key, cert = ca.issue(name, server=server, client=client, dns=dns, ips=ips)
        into.mkdir(parents=True, exist_ok=True)
        _write_key(into / "tls.key", key)
        _write_cert(into / "tls.crt", cert)
        _write_cert(into / "ca.crt", ca.cert)

    def alive(self) -> dict[str, bool]:
        return {p.name: p.popen.poll() is None for p in self._processes}

    # -- steps

    def _write_pki(self) -> None:
        ca = _CA.create("plnt-test-ca")
        _write_key(self.pki / "ca.key", ca.key)
        _write_cert(self.pki / "ca.crt", ca.cert)
        # The apiserver's serving cert: every name a client in or out of the cluster may dial.
        service_ip = str(next(ipaddress.ip_network(self.service_cidr).hosts()))
        key, cert = ca.issue("kube-apiserver", server=True, ips=["127.0.0.1", service_ip],
                             dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                  "kubernetes.default.svc.cluster.local"])
        _write_key(self.pki / "apiserver.key", key)
        _write_cert(self.pki / "apiserver.crt", cert)
        # Client identities: RBAC's bootstrap roles bind the controller manager and scheduler by these names.
        for name, cn, orgs in (("admin", "plnt-test-admin", ["system:masters"]),
                               ("kube-controller-manager", "system:kube-controller-manager", []),
                               ("kube-scheduler", "system:kube-scheduler", []),
                               ("kwok", "kwok", ["system:masters"])):  # kwok writes status of nodes and pods
            key, cert = ca.issue(cn, organizations=orgs)
            _write_key(self.pki / f"{name}.key", key)
            _write_cert(self.pki / f"{name}.crt", cert)
        # The aggregation layer: kube-apiserver proxies an APIService's requests (e.g. external.metrics.k8s.io
        # to KEDA's metrics adapter) with this client certificate, from a CA of its own, naming the user in
        # X-Remote-* headers that the extension server trusts only from that CA and name.
        front_proxy = _CA.create("plnt-test-front-proxy-ca")
        _write_cert(self.pki / "front-proxy-ca.crt", front_proxy.cert)
        key, cert = front_proxy.issue(FRONT_PROXY_CLIENT)
        _write_key(self.pki / "front-proxy-client.key", key)
        _write_cert(self.pki / "front-proxy-client.crt", cert)
        # Service-account tokens: the apiserver signs with the private key, verifies with the public one.
        sa = _key()
        _write_key(self.pki / "sa.key", sa)
        (self.pki / "sa.pub").write_bytes(sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    def _write_kubeconfig(self, path: Path, user: str) -> Path:
        # JSON is YAML: no YAML writer needed. Paths to files, so a reader sees which identity is which.
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "local",
            "clusters": [{"name": "local", "cluster": {"server": self.server,
                                                       "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": user, "user": {"client-certificate": str(self.pki / f"{user}.crt"),
                                              "client-key": str(self.pki / f"{user}.key")}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        }, indent=2))
        path.chmod(0o600)
        return path

    def run_beside(self, name: str, executable: Path, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        """Start another process for this cluster (e.g. KEDA, Prometheus): its log is logs/NAME.log,
        and close() stops it first, before the control plane."""
        self._spawn(name, args, executable=executable, env=env)

    def check_alive(self) -> None:
        """Raises ClusterError, with the end of its log, if any process of the cluster has exited."""
        for proc in self._processes:
            proc.check_alive()

    def _spawn(self, name: str, args: Sequence[str], *, executable: Path | None = None,
               env: dict[str, str] | None = None) -> _Process:
        log_path = self.logs / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - closed in close(), the process writes to it until then
        self._log_files.append(log)
        popen = subprocess.Popen([str(executable or self.bin_dir / name), *args], stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, cwd=self.work_dir, env=env,
                                 start_new_session=True)  # its own process group: close() ends it and its children
        proc = _Process(name, popen, log_path, tuple(args), executable, env)
        self._processes.append(proc)
        return proc

    # -- faults

    def stop_component(self, name: str) -> None:
        """Stop one component (e.g. "kube-apiserver", "etcd") as an outage would; restart_component brings it back."""
        proc = self._component(name)
        proc.stop()
        self._processes.remove(proc)
        self._stopped[name] = proc.args

    def restart_component(self, name: str, timeout: float = 60.0) -> None:
        """Start a stopped component again with the same arguments (same ports, same data), and wait
        until the API server answers /readyz again."""
        self._spawn(name, self._stopped.pop(name))
        wait_for(f"kube-apiserver /readyz after {name} came back", lambda: self.get("/readyz", timeout=5) == b"ok",
                 timeout=timeout)
        # A controller that gave up while the API was away (kube-controller-manager exits when it cannot
        # start a controller) is started again, as the kubelet restarts a static pod.
        for proc in [p for p in self._processes if p.popen.poll() is not None]:
            self._processes.remove(proc)
            self._spawn(proc.name, proc.args, executable=proc.executable, env=proc.env)

    def _component(self, name: str) -> _Process:
        for proc in self._processes:
            if proc.name == name:
                return proc
        raise ClusterError(f"no running {name} in this cluster")

    def _wait(self, deadline: float, what: str, ready: Callable[[], bool]) -> None:
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            for proc in self._processes:
                proc.check_alive()
            try:
                if ready():
                    return
            except Exception as e:  # not up yet: refused connection, 503, missing object
                last_error = e
            time.sleep(0.25)
        logs = "\n".join(f"--- the end of {p.log}:\n{_tail(p.log, 15)}" for p in self._processes)
        raise ClusterError(f"timed out waiting for {what} (last error: {last_error!r})\n{logs}")

    def _start_etcd(self, deadline: float) -> str:
        client, peer = free_port(), free_port()
        url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        self._spawn("etcd", [
            "--name=local", f"--data-dir={self.work_dir / 'etcd'}",
            f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=local={peer_url}",
            "--unsafe-no-fsync",  # throwaway data: no fsync keeps two clusters on 2 cores fast
            "--quota-backend-bytes=1073741824", "--log-level=warn",
        ])
        def healthy() -> bool:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                return b'"health":"true"' in response.read()

        self._wait(deadline, "etcd /health", healthy)
        return url

    def _start_apiserver(self, etcd_url: str, deadline: float) -> None:
        self.port = free_port()
        policy = self.work_dir / "audit-policy.yaml"
        # Every request at Metadata level: who, which verb, which resource in which namespace (no bodies).
        policy.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n")
        self._spawn("kube-apiserver", [
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            # The `kubernetes` Service's endpoints would be 127.0.0.1, which Endpoints refuse: leave it without.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.work_dir / 'apiserver'}",
            f"--tls-cert-file={self.pki / 'apiserver.crt'}", f"--tls-private-key-file={self.pki / 'apiserver.key'}",
            f"--client-ca-file={self.pki / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.pki / 'sa.pub'}",
            f"--service-account-signing-key-file={self.pki / 'sa.key'}",
            f"--service-cluster-ip-range={self.service_cidr}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            # The aggregation layer (APIServices served by extension servers: KEDA's metrics adapter).
            f"--requestheader-client-ca-file={self.pki / 'front-proxy-ca.crt'}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={self.pki / 'front-proxy-client.key'}",
            f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
            "--audit-log-mode=blocking",  # the event is in the file when the response is sent
        ])
        self._write_kubeconfig(self.kubeconfig, "admin")
        self._wait(deadline, "kube-apiserver /readyz", lambda: self.get("/readyz", timeout=5) == b"ok")

    def _start_controllers(self) -> None:
        kcm = self._write_kubeconfig(self.work_dir / "kube-controller-manager.kubeconfig", "kube-controller-manager")
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={kcm}", f"--authentication-kubeconfig={kcm}", f"--authorization-kubeconfig={kcm}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            f"--cert-dir={self.work_dir / 'kube-controller-manager'}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",  # each controller as its own RBAC identity, as in a real cluster
            f"--service-account-private-key-file={self.pki / 'sa.key'}",
            f"--root-ca-file={self.pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={self.pki / 'ca.crt'}", f"--cluster-signing-key-file={self.pki / 'ca.key'}",
            f"--service-cluster-ip-range={self.service_cidr}",
            "--controllers=*",  # the default set: deployments, replicasets, serviceaccounts, tokens, gc, nodes, ...
            *([f"--horizontal-pod-autoscaler-sync-period={self.hpa_sync_period}"] if self.hpa_sync_period else []),
        ])
        scheduler = self._write_kubeconfig(self.work_dir / "kube-scheduler.kubeconfig", "kube-scheduler")
        self._spawn("kube-scheduler", [
            f"--kubeconfig={scheduler}", f"--authentication-kubeconfig={scheduler}",
            f"--authorization-kubeconfig={scheduler}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            f"--cert-dir={self.work_dir / 'kube-scheduler'}",
            "--leader-elect=false",
        ])
        kwok = self._write_kubeconfig(self.work_dir / "kwok.kubeconfig", "kwok")
        self._spawn("kwok", [
            f"--kubeconfig={kwok}",
            f"--config={self.kwok_stages}",
            "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            "--node-ip=127.0.0.1",
            "--node-lease-duration-seconds=40",  # kwok renews each node's Lease: the node lifecycle controller sees it alive
        ])

    def _create_nodes(self) -> None:
        from kubernetes import client

        with self.api_client() as api:
            core = client.CoreV1Api(api)
            for node in self.nodes:
                core.create_node(node.manifest())

    def _nodes_ready(self) -> bool:
        from kubernetes import client

        with self.api_client() as api:
            ready = {n.metadata.name for n in client.CoreV1Api(api).list_node().items
                     if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or ())}
        return {n.name for n in self.nodes} <= ready


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.5) -> Any:
    """Polls check() until it returns something truthy, which is returned; on timeout, fails naming `what`
    and the last value or error."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - kept for the message
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
