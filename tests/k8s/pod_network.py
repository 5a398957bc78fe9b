"""A pod and service network for a test cluster: one Linux network namespace of its own.

kwok's nodes run no containers and a test cluster has no CNI, no kube-proxy and no cluster DNS, so
nothing answers on a pod's IP or a Service's name. To deploy through the real path (plnt's smoke test
and gateway dialling `http://RELEASE.NS.svc.cluster.local`), a test runs the cluster, plnt and the
node stand-in (tests/k8s/node_standin.py) inside a PodNetwork:

- a network namespace `plnt-pods-PID-N` with its loopback up, in which the pod range (POD_CIDR) and
  the Service range (SERVICE_CIDR) are local addresses (`ip route add local CIDR dev lo`), so a
  process binds any pod or cluster IP there and nothing leaves the namespace;
- /etc/netns/NAME/hosts, which `ip netns exec` shows to the processes it starts as /etc/hosts: the
  node stand-in writes one line per Service there, as cluster DNS would answer.

The test's own thread enters the namespace with `entered()` (setns on that thread only; sockets and
child processes created inside stay in it), and starts processes that need the Service names with
`exec_prefix()`. Creating a namespace needs CAP_SYS_ADMIN: these tests run as root, as CI does.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.k8s.cluster import KWOK_STAGES, SERVICE_CIDR

POD_CIDR = "10.244.0.0/16"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_names = itertools.count()


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns(CLONE_NEWNET): {os.strerror(errno)}")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class PodNetwork:
    def __init__(self, cidrs: tuple[str, ...] = (POD_CIDR, SERVICE_CIDR)) -> None:
        """cidrs: the ranges that are local addresses in the namespace (every cluster's pod and Service
        ranges: clusters sharing one PodNetwork need ranges apart, see ClusterSite)."""
        self.cidrs = cidrs
        self.name = f"plnt-pods-{os.getpid()}-{next(_names)}"
        self.etc_dir = Path("/etc/netns") / self.name
        self.hosts_file = self.etc_dir / "hosts"

    def __enter__(self) -> PodNetwork:
        if shutil.which("ip") is None:
            raise RuntimeError("`ip` (iproute2) is needed to make the pod network namespace: apt-get install -y iproute2")
        if os.geteuid() != 0:
            raise RuntimeError("making a network namespace needs root (CAP_SYS_ADMIN): run the k8s tests as root, "
                               "as CI does, or leave them out with -m 'not k8s'")
        _remove_left_behind()
        _ip("netns", "add", self.name)
        try:
            _ip("-n", self.name, "link", "set", "lo", "up")
            for cidr in self.cidrs:
                _ip("-n", self.name, "route", "add", "local", cidr, "dev", "lo")
            self.etc_dir.mkdir(parents=True, exist_ok=True)
            self.hosts_file.write_text("127.0.0.1 localhost\n")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ends every process still in the namespace (a stopped test leaves none behind), then the namespace."""
        _remove(self.name)

    def pids(self) -> list[int]:
        return _pids(self.name)

    def exec_prefix(self) -> list[str]:
        """Start a process in the namespace with the Service names in its /etc/hosts."""
        return ["ip", "netns", "exec", self.name]

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """This thread's sockets and child processes in the namespace until the block ends."""
        with open("/proc/thread-self/ns/net") as home, open(f"/run/netns/{self.name}") as pods:
            _setns(pods.fileno())
            try:
                yield
            finally:
                _setns(home.fileno())


def _pids(name: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def _remove(name: str) -> None:
    """Ends every process in namespace `name`, then the namespace and its /etc/netns directory."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _pids(name)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while pids and _pids(name) and time.monotonic() < deadline:
            time.sleep(0.1)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


def _remove_left_behind() -> None:
    """Namespaces of test runs killed before they could clean up (their pid is gone) are removed."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name, pid in re.findall(r"^(plnt-pods-(\d+)-\d+)", listing, re.MULTILINE):
        if not Path(f"/proc/{pid}").exists():
            _remove(name)


def stages_without_pod_readiness(bin_dir: Path, into: Path) -> Path:
    """kwok's Stage documents minus `pod-ready` (which makes every pod Running and Ready at once, with an
    IP of kwok's choice): in a PodNetwork the node stand-in reports pods' IPs and readiness instead."""
    documents = (bin_dir / KWOK_STAGES).read_text().split("\n---\n")
    kept = [d for d in documents if "name: pod-ready\n" not in d]
    if len(kept) != len(documents) - 1:
        raise RuntimeError(f"{bin_dir / KWOK_STAGES}: expected one `pod-ready` stage among {len(documents)} documents")
    into.write_text("\n---\n".join(kept))
    return into
