"""Recipe archives: a deterministic gzip tar of a recipe directory, and its safe extraction.

Archive format (what `pack_recipe` writes)
------------------------------------------

A recipe is published as ``recipe.tar.gz``: a gzip stream holding a **USTAR** tar of the recipe
directory (`plnt.runner.recipe`: ``workflow.yaml`` at the root, ``steps.py``, ``golden.yaml``,
``knowledge/``...). The same content always gives the same bytes, hence the same sha256 (the
archive digest a spec pins and a signature covers), whatever the file times, owners, umask or
the order the filesystem lists entries in:

* entries are the directory's subdirectories and regular files, named by their relative POSIX
  path (no leading ``./``; directories get the trailing ``/`` tar gives them) and sorted by that
  path in code-point order (a directory therefore comes right before its contents);
  ``__pycache__`` directories and ``*.pyc`` files are left out, as `directory_digest` does;
* every header has mtime 0, uid/gid 0, empty uname/gname, no link name and no device numbers;
  mode 0o755 for directories, 0o644 for files (0o755 when the source file is executable by its
  owner); nothing else about the source (times, owner, ACLs, xattrs) is recorded;
* tar format USTAR, not PAX: a USTAR header is a fixed function of (path, mode, size, type), so
  no extended header (atime/ctime, charset, long-path records) can ever slip in, and the bytes
  do not depend on which Python version decides a PAX record is "needed". The price is USTAR's
  limits: a path of at most 100 bytes, or 255 split at a ``/``, and files under 8 GiB, far beyond
  what a recipe needs; `pack_recipe` refuses a longer path by name. Names are UTF-8;
* the tar ends with the two zero blocks and is padded to a 10 KiB record (Python's `tarfile`);
* gzip: compression level 9, header mtime 0, no file name, OS byte 255 (``GzipFile`` fixed
  values). The bytes are stable for a given zlib; a different zlib implementation (zlib-ng)
  could compress differently, which is why the digest is taken of the archive that was
  published, never recomputed from a directory.

`pack_recipe` refuses (ValueError naming the path) a directory without a regular
``workflow.yaml`` at its root, symlinks, device files, fifos and sockets anywhere in it (a
recipe must be self-contained), and names that `extract_archive` would refuse (see below), so
whatever it packs extracts.

Extraction policy (what `extract_archive` refuses, and why)
-----------------------------------------------------------

An archive comes from a registry: it is untrusted input even after its signature checked out
(a trusted signer can be careless, or compromised). `extract_archive` never uses
``tarfile.extractall``: it reads the tar as a single forward stream, checks each member, and
writes the files itself. It refuses, with `UnsafeArchive` (NeedsHuman: retrying cannot help)
naming the member:

* **paths that could leave** ``dest``: absolute paths (``/...``, ``C:...``), any ``..``
  component, NUL bytes, backslashes (a separator on Windows, a trick everywhere else), control
  characters (a newline in a name could forge a line of the canonical directory digest),
  names that are not valid UTF-8, and over-long names;
* **every link**, symbolic or hard, wherever it points: a recipe never needs one, and refusing
  all of them is simpler to get right than resolving targets (a link to an in-tree path can be
  re-pointed by a later member, and a hard link aliases a file the extraction wrote). Since no
  link is ever created and every directory on the way is one this extraction made, a path in
  the archive can only name something inside ``dest``;
* **anything that is not a regular file or a directory**: character/block devices, fifos,
  contiguous files, GNU and PAX sparse files (their small header hides a large expansion);
* **duplicate names** (after dropping ``.`` and empty components), and a name used both as a
  file and as a directory: a later member must never replace or reinterpret an earlier one;
* **size limits** (`ExtractLimits`): more than ``max_files`` members, a member whose header
  declares more than ``max_file_bytes``, declared sizes adding up to more than
  ``max_total_bytes``. The bytes actually written are counted too, in 1 MiB chunks, and a
  member that yields more than its header declares is refused before the extra bytes are
  written. The decompressed stream itself is capped: it may not exceed the member contents
  accepted so far plus 4 KiB of headers per member plus 1 MiB, so a gzip bomb hiding in a huge
  PAX header, a long-name record or trailing padding is stopped after reading at most that
  much, and never reaches the disk;
* **invalid archives**: not gzip, a bad CRC, a truncated stream, a member cut short (its header
  promises more data than there is), a damaged header, no end-of-archive marker, non-zero data
  after the marker: ``"<archive> is not a valid gzip tar: ..."``.

Files are created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and get mode 0o644, or 0o755 when the
member's owner-execute bit is set; directories 0o755. No setuid/setgid/sticky bit, owner or time
from the archive is applied. ``dest`` must not exist yet (it is created) or be an empty
directory (ValueError otherwise); on any failure everything the extraction wrote is removed
(``dest`` too, if the extraction created it), so no partial tree is left behind.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from plnt.reconciler.errors import UnsafeArchive

WORKFLOW_FILE = "workflow.yaml"

CHUNK = 1 << 20
"""Bytes per read when hashing an archive or copying a member."""

GZIP_LEVEL = 9
TAR_FORMAT = tarfile.USTAR_FORMAT

_STREAM_SLACK = 1 << 20          # read-ahead, end-of-archive blocks, record padding
_PER_MEMBER_OVERHEAD = 4096      # a header, a PAX header and its record, padding: generous
_TAIL = 64 * 1024                # decompressed bytes kept to inspect the block that ended the archive
_MAX_NAME_BYTES = 1024
_MAX_COMPONENT_BYTES = 255
_FIX = "re-pack the recipe directory with plnt's pack_recipe and publish it again"

_DRIVE = re.compile(r"^[A-Za-z]:")
_TYPE_NAMES = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a fifo",
    tarfile.CONTTYPE: "a contiguous file",
    tarfile.GNUTYPE_SPARSE: "a sparse file",
}


# --- names -----------------------------------------------------------------------------------


def _name_problem(name: str) -> str | None:
    """Why `name` (a member path) is unsafe, or None. Shared by packing and extraction."""
    if not name:
        return "an empty name"
    if "\x00" in name:
        return "a NUL byte in its name"
    if "\\" in name:
        return "a backslash in its name (a path separator on Windows)"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "a control character in its name"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "a name that is not valid UTF-8"
    if name.startswith("/") or _DRIVE.match(name):
        return "an absolute path"
    components = name.split("/")
    if ".." in components:
        return "a '..' component in its path"
    if len(encoded) > _MAX_NAME_BYTES or any(len(c.encode("utf-8")) > _MAX_COMPONENT_BYTES for c in components):
        return f"a name longer than {_MAX_NAME_BYTES} bytes or a component longer than {_MAX_COMPONENT_BYTES}"
    return None


# --- packing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    relpath: str
    path: Path
    is_dir: bool


def _collect(root: Path) -> list[_Entry]:
    entries: list[_Entry] = []

    def walk(directory: Path, prefix: str) -> None:
        with os.scandir(directory) as listing:
            children = list(listing)
        for child in children:
            path = Path(child.path)
            relpath = f"{prefix}{child.name}"
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode):
                if child.name == "__pycache__":
                    continue
            elif stat.S_ISREG(mode):
                if child.name.endswith(".pyc"):
                    continue
            else:
                kind = ("a symlink" if stat.S_ISLNK(mode) else "a fifo" if stat.S_ISFIFO(mode)
                        else "a socket" if stat.S_ISSOCK(mode) else "a device file" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                        else "not a regular file or directory")
                raise ValueError(f"{path}: {kind}; a recipe directory may hold only regular files and directories")
            problem = _name_problem(relpath)
            if problem is not None:
                raise ValueError(f"{path}: cannot be packed: {problem}")
            entries.append(_Entry(relpath, path, stat.S_ISDIR(mode)))
            if stat.S_ISDIR(mode):
                walk(path, relpath + "/")

    walk(root, "")
    entries.sort(key=lambda e: e.relpath)
    return entries


def _tarinfo(name: str, *, is_dir: bool, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.mode = mode
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.linkname = ""
    info.devmajor = info.devminor = 0
    return info


def _add(tar: tarfile.TarFile, entry: _Entry, info: tarfile.TarInfo, source: BinaryIO | None) -> None:
    try:
        tar.addfile(info, source)
    except ValueError as exc:  # USTAR: "name is too long" / "linkname is too long"
        raise ValueError(f"{entry.path}: cannot be packed as {entry.relpath!r}: {exc} "
                         "(a USTAR path has at most 100 bytes, or 255 split at a '/')") from exc


def pack_recipe(directory: Path) -> bytes:
    """The deterministic ``.tar.gz`` of a recipe directory (see the module docstring).

    Raises ValueError naming the path for a directory without ``workflow.yaml`` at its root, a
    symlink, device file, fifo or socket inside it, or a name the archive cannot carry.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory")
    try:
        workflow_mode = os.lstat(root / WORKFLOW_FILE).st_mode
    except FileNotFoundError:
        raise ValueError(f"{root}: no {WORKFLOW_FILE} at the root; a recipe directory needs one") from None
    if not stat.S_ISREG(workflow_mode):
        raise ValueError(f"{root / WORKFLOW_FILE}: not a regular file; a recipe needs a real {WORKFLOW_FILE}")

    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=GZIP_LEVEL, mtime=0, filename="") as gz:
        with tarfile.TarFile(fileobj=gz, mode="w", format=TAR_FORMAT, encoding="utf-8", errors="strict") as tar:
            for entry in _collect(root):
                if entry.is_dir:
                    _add(tar, entry, _tarinfo(entry.relpath, is_dir=True, mode=0o755, size=0), None)
                    continue
                # O_NONBLOCK: a fifo swapped in since the walk must not hang the open; fstat decides
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                with os.fdopen(fd, "rb") as source:
                    st = os.fstat(source.fileno())
                    if not stat.S_ISREG(st.st_mode):
                        raise ValueError(f"{entry.path}: not a regular file; a recipe directory may hold only "
                                         "regular files and directories")
                    mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
                    _add(tar, entry, _tarinfo(entry.relpath, is_dir=False, mode=mode, size=st.st_size), source)
    return buffer.getvalue()


