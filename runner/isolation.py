"""Keep one runner's memory out of another's reach (runners share plnt's uid).

`no_peeking()` runs in every runner before its recipe is imported:
- prctl(PR_SET_DUMPABLE, 0): /proc/PID/mem, /proc/PID/environ and ptrace of this process need
  CAP_SYS_PTRACE from now on, even for a process of the same uid (so another release's recipe
  code cannot read this one's memory or its LLM key);
- when running as root: the capabilities that pass that check are dropped from the bounding,
  effective, permitted and inheritable sets: CAP_SYS_PTRACE (mem, ptrace), and CAP_SYS_ADMIN and
  CAP_PERFMON, either of which still lets /proc/PID/environ and /proc/PID/maps be read (found on
  Linux 6.18). Nothing else of root is dropped: run plnt as an ordinary user.
Linux only; elsewhere it does nothing (fork mode and these checks are Linux-only).
"""

from __future__ import annotations

import ctypes
import sys

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
PEEKING_CAPABILITIES = (CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_PERFMON)
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class IsolationError(RuntimeError):
    """The runner could not make itself unreadable: it must not load a recipe."""


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _libc() -> ctypes.CDLL:
    # The process's own symbols (libc among them): find_library would run ldconfig in a subprocess.
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        raise IsolationError(f"{what} failed (errno {ctypes.get_errno()})")


def _drop_capabilities(libc: ctypes.CDLL, capabilities: tuple[int, ...]) -> None:
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(libc.capget(ctypes.byref(header), data), "capget")
    held = False
    for capability in capabilities:
        word, bit = divmod(capability, 32)
        mask = 1 << bit
        held = held or bool((data[word].effective | data[word].permitted) & mask)
        # The bounding set too (needs CAP_SETPCAP, which root has): no exec of a setuid file gets it back.
        libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)
        for field in ("effective", "permitted", "inheritable"):
            setattr(data[word], field, getattr(data[word], field) & ~mask & 0xFFFFFFFF)
    if held:
        _check(libc.capset(ctypes.byref(header), data), "capset (dropping CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_PERFMON)")


def no_peeking() -> None:
    """Make this process's memory and environment unreadable by other processes of its uid."""
    if not sys.platform.startswith("linux"):
        return
    libc = _libc()
    _check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE, 0)")
    _drop_capabilities(libc, PEEKING_CAPABILITIES)


def is_dumpable() -> bool:
    return bool(_libc().prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))
