"""STAND-IN for the kubelet, kube-proxy and cluster DNS of kwok's nodes, run inside a PodNetwork
(tests/k8s/pod_network.py). Everything else is the real cluster: the API server, the Deployment and
ReplicaSet controllers, the scheduler, the EndpointSlice controller, kwok keeping the nodes Ready.

    python -m tests.k8s.node_standin --kubeconfig K --work-dir D --hosts-file H \\
        --node node-a --node node-b --program plnt=/path/to/plnt --program python=/path/to/python

For each pod the scheduler bound to one of the --node nodes, as a kubelet would, with processes in
place of containers (no images here):
- it gives the pod an IP from --pod-cidr (a local address of the namespace) and reports it in the pod's
  status;
- it makes the pod's volumes directories (emptyDir; configMap and secret with their items), then runs
  the init containers in order and then the containers: the command is looked up in --program (what
  the image would run: `plnt` is this checkout's console script), with the arguments and environment
  the pod spec carries (env, envFrom, configMap/secret/field references), each volume's mountPath
  replaced by its directory, and `0.0.0.0` by the pod's IP (pods here share one namespace);
- a failing init container is retried with a back-off and reported as CrashLoopBackOff with its last
  output line, as the kubelet does; the pod is Ready only when each container's readiness probe
  (httpGet) answers 2xx, and not Ready again when a container exits (it is restarted);
- a deleted pod's processes are stopped (SIGTERM, then SIGKILL after the grace period, at most 10 s),
  each pod on a thread of its own: the Services keep following their EndpointSlices meanwhile (a
  runner draining for seconds held the proxies on a gone pod's address, and connections to it failed).

For each Service with a cluster IP, as kube-proxy and cluster DNS would: a line
`CLUSTER_IP NAME.NS.svc.DOMAIN` (--cluster-domain) in --hosts-file (the namespace's /etc/hosts for
processes started with `ip netns exec`; the stand-ins of several clusters keep a block each), and a TCP proxy on CLUSTER_IP:PORT to the ready endpoints of
the Service's EndpointSlices (round robin; a connection with none ready is closed at once).

Not done: images, resource limits and cgroups, users and security contexts (processes run as this
one's user), probes other than httpGet, exec and logs through the API.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import fcntl
import ipaddress
import itertools
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, config

from tests.k8s.pod_network import POD_CIDR

log = logging.getLogger("node-standin")
SYNC_INTERVAL_S = 0.3
PROBE_INTERVAL_S = 0.3
MAX_GRACE_S = 10.0
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # probes never go through a proxy


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


class Pods:
    """The API calls the stand-in makes, as the cluster admin."""

    def __init__(self, kubeconfig: str) -> None:
        api = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(api)
        self.discovery = client.DiscoveryV1Api(api)

    def patch_status(self, pod: client.V1Pod, status: dict[str, Any]) -> None:
        try:
            self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})
        except client.ApiException as e:
            if e.status != 404:  # a pod deleted meanwhile: nothing to report
                raise


class PodRun:
    """One pod's processes and the thread that runs them through their life."""

    def __init__(self, pods: Pods, pod: client.V1Pod, ip: str, work_dir: Path, programs: dict[str, str]) -> None:
        self.pods = pods
        self.pod = pod
        self.ip = ip
        self.dir = work_dir / "pods" / f"{pod.metadata.namespace}_{pod.metadata.name}"
        self.programs = programs
        self.stopping = threading.Event()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.thread = threading.Thread(target=self._run, name=f"pod-{pod.metadata.name}", daemon=True)

    @property
    def key(self) -> str:
        return f"{self.pod.metadata.namespace}/{self.pod.metadata.name}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        grace = min(float(self.pod.spec.termination_grace_period_seconds or 30), MAX_GRACE_S)
        for proc in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.processes.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.thread.join(timeout=MAX_GRACE_S)
        log.info("pod-stopped %s", self.key)

    # -- the pod's life

    def _run(self) -> None:
        try:
            self._live()
        except Exception:
            log.exception("pod %s: the stand-in failed", self.key)

    def _live(self) -> None:
        spec = self.pod.spec
        self.pods.patch_status(self.pod, {
            "phase": "Pending", "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.ip, "podIPs": [{"ip": self.ip}], "startTime": _now(),
            "conditions": [{"type": t, "status": "False", "lastTransitionTime": _now()}
                           for t in ("Initialized", "ContainersReady", "Ready")]})
        volumes = self._volumes()
        inits = spec.init_containers or []
        for index, container in enumerate(inits):
            if not self._run_to_completion(container, volumes, index, inits):
                return
        self.pods.patch_status(self.pod, {
            "conditions": [{"type": "Initialized", "status": "True", "lastTransitionTime": _now()}],
            "initContainerStatuses": [self._terminated(c, 0, "Completed") for c in inits]})
        restarts = dict.fromkeys((c.name for c in spec.containers), 0)
        for container in spec.containers:
            self.processes[container.name] = self._spawn(container, volumes)
        ready = False
        while not self.stopping.is_set():
            exited = [c for c in spec.containers if self.processes[c.name].poll() is not None]
            if exited:
                for container in exited:
                    code = self.processes[container.name].returncode
                    log.info("container-exited %s/%s code=%s; restarting", self.key, container.name, code)
                    restarts[container.name] += 1
                    self.processes[container.name] = self._spawn(container, volumes)
                ready = False
                self._report_ready(False, restarts)
            elif not ready and all(self._probe(c) for c in spec.containers):
                ready = True
                self._report_ready(True, restarts)
            self.stopping.wait(PROBE_INTERVAL_S)

    def _report_ready(self, ready: bool, restarts: dict[str, int]) -> None:
        status = "True" if ready else "False"
        self.pods.patch_status(self.pod, {
            "phase": "Running",
            "conditions": [{"type": t, "status": status, "lastTransitionTime": _now()}
                           for t in ("ContainersReady", "Ready")],
            "containerStatuses": [{
                "name": c.name, "image": c.image, "imageID": "", "ready": ready, "started": True,
                "restartCount": restarts[c.name], "state": {"running": {"startedAt": _now()}}}
                for c in self.pod.spec.containers]})
        log.info("pod-%s %s ip=%s", "ready" if ready else "not-ready", self.key, self.ip)

    @staticmethod
    def _terminated(container: client.V1Container, code: int, reason: str) -> dict[str, Any]:
        return {"name": container.name, "image": container.image, "imageID": "", "ready": code == 0,
                "restartCount": 0, "state": {"terminated": {"exitCode": code, "reason": reason,
                                                            "startedAt": _now(), "finishedAt": _now()}}}

    def _run_to_completion(self, container: client.V1Container, volumes: dict[str, Path], index: int,
                           inits: list[client.V1Container]) -> bool:
        """An init container until it exits 0 (True), retried with a back-off; False once the pod stops."""
        backoff = 2.0
        restarts = 0
        while not self.stopping.is_set():
            proc = self._spawn(container, volumes)
            self.processes[container.name] = proc
            while proc.poll() is None and not self.stopping.is_set():
                self.stopping.wait(0.1)
            if self.stopping.is_set():
                return False
            if proc.returncode == 0:
                log.info("init-completed %s/%s", self.key, container.name)
                return True
            last = _last_line(self._log_path(container))
            log.info("init-failed %s/%s code=%s: %s", self.key, container.name, proc.returncode, last)
            self.pods.patch_status(self.pod, {"initContainerStatuses": [
                *[self._terminated(c, 0, "Completed") for c in inits[:index]],
                {"name": container.name, "image": container.image, "imageID": "", "ready": False,
                 "restartCount": restarts,
                 "state": {"waiting": {"reason": "CrashLoopBackOff",
                                       "message": f"back-off restarting failed container {container.name}: {last}"}},
                 "lastState": {"terminated": {"exitCode": proc.returncode, "reason": "Error",
                                              "message": last, "finishedAt": _now()}}}]})
            restarts += 1
            self.stopping.wait(backoff)
            backoff = min(backoff * 2, 30.0)
        return False

    # -- a container as a process

    def _log_path(self, container: client.V1Container) -> Path:
        return self.dir / "logs" / f"{container.name}.log"

    def _spawn(self, container: client.V1Container, volumes: dict[str, Path]) -> subprocess.Popen[bytes]:
        mounts = self._mounts(container, volumes)
        env = self._env(container)
        argv = [*(container.command or []), *(container.args or [])]
        if not argv or argv[0] not in self.programs:
            raise RuntimeError(f"{self.key}/{container.name}: no --program for the command {argv[:1]}")
        argv = [self.programs[argv[0]], *(self._arg(a, mounts, env) for a in argv[1:])]
        env = {k: self._arg(v, mounts, {}) for k, v in env.items()}
        log_path = self._log_path(container)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            log.info("container-start %s/%s: %s", self.key, container.name, " ".join(argv))
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, cwd=self.dir, start_new_session=True)

    def _arg(self, value: str, mounts: list[tuple[str, Path]], env: dict[str, str]) -> str:
        value = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), value)
        if value == "0.0.0.0":
            return self.ip
        for mount_path, directory in mounts:
            if value == mount_path or value.startswith(mount_path + "/"):
                return str(directory) + value[len(mount_path):]
        return value

    def _mounts(self, container: client.V1Container, volumes: dict[str, Path]) -> list[tuple[str, Path]]:
        mounts = [(m.mount_path.rstrip("/"), volumes[m.name] / (m.sub_path or ""))
                  for m in container.volume_mounts or []]
        return sorted(mounts, key=lambda m: -len(m[0]))  # the deepest mount wins, as in a container

    def _env(self, container: client.V1Container) -> dict[str, str]:
        # Nothing of this process's own environment but PATH: a container sees only what its spec gives.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOSTNAME": self.pod.metadata.name,
               "HOME": str(self.dir)}
        ns = self.pod.metadata.namespace
        for source in container.env_from or []:
            if source.config_map_ref:
                data = self._config_map(source.config_map_ref.name, bool(source.config_map_ref.optional))
            else:
                data = self._secret(source.secret_ref.name, bool(source.secret_ref.optional))
            env.update({f"{source.prefix or ''}{k}": v for k, v in data.items()})
        for var in container.env or []:
            if var.value_from is None:
                env[var.name] = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), var.value or "")
                continue
            ref = var.value_from
            if ref.config_map_key_ref:
                value = self._config_map(ref.config_map_key_ref.name, bool(ref.config_map_key_ref.optional)).get(
                    ref.config_map_key_ref.key)
            elif ref.secret_key_ref:
                value = self._secret(ref.secret_key_ref.name, bool(ref.secret_key_ref.optional)).get(ref.secret_key_ref.key)
            elif ref.field_ref:
                value = {"metadata.name": self.pod.metadata.name, "metadata.namespace": ns,
                         "spec.nodeName": self.pod.spec.node_name, "status.podIP": self.ip}.get(ref.field_ref.field_path)
            else:
                value = None
            if value is not None:
                env[var.name] = value
        return env

    def _config_map(self, name: str, optional: bool) -> dict[str, str]:
        try:
            return self.pods.core.read_namespaced_config_map(name, self.pod.metadata.namespace).data or {}
        except client.ApiException as e:
            if e.status == 404 and optional:
                return {}
            raise

    def _secret(self, name: str, optional: bool) -> dict[str, str]:
        try:
            data = self.pods.core.read_namespaced_secret(name, self.pod.metadata.namespace).data or {}
        except client.ApiException as e:
            if e.status == 404 and optional:
                return {}
            raise
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    def _volumes(self) -> dict[str, Path]:
        volumes: dict[str, Path] = {}
        for volume in self.pod.spec.volumes or []:
            directory = self.dir / "volumes" / volume.name
            directory.mkdir(parents=True, exist_ok=True)
            files: dict[str, str] = {}
            items = None
            if volume.config_map is not None:
                files = self._config_map(volume.config_map.name, bool(volume.config_map.optional))
                items = volume.config_map.items
            elif volume.secret is not None:
                files = self._secret(volume.secret.secret_name, bool(volume.secret.optional))
                items = volume.secret.items
            paths = {i.key: i.path for i in items} if items else {k: k for k in files}
            for key, rel in paths.items():
                if key in files:
                    target = directory / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(files[key])
            volumes[volume.name] = directory
        return volumes

    def _probe(self, container: client.V1Container) -> bool:
        probe = container.readiness_probe or container.startup_probe
        if probe is None or probe.http_get is None:
            return True
        port = probe.http_get.port
        if isinstance(port, str) and not port.isdigit():
            port = next(p.container_port for p in container.ports or [] if p.name == port)
        try:
            with _DIRECT.open(f"http://{self.ip}:{port}{probe.http_get.path or '/'}", timeout=2) as r:
                return 200 <= r.status < 400
        except OSError:
            return False


