"""The zygote's protocol pieces (plnt.runner.zygote), pure: request checks, message decoding, exit
codes, the environment pipe. No zygote runs here (tests/reconciler/drivers/test_zygote_runners.py forks real ones)."""

from __future__ import annotations

import json
import os
import signal

import pytest
from plnt.core.zygote_protocol import decode, encode
from plnt.runner.zygote import check_request, exit_code, read_env


def test_encode_decode_round_trip() -> None:
    message = {"id": 3, "argv": ["--recipe", "/r"], "dir": "/d", "log": "/l"}
    assert decode(encode(message)) == message


@pytest.mark.parametrize("data", [b"[1]", b"\"x\"", b"3"])
def test_decode_wants_an_object(data: bytes) -> None:
    with pytest.raises(ValueError, match="JSON object"):
        decode(data)


GOOD = {"id": 1, "argv": ["--port", "1"], "dir": "/state/runners/r", "log": "/state/runners/r.log"}


@pytest.mark.parametrize(("change", "message"), [
    ({"id": None}, "integer id"),
    ({"id": True}, "integer id"),
    ({"argv": "--port 1"}, "argv must be a list of strings"),
    ({"argv": ["--port", 1]}, "argv must be a list of strings"),
    ({"dir": "relative/dir"}, "dir must be an absolute path"),
    ({"log": None}, "log must be an absolute path"),
])
def test_check_request_names_what_is_wrong(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_request({**GOOD, **change})


def test_check_request_accepts_a_good_one() -> None:
    assert check_request(GOOD) == (1, ["--port", "1"], "/state/runners/r", "/state/runners/r.log")


def test_exit_code_is_popens() -> None:
    assert exit_code(2 << 8) == 2  # exited 2: recipe did not load
    assert exit_code(3 << 8) == 3  # exited 3: limits or isolation could not be set
    assert exit_code(signal.SIGKILL) == -signal.SIGKILL


def _pipe_with(data: bytes) -> int:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, data)
    os.close(write_fd)
    return read_fd


def test_read_env_reads_and_closes_the_pipe() -> None:
    fd = _pipe_with(json.dumps({"HOME": "/r", "MY_KEY": "k"}).encode())
    assert read_env(fd) == {"HOME": "/r", "MY_KEY": "k"}
    with pytest.raises(OSError):
        os.fstat(fd)


@pytest.mark.parametrize("payload", [b"[]", b'{"A": 1}', b"{not json"])
def test_read_env_refuses_anything_but_an_object_of_strings(payload: bytes) -> None:
    with pytest.raises(ValueError):
        read_env(_pipe_with(payload))
