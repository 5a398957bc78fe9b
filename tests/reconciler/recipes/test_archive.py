"""Recipe archives: deterministic packing, and extraction that refuses what could hurt."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import shutil
import socket
import stat
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from plnt.core.recipe import directory_digest
from plnt.reconciler.errors import NeedsHuman, UnsafeArchive
from plnt.reconciler.recipes.archive import ExtractLimits, archive_digest, extract_archive, pack_recipe, pack_recipe_to

from tests.conftest import EXAMPLE

RECIPE = EXAMPLE / "recipes" / "review-responder" / "1.2.0"
MB = 10**6
MiB = 2**20


# --- helpers ---------------------------------------------------------------------------------


def member(name: str, data: bytes = b"", *, type: bytes = tarfile.REGTYPE, mode: int = 0o644, size: int | None = None,
           linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = type
    info.mode = mode
    info.size = len(data) if size is None else size
    info.linkname = linkname
    return info, data


def tar_bytes(*members: tuple[tarfile.TarInfo, bytes], format: int = tarfile.PAX_FORMAT, encoding: str = "utf-8") -> bytes:
    """An uncompressed tar written by `tarfile`, members exactly as given (nothing sanitised)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=format, encoding=encoding) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE) else None)
    return buffer.getvalue()


def write_tgz(path: Path, raw_tar: bytes) -> Path:
    path.write_bytes(gzip.compress(raw_tar, compresslevel=1, mtime=0))
    return path


def make_tgz(path: Path, *members: tuple[tarfile.TarInfo, bytes], **kwargs: int | str) -> Path:
    return write_tgz(path, tar_bytes(*members, **kwargs))  # type: ignore[arg-type]