def pack_recipe_to(directory: Path, out: Path) -> str:
    """Write `pack_recipe(directory)` to `out` (atomically: a temporary file, then a rename) and
    return ``"sha256:<hex>"`` of the archive bytes."""
    data = pack_recipe(directory)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return "sha256:" + hashlib.sha256(data).hexdigest()


def archive_digest(path: Path) -> str:
    """``"sha256:<hex>"`` of a file's bytes, read in 1 MiB chunks."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return "sha256:" + sha.hexdigest()


# --- extraction ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExtractLimits:
    """What one recipe archive may unpack to (the reconciler's max_recipe_* settings)."""

    max_total_bytes: int = 256 * 2**20
    max_files: int = 10_000
    max_file_bytes: int = 64 * 2**20

    def __post_init__(self) -> None:
        for field in ("max_total_bytes", "max_files", "max_file_bytes"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ExtractLimits.{field} must be a positive integer, got {value!r}")


def _invalid(archive: Path, problem: object) -> UnsafeArchive:
    return UnsafeArchive(f"{archive} is not a valid gzip tar: {problem}; {_FIX}")


def _refuse(archive: Path, member: str, problem: str, fix: str = _FIX) -> UnsafeArchive:
    return UnsafeArchive(f"{archive}: member {member!r}: {problem}; refusing to extract ({fix})")


class _CappedStream:
    """The decompressed tar stream: counts every byte, never hands out more than `limit` in all,
    and turns gzip errors into UnsafeArchive. `tarfile` reads it as a forward-only stream."""

    def __init__(self, gz: gzip.GzipFile, archive: Path) -> None:
        self._gz = gz
        self._archive = archive
        self.pos = 0
        self.limit = _STREAM_SLACK
        self.last_member: str | None = None
        self._tail = bytearray()
        self._tail_start = 0

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = self.limit - self.pos + 1
        if size == 0:
            return b""
        want = min(size, self.limit - self.pos + 1)  # one byte past the limit is enough to know
        try:
            data = self._gz.read(want)
        except (OSError, EOFError, zlib.error) as exc:
            raise _invalid(self._archive, f"{type(exc).__name__}: {exc}") from None
        self.pos += len(data)
        if self.pos > self.limit:
            where = f"after member {self.last_member!r}" if self.last_member else "before the first member"
            raise UnsafeArchive(
                f"{self._archive}: the decompressed tar stream grows past {self.limit} bytes {where}, far more "
                f"than the member contents it declares (headers, long-name/PAX records or padding blown up: "
                f"a decompression bomb); refusing to extract ({_FIX})")
        self._tail += data
        excess = len(self._tail) - _TAIL
        if excess > 0:
            del self._tail[:excess]
            self._tail_start += excess
        return data

    def read_since(self, offset: int) -> bytes | None:
        """Every byte read from stream offset `offset` on (tarfile's read-ahead included), if still kept."""
        if offset < self._tail_start:
            return None
        return bytes(self._tail[offset - self._tail_start:])


def _open_output(path: Path) -> BinaryIO:
    """A new file for writing: never an existing one, never through a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "wb")


def _prepare_dest(dest: Path) -> bool:
    """Create `dest` (True) or accept an existing empty directory (False)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(dest, 0o755)
        return True
    except FileExistsError:
        pass
    if dest.is_symlink() or not dest.is_dir():
        raise ValueError(f"{dest}: exists and is not a directory; extract into a new or empty directory")
    if any(dest.iterdir()):
        raise ValueError(f"{dest}: not empty; extract into a new or empty directory")
    return False


def _clean(dest: Path, created: bool) -> None:
    if created:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def extract_archive(archive: Path, dest: Path, limits: ExtractLimits = ExtractLimits(),
                    on_written: Callable[[int], None] | None = None) -> None:
    """Unpack a recipe archive into `dest` safely, or raise UnsafeArchive and leave nothing behind.

    See the module docstring for what is refused. `dest` must not exist or be an empty
    directory (ValueError otherwise). `on_written(n)` hears of every n bytes written to disk (also
    of those a refusal then removes): progress, and how far a refused archive got.
    """
    archive = Path(archive)
    dest = Path(dest)
    with open(archive, "rb") as raw:
        created = _prepare_dest(dest)
        try:
            _extract(raw, archive, dest, limits, on_written)
        except BaseException:
            _clean(dest, created)
            raise


class _Extraction:
    def __init__(self, archive: Path, dest: Path, limits: ExtractLimits, tar: tarfile.TarFile, stream: _CappedStream,
                 on_written: Callable[[int], None] | None):
        self.archive = archive
        self.on_written = on_written
        self.dest = dest
        self.limits = limits
        self.tar = tar
        self.stream = stream
        self.members = 0
        self.declared_total = 0
        self.written_total = 0
        self.kinds: dict[tuple[str, ...], str] = {}     # what exists on disk: "dir" or "file"
        self.listed: set[tuple[str, ...]] = set()       # what the archive named explicitly

    def member(self, member: tarfile.TarInfo) -> None:
        name = member.name
        self.members += 1
        self.stream.limit += _PER_MEMBER_OVERHEAD
        self.stream.last_member = name
        if self.members > self.limits.max_files:
            raise _refuse(self.archive, name, f"more than {self.limits.max_files} members (max_files)",
                          "a recipe that large is refused; raise max_recipe_files if it is legitimate")
        problem = _name_problem(name)
        if problem is not None:
            raise _refuse(self.archive, name, f"{problem}: it could write outside the destination")
        parts = tuple(p for p in name.split("/") if p not in ("", "."))

        if member.type == tarfile.DIRTYPE:
            is_dir = True
        elif member.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and member.sparse is None:
            is_dir = False
        else:
            kind = _TYPE_NAMES.get(member.type, f"of tar type {member.type!r}")
            if member.sparse is not None:
                kind = "a sparse file"
            if member.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                target = f" (to {member.linkname!r})" if member.linkname else ""
                raise _refuse(self.archive, name, f"is {kind}{target}; links are not allowed in a recipe archive")
            raise _refuse(self.archive, name, f"is {kind}; only regular files and directories are allowed")

        if is_dir and member.size != 0:
            raise _invalid(self.archive, f"directory member {name!r} declares {member.size} bytes of data")
        if not parts:
            if not is_dir:
                raise _refuse(self.archive, name, "a file named like the destination directory itself")
            return  # "./": the destination itself
        if parts in self.listed:
            raise _refuse(self.archive, name, "a duplicate name: a later member would replace an earlier one")
        self.listed.add(parts)

        for depth in range(1, len(parts)):
            self._directory(parts[:depth], name)
        if is_dir:
            self._directory(parts, name)
        else:
            if self.kinds.get(parts) == "dir":
                raise _refuse(self.archive, name, "a file where the archive already has a directory")
            self._file(member, parts)

    def _directory(self, parts: tuple[str, ...], name: str) -> None:
        kind = self.kinds.get(parts)
        if kind == "dir":
            return
        if kind == "file":
            raise _refuse(self.archive, name, f"needs {'/'.join(parts)!r} as a directory but it is a file in the archive")
        path = self.dest.joinpath(*parts)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            raise _refuse(self.archive, name, f"{'/'.join(parts)!r} collides with another member "
                          "(a case-insensitive filesystem?)") from None
        os.chmod(path, 0o755)
        self.kinds[parts] = "dir"

    def _file(self, member: tarfile.TarInfo, parts: tuple[str, ...]) -> None:
        name, size, limits = member.name, member.size, self.limits
        if size < 0:
            raise _invalid(self.archive, f"member {name!r} declares a negative size")
        if size > limits.max_file_bytes:
            raise _refuse(self.archive, name, f"declares {size} bytes, over max_file_bytes={limits.max_file_bytes}",
                          "raise max_recipe_file_bytes if the file is legitimate")
        if self.declared_total + size > limits.max_total_bytes:
            raise _refuse(self.archive, name, f"brings the unpacked size to {self.declared_total + size} bytes, "
                          f"over max_total_bytes={limits.max_total_bytes}",
                          "raise max_recipe_bytes if the recipe is legitimate")
        self.declared_total += size
        self.stream.limit += -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE

        path = self.dest.joinpath(*parts)
        source = self.tar.extractfile(member)
        if source is None:  # pragma: no cover - regular members always have a reader
            raise _invalid(self.archive, f"member {name!r} has no data")
        try:
            out = _open_output(path)
        except FileExistsError:
            raise _refuse(self.archive, name, "collides with another member (a case-insensitive filesystem?)") from None
        self.kinds[parts] = "file"
        with out:
            written = 0
            while True:
                # one byte beyond the declared size is enough to catch a reader that yields more
                chunk = source.read(min(CHUNK, size - written + 1))
                if not chunk:
                    break
                written += len(chunk)
                if written > size:
                    raise _refuse(self.archive, name, f"yields more data than the {size} bytes its header declares")
                if written > limits.max_file_bytes or self.written_total + written > limits.max_total_bytes:
                    raise _refuse(self.archive, name, "the bytes written exceed the extraction limits")
                out.write(chunk)
                if self.on_written is not None:
                    self.on_written(len(chunk))
            if written != size:
                raise _invalid(self.archive, f"member {name!r} is truncated: {written} of {size} bytes")
            os.fchmod(out.fileno(), 0o755 if member.mode & stat.S_IXUSR else 0o644)
        self.written_total += written


def _extract(raw: BinaryIO, archive: Path, dest: Path, limits: ExtractLimits,
             on_written: Callable[[int], None] | None) -> None:
    stream = _CappedStream(gzip.GzipFile(fileobj=raw, mode="rb"), archive)
    try:
        tar = tarfile.open(fileobj=stream, mode="r|", encoding="utf-8", errors="surrogateescape")  # type: ignore[call-overload]
        with tar:
            job = _Extraction(archive, dest, limits, tar, stream, on_written)
            while (member := tar.next()) is not None:
                job.member(member)
            # tarfile stops quietly at a damaged or missing header after the first member: insist
            # on a real end-of-archive block where it stopped, and only zeros after it, both in
            # what tarfile already read ahead (up to a 10 KiB record) and in the rest of the stream
            read_ahead = stream.read_since(tar.offset)
            if read_ahead is None or len(read_ahead) < tarfile.BLOCKSIZE:
                raise _invalid(archive, f"it ends without an end-of-archive marker after member {stream.last_member!r} "
                                        "(truncated?)")
            if read_ahead[:tarfile.BLOCKSIZE].strip(b"\0"):
                raise _invalid(archive, f"damaged header after member {stream.last_member!r}")
            if read_ahead.strip(b"\0"):
                raise _invalid(archive, "non-zero data after the end-of-archive marker")
            # read to the end: the gzip CRC and length are only checked there
            while chunk := stream.read(CHUNK):
                if chunk.strip(b"\0"):
                    raise _invalid(archive, "non-zero data after the end-of-archive marker")
    except (tarfile.TarError, ValueError, OverflowError) as exc:
        raise _invalid(archive, exc) from None