class ServiceProxies:
    """kube-proxy and cluster DNS: a TCP proxy per (cluster IP, port), the hosts file, on one event loop."""

    def __init__(self, hosts_file: Path, cluster_domain: str) -> None:
        self.hosts_file = hosts_file
        self.domain = cluster_domain
        self.loop = asyncio.new_event_loop()
        self.servers: dict[tuple[str, int], asyncio.AbstractServer] = {}
        self.backends: dict[tuple[str, int], list[tuple[str, int]]] = {}
        self.turn = itertools.count()
        self.hosts = ""
        threading.Thread(target=self.loop.run_forever, name="proxies", daemon=True).start()

    def sync(self, services: list[client.V1Service], slices: list[client.V1EndpointSlice]) -> None:
        wanted: dict[tuple[str, int], list[tuple[str, int]]] = {}
        lines = []
        for svc in services:
            ip = svc.spec.cluster_ip
            if not ip or ip == "None":
                continue
            name, ns = svc.metadata.name, svc.metadata.namespace
            lines.append(f"{ip} {name}.{ns}.svc.{self.domain}")
            mine = [s for s in slices if s.metadata.namespace == ns
                    and (s.metadata.labels or {}).get("kubernetes.io/service-name") == name]
            for port in svc.spec.ports or []:
                if (port.protocol or "TCP") != "TCP":
                    continue
                wanted[(ip, port.port)] = [
                    (address, p.port) for s in mine for p in s.ports or [] if p.name == port.name
                    for e in s.endpoints or [] if e.conditions is None or e.conditions.ready is not False
                    for address in e.addresses]
        self.backends = wanted
        for key in set(self.servers) - set(wanted):
            asyncio.run_coroutine_threadsafe(self._close(key), self.loop).result()
        for key in set(wanted) - set(self.servers):
            asyncio.run_coroutine_threadsafe(self._open(key), self.loop).result()
        text = "\n".join(lines)
        if text != self.hosts:
            self._write_hosts(text)
            self.hosts = text

    def _write_hosts(self, block: str) -> None:
        """This cluster's lines between its own markers: stand-ins of several clusters share one file.
        In place, under a lock: `ip netns exec` bind-mounts this very file as /etc/hosts (a renamed
        new file would not show)."""
        begin, end = f"# begin {self.domain}", f"# end {self.domain}"
        with open(self.hosts_file, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            text = f.read()
            if begin in text:
                text = text[:text.index(begin)] + text[text.index(end) + len(end) + 1:]
            text += f"{begin}\n{block}\n{end}\n" if block else ""
            f.seek(0)
            f.write(text)
            f.truncate()

    async def _open(self, key: tuple[str, int]) -> None:
        self.servers[key] = await asyncio.start_server(lambda r, w: self._pipe(key, r, w), key[0], key[1])
        log.info("service-proxy %s:%s", *key)

    async def _close(self, key: tuple[str, int]) -> None:
        server = self.servers.pop(key)
        server.close()
        log.info("service-proxy-closed %s:%s", *key)

    async def _pipe(self, key: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backends = self.backends.get(key) or []
        if not backends:
            writer.close()
            return
        host, port = backends[next(self.turn) % len(backends)]
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    dst.write_eof() if dst.can_write_eof() else dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        for w in (writer, up_writer):
            w.close()


class Node:
    def __init__(self, args: argparse.Namespace) -> None:
        self.pods = Pods(args.kubeconfig)
        self.nodes = set(args.node)
        self.work_dir = Path(args.work_dir)
        self.programs = dict(p.split("=", 1) for p in args.program)
        self.proxies = ServiceProxies(Path(args.hosts_file), args.cluster_domain)
        self.running: dict[str, PodRun] = {}  # by pod uid
        self.addresses = self._addresses(args.pod_cidr)
        self.taken: dict[str, str] = {}  # pod uid -> IP
        self.stopping: list[threading.Thread] = []  # pods stopping (each within its grace)

    @staticmethod
    def _addresses(cidr: str) -> Iterator[str]:
        for ip in itertools.islice(ipaddress.ip_network(cidr).hosts(), 10, None):
            yield str(ip)

    def sync(self) -> None:
        pods = self.pods.core.list_pod_for_all_namespaces().items
        seen = set()
        for pod in pods:
            if pod.spec.node_name not in self.nodes:
                continue
            uid = pod.metadata.uid
            seen.add(uid)
            terminating = pod.metadata.deletion_timestamp is not None
            if uid not in self.running and not terminating and pod.status.phase not in ("Succeeded", "Failed"):
                ip = self.taken.setdefault(uid, next(self.addresses))
                run = self.running[uid] = PodRun(self.pods, pod, ip, self.work_dir, self.programs)
                log.info("pod-start %s on %s ip=%s", run.key, pod.spec.node_name, ip)
                run.start()
            elif uid in self.running and terminating:
                self._stop(self.running.pop(uid))
        for uid in set(self.running) - seen:
            self._stop(self.running.pop(uid))
        services = self.pods.core.list_service_for_all_namespaces().items
        slices = self.pods.discovery.list_endpoint_slice_for_all_namespaces().items
        self.proxies.sync(services, slices)

    def _stop(self, run: PodRun) -> None:
        """As the kubelet: the pod's grace runs on its own, not in the way of the next sync."""
        thread = threading.Thread(target=run.stop, name=f"stop {run.key}", daemon=True)
        self.stopping = [t for t in self.stopping if t.is_alive()] + [thread]
        thread.start()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sync()
            except Exception as e:  # the API server away for a moment (a fault test): try again
                log.warning("sync-failed %r", e)
            stop.wait(SYNC_INTERVAL_S)
        for run in list(self.running.values()):
            self._stop(run)
        for thread in self.stopping:
            thread.join()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="node_standin", description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--hosts-file", required=True)
    parser.add_argument("--node", action="append", required=True, help="a node whose pods this stand-in runs")
    parser.add_argument("--program", action="append", default=[], help="COMMAND=PATH: what a container's command runs")
    parser.add_argument("--pod-cidr", default=POD_CIDR, help="pod IPs are given from this range (local in the namespace)")
    parser.add_argument("--cluster-domain", default="cluster.local", help="Service names: NAME.NS.svc.DOMAIN")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("node-standin nodes=%s", sorted(args.node))
    Node(args).run(stop)


if __name__ == "__main__":
    main()
