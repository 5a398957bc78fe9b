"""A STAND-IN runner for benches that look at the saga without runner start: NOT plnt's runner.

Answers what the saga asks of a runner (GET /healthz with the recipe's name and version and the
release id; POST /invoke with a fixed JSON answer) from a few lines of the standard library, so
it starts in milliseconds. It runs no recipe code. Started through the script of
benchlib.standin_python() (given to the local driver as its interpreter), with `python -S -I`.
"""

import json
import re
import signal
import socket
import sys
import threading

args = dict(zip(sys.argv[1::2], sys.argv[2::2], strict=False))  # --recipe DIR --host H --port P --release-id R ...
text = open(args["--recipe"] + "/workflow.yaml").read()
health = json.dumps({"status": "ok", "workflow": re.search(r"^\s*name:\s*(\S+)", text, re.M).group(1),
                     "version": re.search(r"^\s*version:\s*['\"]?([^'\"\s]+)", text, re.M).group(1),
                     "release": args["--release-id"], "standin": True}).encode()
answer = json.dumps({"output": {"standin": True}}).encode()
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def serve(conn):
    with conn:
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buf += chunk
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = int((re.search(rb"(?i)content-length:\s*(\d+)", head) or [0, b"0"])[1])
            while len(buf) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buf += chunk
            buf = buf[length:]
            body = health if head.startswith(b"GET /healthz") else answer
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(body), body))


server = socket.create_server((args["--host"], int(args["--port"])))
while True:
    client, _ = server.accept()
    threading.Thread(target=serve, args=(client,), daemon=True).start()