def header(name: str, size: int, type: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.type = type
    return info.tobuf(tarfile.USTAR_FORMAT)


def tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def all_names(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


class Written:
    """Counts the bytes extraction writes to disk (its `on_written` hook), also those a refusal removes."""

    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self, n: int) -> None:
        self.bytes += n


@pytest.fixture
def written() -> Written:
    return Written()


@pytest.fixture
def decompressed(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the decompressed bytes extraction reads (gzip.GzipFile.read wrapped, then called):
    how far into a bomb it got, as a count rather than a time."""
    counter = {"bytes": 0}
    real_read = gzip.GzipFile.read

    def counting_read(self, size=-1):  # type: ignore[no-untyped-def]
        data = real_read(self, size)
        counter["bytes"] += len(data)
        return data

    monkeypatch.setattr(gzip.GzipFile, "read", counting_read)
    return counter


@pytest.fixture(scope="module")
def zeros_100mb_gz(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """100 MB of zeros as one gzip member (~100 KB); concatenated with other gzip members it
    continues whatever tar stream they started (gzip readers join members)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: gzip framing
    chunk = bytes(MB)
    parts = [compressor.compress(chunk) for _ in range(100)]
    parts.append(compressor.flush())
    data = b"".join(parts)
    assert len(data) < 200_000
    return data


@pytest.fixture
def recipe_copy(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "src" / "review-responder"
    shutil.copytree(RECIPE, path)
    yield path


# --- packing ---------------------------------------------------------------------------------


def _copy_in_order(src: Path, dest: Path, *, reverse: bool, mtime: int, file_mode: int, dir_mode: int) -> None:
    """Copy a recipe creating entries in a chosen order, with chosen times and permissions."""
    dest.mkdir(parents=True)
    paths = sorted(src.rglob("*"), key=lambda p: p.relative_to(src).as_posix(), reverse=reverse)
    for path in sorted(paths, key=lambda p: p.is_file()):  # directories first, then files
        target = dest / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    for path in dest.rglob("*"):
        os.chmod(path, dir_mode if path.is_dir() else file_mode)
        os.utime(path, (mtime, mtime))
    os.chmod(dest, dir_mode)


def test_pack_is_deterministic_whatever_the_times_permissions_and_creation_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "recipe", tmp_path / "b" / "recipe"
    old_umask = os.umask(0o077)
    try:
        _copy_in_order(RECIPE, a, reverse=False, mtime=1_000_000_000, file_mode=0o600, dir_mode=0o700)
    finally:
        os.umask(old_umask)
    _copy_in_order(RECIPE, b, reverse=True, mtime=1_700_000_000, file_mode=0o664, dir_mode=0o775)
    (b / "__pycache__").mkdir()
    (b / "__pycache__" / "steps.cpython-311.pyc").write_bytes(b"\x00bytecode")
    (b / "stale.pyc").write_bytes(b"\x00bytecode")

    packed_a, packed_b = pack_recipe(a), pack_recipe(b)
    assert packed_a == packed_b
    assert pack_recipe(a) == packed_a  # and again
    digest = pack_recipe_to(b, tmp_path / "b.tar.gz")
    assert digest == "sha256:" + hashlib.sha256(packed_a).hexdigest()
    assert archive_digest(tmp_path / "b.tar.gz") == digest
    assert (tmp_path / "b.tar.gz").read_bytes() == packed_a
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".b.tar.gz")]  # no temporary left behind

    # one byte of content changes the digest
    steps = b / "steps.py"
    steps.write_bytes(steps.read_bytes().replace(b"def ", b"def  ", 1))
    assert pack_recipe_to(b, tmp_path / "b2.tar.gz") != digest


def test_pack_format_fixed_headers_and_gzip(recipe_copy: Path) -> None:
    os.chmod(recipe_copy / "steps.py", 0o744)  # executable by its owner -> 0o755
    os.chmod(recipe_copy / "golden.yaml", 0o4777)  # setuid and world-writable -> 0o755, nothing else
    data = pack_recipe(recipe_copy)

    assert data[:3] == b"\x1f\x8b\x08"
    assert data[3] == 0, "no FNAME/FEXTRA/FCOMMENT flag: no file name in the gzip header"
    assert data[4:8] == b"\0\0\0\0", "gzip mtime 0"
    assert data[8] == 2 and data[9] == 255, "level 9, fixed OS byte"

    raw = gzip.decompress(data)
    assert raw[257:263] == b"ustar\0", "USTAR, never PAX/GNU"
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == ["golden.yaml", "knowledge", "knowledge/brand_voice.md", "steps.py", "workflow.yaml"]
    assert names == sorted(names)
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.linkname, m.pax_headers) == (0, 0, 0, "", "", "", {})
        assert m.type in (tarfile.REGTYPE, tarfile.DIRTYPE)
    modes = {m.name: m.mode for m in members}
    assert modes == {"golden.yaml": 0o755, "knowledge": 0o755, "knowledge/brand_voice.md": 0o644,
                     "steps.py": 0o755, "workflow.yaml": 0o644}
    # only USTAR headers: no typeflag 'x'/'g'/'L' block anywhere
    assert all(raw[off + 156:off + 157] in (b"0", b"5") for off in _header_offsets(raw))


