"""Keep one runner's memory out of another's reach (runners share plnt's uid).

`no_peeking()` runs in every runner before its recipe is imported:
- prctl(PR_SET_DUMPABLE, 0): /proc/PID/mem, /proc/PID/environ and ptrace of this process need
  CAP_SYS_PTRACE from now on, even for a process of the same uid (so another release's recipe
  code cannot read this one's memory or its LLM key);
- when running as root: CAP_SYS_PTRACE is dropped from the bounding, effective and permitted
  sets, since root holding it passes that check (a runner's recipe then cannot read other
  runners either). Nothing else of root is dropped: run plnt as an ordinary user.
Linux only; elsewhere it does nothing (fork mode and these checks are Linux-only).
"""

from __future__ import annotations

import ctypes
import sys

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
CAP_SYS_PTRACE = 19
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


def _drop_ptrace_capability(libc: ctypes.CDLL) -> None:
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(libc.capget(ctypes.byref(header), data), "capget")
    word, bit = divmod(CAP_SYS_PTRACE, 32)
    mask = 1 << bit
    if not (data[word].effective | data[word].permitted) & mask:
        return
    # The bounding set too (needs CAP_SETPCAP, which root has), so no exec of a setuid file gets it back.
    libc.prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0)
    for field in ("effective", "permitted", "inheritable"):
        setattr(data[word], field, getattr(data[word], field) & ~mask & 0xFFFFFFFF)
    _check(libc.capset(ctypes.byref(header), data), "capset (dropping CAP_SYS_PTRACE)")


def no_peeking() -> None:
    """Make this process's memory and environment unreadable by other processes of its uid."""
    if not sys.platform.startswith("linux"):
        return
    libc = _libc()
    _check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE, 0)")
    _drop_ptrace_capability(libc)


def is_dumpable() -> bool:
    return bool(_libc().prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))
