"""Notifications as users run them: `plnt up` in its own process (embedded Temporal, local runner
processes; the runners' model is MockBackend, a STAND-IN for a model server; recipes signed by the
example's test authority, a STAND-IN for Sigstore's public services) with two real HTTP receivers: a
generic webhook that checks plnt's HMAC signature, and a Slack-compatible incoming webhook (a
STAND-IN for Slack: it takes {"text"} as Slack does). A stepped rollout held for a person, then
promoted; a second aborted; a third rolled back by its smoke test: each transition, in order, at both."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from plnt.reconciler.gates.webhook import verify

from tests.conftest import SpecRepo
from tests.e2e.test_canary_steps import RUN_FILE, wait_row
from tests.e2e.test_plnt_up_process import PLNT, PlntUp, gateway_port
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)
from tests.http_thread import ThreadedHttp

pytestmark = pytest.mark.integration

SECRET = "notify-secret-never-logged"
HELD = "    steps:\n      - {weight: 20, pause: manual}\n      - {weight: 60}\n"


class Seen(BaseHTTPRequestHandler):
    events: list[dict[str, Any]] = []
    texts: list[str] = []
    refused = 0
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["content-length"]))
        with self.lock:
            if self.path == "/slack":
                self.texts.append(json.loads(body)["text"])
            elif verify(SECRET.encode(), self.headers.get("x-plnt-timestamp", ""),
                        self.headers.get("x-plnt-signature", ""), body):
                self.events.append(json.loads(body))
            else:
                type(self).refused += 1
                self.send_response(401)
                self.end_headers()
                return
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


def kinds_for(version: str) -> list[str]:
    with Seen.lock:
        return [e["kind"] for e in Seen.events if e["version"] == version]


def wait_kinds(up: PlntUp, version: str, last: str, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = kinds_for(version)
        if found and found[-1] == last:
            return found
        time.sleep(0.1)
    raise AssertionError(up.why(f"no {last!r} notification for {version}; got {kinds_for(version)}"))


def test_each_transition_reaches_a_signed_webhook_and_a_chat(spec_repo: SpecRepo, tmp_path: Path,
                                                             started: list[PlntUp]) -> None:
    secret_file = tmp_path / "notify-secret"
    secret_file.write_text(SECRET + "\n")
    with ThreadedHttp(Seen) as receiver:
        slack_file = tmp_path / "slack-url"
        slack_file.write_text(f"{receiver.url}/slack\n")
        up = PlntUp(spec_repo.path, tmp_path / "state", gateway_port(), tmp_path / "plnt.log", extra=(
            "--notify-webhook", f"{receiver.url}/hooks/plnt", "--notify-webhook-secret-file", str(secret_file),
            "--notify-slack-url-file", str(slack_file)))
        started.append(up)
        assert up.wait_ready()["version"] == "1.2.0"
        assert wait_kinds(up, "1.2.0", "promoted") == ["started", "promoted"]

        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n", HELD)
        commit = spec_repo.commit("1.3.0, held at 20%")
        httpx.post(f"{up.url}/hooks/git", trust_env=False)
        assert wait_kinds(up, "1.3.0", "paused") == ["started", "step", "paused"]
        resumed = subprocess.run([*PLNT, "rollout", "resume", "review-responder", "--url", up.url],
                                 capture_output=True, text=True, timeout=60)
        assert resumed.returncode == 0, resumed.stderr
        assert wait_kinds(up, "1.3.0", "promoted") == ["started", "step", "paused", "step", "promoted"]
        step1, paused, step2 = [e for e in Seen.events if e["version"] == "1.3.0"][1:4]
        assert (step1["step"], step1["steps"], step1["weight"], step1["commit"]) == (1, 2, 20, commit), step1
        assert paused["message"].startswith("step 1/2 passed at 20%; waiting for a person before step 2")
        assert (step2["step"], step2["weight"]) == (2, 60)

        spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.2.0")
        spec_repo.commit("back to 1.2.0, held")
        httpx.post(f"{up.url}/hooks/git", trust_env=False)
        wait_row(up, lambda r: "waiting for a person" in r["message"] and r["canaryVersion"] == "1.2.0", "held")
        aborted = subprocess.run([*PLNT, "rollout", "abort", "review-responder", "--url", up.url, "--by", "ops",
                                  "--reason", "not today"], capture_output=True, text=True, timeout=60)
        assert aborted.returncode == 0, aborted.stderr
        assert wait_kinds(up, "1.2.0", "aborted")[-4:] == ["started", "step", "paused", "aborted"]

        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.4.0")
        spec_repo.commit("1.4.0, broken")
        httpx.post(f"{up.url}/hooks/git", trust_env=False)
        assert wait_kinds(up, "1.4.0", "rolled_back") == ["started", "step", "rolled_back"]
        (rolled,) = [e for e in Seen.events if e["kind"] == "rolled_back"]
        assert rolled["message"].startswith("step 1/2 at 20%: smoke test failed"), rolled
        assert rolled["serving"] == "1.3.0"
        # The chat gets each transition right after the webhook: the last one may still be on its way.
        deadline = time.monotonic() + 30
        while len(Seen.texts) < len(Seen.events) and time.monotonic() < deadline:
            time.sleep(0.1)

    assert Seen.refused == 0, "every delivery carried a valid signature"
    texts = "\n".join(Seen.texts)
    assert "plnt: default/review-responder 1.3.0 paused (commit " in texts, texts
    assert "plnt: default/review-responder 1.2.0 aborted" in texts and "aborted by ops at step 1/2: not today" in texts
    assert len(Seen.texts) == len(Seen.events), "the chat gets each transition the webhook gets"
    log = up.log()
    assert SECRET not in log and "/slack" not in log, "neither the HMAC key nor the chat URL is logged"