def _header_offsets(raw: bytes) -> list[int]:
    offsets, off = [], 0
    while raw[off:off + 512].strip(b"\0"):
        offsets.append(off)
        size = int(raw[off + 124:off + 136].rstrip(b"\0 ") or b"0", 8)
        off += 512 + -(-size // 512) * 512
    return offsets


def test_round_trip_keeps_the_directory_digest(recipe_copy: Path, tmp_path: Path) -> None:
    (recipe_copy / "knowledge" / "empty").mkdir()
    (recipe_copy / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(recipe_copy / "run.sh", 0o700)
    (recipe_copy / "caf\u00e9.md").write_text("unicode names are fine\n")
    digest = pack_recipe_to(recipe_copy, tmp_path / "r.tar.gz")

    dest = tmp_path / "out" / "recipe"
    extract_archive(tmp_path / "r.tar.gz", dest)
    assert directory_digest(dest) == directory_digest(recipe_copy)
    assert (dest / "knowledge" / "empty").is_dir()
    assert stat.S_IMODE((dest / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "steps.py").stat().st_mode) == 0o644
    assert stat.S_IMODE((dest / "knowledge").stat().st_mode) == 0o755
    # repacking the extraction gives the same archive
    assert pack_recipe_to(dest, tmp_path / "again.tar.gz") == digest


def test_pack_refuses_links_and_special_files(recipe_copy: Path, tmp_path: Path) -> None:
    link = recipe_copy / "knowledge" / "link.md"
    link.symlink_to("brand_voice.md")
    with pytest.raises(ValueError, match=rf"{link}: a symlink"):
        pack_recipe(recipe_copy)
    link.unlink()

    (recipe_copy / "dirlink").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="dirlink: a symlink"):
        pack_recipe(recipe_copy)
    (recipe_copy / "dirlink").unlink()

    fifo = recipe_copy / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=rf"{fifo}: a fifo"):
        pack_recipe(recipe_copy)
    fifo.unlink()

    sock_dir = Path("/tmp") / f"plnt-sock-{os.getpid()}"  # AF_UNIX paths are short
    shutil.copytree(recipe_copy, sock_dir)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(sock_dir / "s"))
            with pytest.raises(ValueError, match="s: a socket"):
                pack_recipe(sock_dir)
    finally:
        shutil.rmtree(sock_dir)

    try:
        os.mknod(recipe_copy / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        return  # not root: no device file to test with
    with pytest.raises(ValueError, match="null: a device file"):
        pack_recipe(recipe_copy)


def test_pack_refuses_a_directory_without_workflow_yaml(recipe_copy: Path, tmp_path: Path) -> None:
    (recipe_copy / "workflow.yaml").unlink()
    with pytest.raises(ValueError, match=rf"{recipe_copy}: no workflow.yaml"):
        pack_recipe(recipe_copy)
    (recipe_copy / "workflow.yaml").symlink_to(RECIPE / "workflow.yaml")
    with pytest.raises(ValueError, match="workflow.yaml: not a regular file"):
        pack_recipe(recipe_copy)
    with pytest.raises(ValueError, match="not a directory"):
        pack_recipe(tmp_path / "missing")


def test_pack_refuses_names_extraction_would_refuse(recipe_copy: Path) -> None:
    odd = recipe_copy / "a\\b.md"
    odd.write_text("x")
    with pytest.raises(ValueError, match="backslash"):
        pack_recipe(recipe_copy)
    odd.unlink()
    deep = recipe_copy / ("d" * 120) / ("e" * 120) / ("f" * 30)
    deep.parent.mkdir(parents=True)
    deep.write_text("x")
    with pytest.raises(ValueError, match="too long"):
        pack_recipe(recipe_copy)


# --- extraction: paths and member types ------------------------------------------------------


@pytest.mark.parametrize("name", [
    "../evil",
    "a/../../evil",
    "ok/../../../evil",
    "/etc/passwd",
    "/evil",
    "..",
    "..\\evil",
    "C:/evil",
    "a\nb",
])
def test_paths_that_could_escape_are_refused(tmp_path: Path, name: str) -> None:
    tgz = make_tgz(tmp_path / "evil.tar.gz", member("workflow.yaml", b"kind: Workflow\n"), member(name, b"pwned\n"))
    dest = tmp_path / "deep" / "down" / "dest"
    with pytest.raises(UnsafeArchive, match=r"member .*refusing to extract"):
        extract_archive(tgz, dest)
    assert not dest.exists()
    assert not [p for p in tmp_path.rglob("*") if "evil" in p.name and p != tgz or p.name == "passwd"]
    assert set(all_names(tmp_path)) == {"evil.tar.gz", "deep", "deep/down"}


def test_refusal_names_the_member_and_what_to_do(tmp_path: Path) -> None:
    tgz = make_tgz(tmp_path / "evil.tar.gz", member("a/../../evil", b"x"))
    with pytest.raises(UnsafeArchive) as info:
        extract_archive(tgz, tmp_path / "dest")
    message = str(info.value)
    assert "'a/../../evil'" in message and "'..' component" in message and "re-pack" in message
    assert isinstance(info.value, NeedsHuman) and not info.value.retryable


def test_nul_and_non_utf8_names_are_refused(tmp_path: Path) -> None:
    info, data = member("a\x00b", b"x")  # a NUL can only arrive through a PAX path record
    info.pax_headers = {"path": "a\x00b"}
    tgz = make_tgz(tmp_path / "nul.tar.gz", (info, data))
    with tarfile.open(tgz) as tar:
        assert tar.getnames() == ["a\x00b"]  # tarfile hands the NUL through
    with pytest.raises(UnsafeArchive, match="member 'a\\\\x00b': a NUL byte in its name"):
        extract_archive(tgz, tmp_path / "d1")
    assert not (tmp_path / "d1").exists()

    tgz = make_tgz(tmp_path / "latin.tar.gz", member("caf\xe9", b"x"), format=tarfile.USTAR_FORMAT, encoding="latin-1")
    with pytest.raises(UnsafeArchive, match="not valid UTF-8"):
        extract_archive(tgz, tmp_path / "d2")
    assert not (tmp_path / "d2").exists()


@pytest.mark.parametrize(("link", "match"), [
    (member("escape", type=tarfile.SYMTYPE, linkname="../../../../etc"), "symbolic link .*'../../../../etc'"),
    (member("abs", type=tarfile.SYMTYPE, linkname="/etc/passwd"), "symbolic link"),
    (member("inside", type=tarfile.SYMTYPE, linkname="workflow.yaml"), "symbolic link"),
    (member("hard", type=tarfile.LNKTYPE, linkname="workflow.yaml"), "hard link"),
    (member("hard-out", type=tarfile.LNKTYPE, linkname="../../outside"), "hard link"),
])
def test_links_are_refused(tmp_path: Path, link: tuple[tarfile.TarInfo, bytes], match: str) -> None:
    tgz = make_tgz(tmp_path / "link.tar.gz", member("workflow.yaml", b"kind: Workflow\n"), link,
                   member(f"{link[0].name}/evil", b"through the link\n"))
    dest = tmp_path / "dest"
    with pytest.raises(UnsafeArchive, match=rf"member '{link[0].name}': is a {match}.*links are not allowed"):
        extract_archive(tgz, dest)
    assert not dest.exists()
    assert all_names(tmp_path) == {"link.tar.gz"}


@pytest.mark.parametrize(("kind", "label"), [
    (tarfile.CHRTYPE, "character device"),
    (tarfile.BLKTYPE, "block device"),
    (tarfile.FIFOTYPE, "fifo"),
    (tarfile.CONTTYPE, "contiguous file"),
])
def test_devices_fifos_and_other_types_are_refused(tmp_path: Path, kind: bytes, label: str) -> None:
    info, _ = member("dev", type=kind, mode=0o666)
    info.devmajor, info.devminor = 1, 3
    tgz = make_tgz(tmp_path / "dev.tar.gz", member("workflow.yaml", b"kind: Workflow\n"), (info, b""))
    with pytest.raises(UnsafeArchive, match=rf"member 'dev': is a {label}; only regular files and directories"):
        extract_archive(tgz, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_sparse_files_are_refused(tmp_path: Path) -> None:
    info, data = member("sparse", b"x" * 512)
    info.pax_headers = {"GNU.sparse.map": "0,512", "GNU.sparse.size": str(50 * MB)}
    tgz = make_tgz(tmp_path / "sparse.tar.gz", (info, data))
    with pytest.raises(UnsafeArchive, match="member 'sparse': is a sparse file"):
        extract_archive(tgz, tmp_path / "dest")


@pytest.mark.parametrize("members", [
    [member("a.txt", b"one"), member("a.txt", b"two")],
    [member("a.txt", b"one"), member("./a.txt", b"two")],
    [member("d/a.txt", b"one"), member("d//a.txt", b"two")],
    [member("d", type=tarfile.DIRTYPE, mode=0o755), member("d", type=tarfile.DIRTYPE, mode=0o755)],
    [member("d", b"a file"), member("d/a.txt", b"under a file")],
    [member("d/a.txt", b"one"), member("d", b"a file over a directory")],
])
def test_duplicates_and_file_directory_clashes_are_refused(tmp_path: Path, members: list) -> None:
    tgz = make_tgz(tmp_path / "dup.tar.gz", *members)
    with pytest.raises(UnsafeArchive, match="duplicate name|is a file in the archive|already has a directory"):
        extract_archive(tgz, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_modes_are_normalised(tmp_path: Path) -> None:
    tgz = make_tgz(tmp_path / "modes.tar.gz",
                   member("bin", type=tarfile.DIRTYPE, mode=0o7777),
                   member("bin/tool", b"#!/bin/sh\n", mode=0o6755),
                   member("world", b"x", mode=0o666),
                   member("sticky", b"x", mode=0o1600),
                   member("./", type=tarfile.DIRTYPE, mode=0o777))
    dest = tmp_path / "dest"
    extract_archive(tgz, dest)
    modes = {p.relative_to(dest).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in dest.rglob("*")}
    assert modes == {"bin": 0o755, "bin/tool": 0o755, "world": 0o644, "sticky": 0o644}


# --- extraction: limits and bombs ------------------------------------------------------------


def test_too_many_members(tmp_path: Path) -> None:
    tgz = make_tgz(tmp_path / "many.tar.gz", *[member(f"f{i}", b"x") for i in range(4)])
    with pytest.raises(UnsafeArchive, match=r"member 'f3': more than 3 members \(max_files\)"):
        extract_archive(tgz, tmp_path / "dest", ExtractLimits(max_files=3))
    assert not (tmp_path / "dest").exists()
    extract_archive(tgz, tmp_path / "ok", ExtractLimits(max_files=4))


def test_member_over_max_file_bytes_by_header(tmp_path: Path, written: Written) -> None:
    """`written` counts the bytes the extraction writes."""
    tgz = make_tgz(tmp_path / "big.tar.gz", member("small", b"x" * 100), member("big", bytes(2 * MiB)))
    with pytest.raises(UnsafeArchive, match=r"member 'big': declares 2097152 bytes, over max_file_bytes=1048576"):
        extract_archive(tgz, tmp_path / "dest", ExtractLimits(max_file_bytes=MiB), on_written=written)
    assert written.bytes == 100  # "small" only; "big" refused before a byte of it was written
    assert not (tmp_path / "dest").exists()


def test_gzip_bomb_is_refused_fast_without_filling_the_disk(tmp_path: Path, zeros_100mb_gz: bytes,
                                                            written: Written, decompressed: dict[str, int]) -> None:
    """`written` counts the bytes the extraction writes; `decompressed` wraps gzip reads to count bytes."""
    # a single member of 100 MB of zeros: ~100 KB on the wire
    tgz = tmp_path / "bomb.tar.gz"
    tgz.write_bytes(gzip.compress(header("workflow.yaml", 100 * MB), mtime=0) + zeros_100mb_gz
                    + gzip.compress(bytes(1024), mtime=0))
    assert tgz.stat().st_size < 200_000
    limits = ExtractLimits(max_total_bytes=10 * MB)
    dest = tmp_path / "dest"
    # refused on its header (over max_file_bytes, and over max_total_bytes): not one byte written
    with pytest.raises(UnsafeArchive, match=r"member 'workflow.yaml': .*100000000 bytes, over max_(file|total)_bytes"):
        extract_archive(tgz, dest, limits, on_written=written)
    assert decompressed["bytes"] < MiB  # "fast": it read the header, not the 100 MB behind it
    assert written.bytes <= limits.max_total_bytes
    assert tree_size(dest) == 0 and not dest.exists()


def test_many_honest_members_stop_at_the_total_limit(tmp_path: Path, written: Written) -> None:
    """`written` counts the bytes the extraction writes."""
    tgz = make_tgz(tmp_path / "four.tar.gz", *[member(f"part{i}", bytes(4 * MB)) for i in range(4)])
    limits = ExtractLimits(max_total_bytes=10 * MB)
    with pytest.raises(UnsafeArchive, match=r"member 'part2': brings the unpacked size to 12000000 bytes"):
        extract_archive(tgz, tmp_path / "dest", limits, on_written=written)
    assert written.bytes == 8 * MB <= limits.max_total_bytes
    assert not (tmp_path / "dest").exists()


def test_bomb_in_a_pax_header_is_stopped_by_the_stream_cap(tmp_path: Path, zeros_100mb_gz: bytes,
                                                           written: Written, decompressed: dict[str, int]) -> None:
    """`written` counts the bytes the extraction writes; `decompressed` wraps gzip reads to count bytes."""
    # a 100 MB extended header: tarfile would read it all into memory before showing any member
    tgz = tmp_path / "paxbomb.tar.gz"
    tgz.write_bytes(gzip.compress(header("PaxHeaders/x", 100 * MB, tarfile.XHDTYPE), mtime=0) + zeros_100mb_gz
                    + gzip.compress(header("workflow.yaml", 3) + b"abc".ljust(512, b"\0") + bytes(1024), mtime=0))
    with pytest.raises(UnsafeArchive, match="decompressed tar stream grows past .* before the first member.*bomb"):
        extract_archive(tgz, tmp_path / "dest", ExtractLimits(max_total_bytes=10 * MB), on_written=written)
    assert decompressed["bytes"] < 2 * MiB  # stopped near the 1 MiB slack, not after the 100 MB
    assert written.bytes == 0
    assert not (tmp_path / "dest").exists()


def test_zeros_after_the_end_marker_are_capped_too(tmp_path: Path, zeros_100mb_gz: bytes,
                                                   decompressed: dict[str, int]) -> None:
    """`decompressed` wraps gzip reads to count the bytes extraction took in."""
    tgz = tmp_path / "padbomb.tar.gz"
    tgz.write_bytes(gzip.compress(tar_bytes(member("workflow.yaml", b"kind: Workflow\n")), mtime=0) + zeros_100mb_gz)
    with pytest.raises(UnsafeArchive, match="grows past"):
        extract_archive(tgz, tmp_path / "dest")
    assert decompressed["bytes"] < 2 * MiB  # stopped near the 1 MiB slack, not after the 100 MB
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("gap", [0, 4096, 9 * 1024, 64 * 1024])
def test_a_member_hidden_after_the_end_marker_is_refused(tmp_path: Path, gap: int) -> None:
    """A second tar after the end-of-archive blocks (what `tar --ignore-zeros` would unpack) is
    refused, also when it sits in the record tarfile has already read ahead (gap < 10 KiB)."""
    first = tar_bytes(member("workflow.yaml", b"kind: Workflow\n"), format=tarfile.USTAR_FORMAT)
    raw = first[:2048] + bytes(gap) + tar_bytes(member("../escaped", b"pwned\n"), format=tarfile.USTAR_FORMAT)
    tgz = write_tgz(tmp_path / "hidden.tar.gz", raw)
    with pytest.raises(UnsafeArchive, match="non-zero data after the end-of-archive marker"):
        extract_archive(tgz, tmp_path / "sub" / "dest")
    assert not (tmp_path / "sub" / "dest").exists() and not (tmp_path / "sub" / "escaped").exists()


def test_a_reader_yielding_more_than_the_header_is_stopped_before_writing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: Written) -> None:
    """A stand-in `TarFile.extractfile` (monkeypatched) hands out 50 MB for a 10-byte member, a
    reader no real tarfile gives; `written` counts the bytes written."""
    tgz = make_tgz(tmp_path / "liar.tar.gz", member("workflow.yaml", b"0123456789"))
    monkeypatch.setattr(tarfile.TarFile, "extractfile", lambda self, m: io.BytesIO(bytes(50 * MB)))
    with pytest.raises(UnsafeArchive, match="member 'workflow.yaml': yields more data than the 10 bytes"):
        extract_archive(tgz, tmp_path / "dest", on_written=written)
    assert written.bytes == 0
    assert not (tmp_path / "dest").exists()


# --- extraction: invalid archives ------------------------------------------------------------


def test_header_promising_more_data_than_there_is(tmp_path: Path) -> None:
    raw = header("workflow.yaml", 1000) + b"only a hundred bytes".ljust(100, b".")
    tgz = write_tgz(tmp_path / "short.tar.gz", raw)  # a complete gzip stream around a truncated member
    with pytest.raises(UnsafeArchive, match="is not a valid gzip tar: .*(unexpected end of data|truncated)"):
        extract_archive(tgz, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_header_claiming_less_data_than_follows(tmp_path: Path) -> None:
    data = b"#" * 2000  # 1.5 KB of it would be read as the next "header"
    raw = header("workflow.yaml", 10) + data.ljust(2048, b"\0") + bytes(1024)
    tgz = write_tgz(tmp_path / "long.tar.gz", raw)
    with pytest.raises(UnsafeArchive, match="is not a valid gzip tar: damaged header after member 'workflow.yaml'"):
        extract_archive(tgz, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_missing_end_of_archive_marker(tmp_path: Path) -> None:
    raw = tar_bytes(member("workflow.yaml", b"kind: Workflow\n"))
    tgz = write_tgz(tmp_path / "noend.tar.gz", raw[:1024])  # header + data block, no zero blocks
    with pytest.raises(UnsafeArchive, match="without an end-of-archive marker"):
        extract_archive(tgz, tmp_path / "dest")


@pytest.mark.parametrize("damage", ["truncated", "flipped", "crc", "not-gzip", "plain-tar", "empty"])
def test_corrupt_gzip_is_refused(tmp_path: Path, damage: str) -> None:
    good = pack_recipe(RECIPE)
    bad = {
        "truncated": good[: len(good) // 2],
        "flipped": good[:200] + bytes([good[200] ^ 0xFF]) + good[201:],
        "crc": good[:-8] + bytes(b ^ 0xFF for b in good[-8:-4]) + good[-4:],
        "not-gzip": b"this is not an archive at all" * 10,
        "plain-tar": gzip.decompress(good),
        "empty": gzip.compress(b"", mtime=0),
    }[damage]
    tgz = tmp_path / "bad.tar.gz"
    tgz.write_bytes(bad)
    dest = tmp_path / "dest"
    with pytest.raises(UnsafeArchive, match=r"bad.tar.gz is not a valid gzip tar: "):
        extract_archive(tgz, dest)
    assert not dest.exists()


# --- extraction: destination -----------------------------------------------------------------


def test_dest_must_be_new_or_empty(tmp_path: Path) -> None:
    tgz = tmp_path / "r.tar.gz"
    pack_recipe_to(RECIPE, tgz)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        extract_archive(tgz, dest)
    assert all_names(dest) == {"keep.txt"} and (dest / "keep.txt").read_text() == "mine"

    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        extract_archive(tgz, tmp_path / "file")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    with pytest.raises(ValueError, match="not a directory"):
        extract_archive(tgz, tmp_path / "link")
    assert not any((tmp_path / "empty").iterdir())

    extract_archive(tgz, tmp_path / "empty")  # an existing empty directory is fine
    assert directory_digest(tmp_path / "empty") == directory_digest(RECIPE)


def test_failure_cleans_what_was_written(tmp_path: Path) -> None:
    tgz = make_tgz(tmp_path / "late.tar.gz",
                   member("workflow.yaml", b"kind: Workflow\n"),
                   member("knowledge", type=tarfile.DIRTYPE, mode=0o755),
                   member("knowledge/a.md", b"a" * 5000),
                   member("knowledge/deep/b.md", b"b"),
                   member("knowledge/deep/evil", type=tarfile.SYMTYPE, linkname="/etc/passwd"))
    created = tmp_path / "new"
    with pytest.raises(UnsafeArchive, match="'knowledge/deep/evil'"):
        extract_archive(tgz, created)
    assert not created.exists()  # created by the extraction: removed entirely

    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(UnsafeArchive):
        extract_archive(tgz, existing)
    assert existing.is_dir() and not any(existing.iterdir())  # given empty: left empty


def test_limits_are_validated() -> None:
    assert ExtractLimits() == ExtractLimits(max_total_bytes=256 * MiB, max_files=10_000, max_file_bytes=64 * MiB)
    with pytest.raises(ValueError, match="max_files"):
        ExtractLimits(max_files=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ExtractLimits().max_files = 5  # type: ignore[misc]
