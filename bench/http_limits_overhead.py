"""What the HTTP hardening costs per request, in process and alternating, so that machine noise
hits both alike: uvicorn's HttpToolsProtocol vs plnt's LimitedHttpToolsProtocol (a fake
transport, an ASGI app that answers at once; min and median of 10 rounds of 5,000 keep-alive
requests), then the gateway's per-request checks (Host, Content-Type, bounded JSON) by timeit.

    python bench/http_limits_overhead.py
"""

import asyncio
import json
import time
import timeit

import uvicorn
import uvloop
from plnt.core.auth import TokenSet, host_allowed, is_json_media, open_gateway_hosts
from plnt.core.limits import HttpLimits, http_protocol, loads
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

REQ = (b"POST /workflows/echo/invoke HTTP/1.1\r\nhost: 127.0.0.1:8000\r\ncontent-type: application/json\r\n"
       b"accept: */*\r\nuser-agent: bench\r\ncontent-length: 36\r\n\r\n" + b'{"text": "a small invocation", "n":1}'[:36])

class FakeTransport:
    def __init__(self):
        self.closing = False

    def get_extra_info(self, key, default=None):
        return ("127.0.0.1", 1234) if key in ("sockname", "peername") else default

    def write(self, data):
        pass

    def is_closing(self):
        return self.closing

    def close(self):
        self.closing = True

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def can_write_eof(self):
        return True

    def write_eof(self):
        pass


async def app(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})



async def run(cls, n):
    config = uvicorn.Config(app, lifespan="off", log_level="warning", http=cls)
    config.load()
    proto = cls(config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
    proto.connection_made(FakeTransport())
    t = time.perf_counter()
    for _ in range(n):
        proto.data_received(REQ)
        while proto.server_state.tasks:
            await asyncio.sleep(0)
    dt = time.perf_counter() - t
    proto.connection_lost(None)
    return dt / n * 1e6


async def main():
    limited = http_protocol(HttpLimits())
    res = {"uvicorn": [], "plnt": []}
    for _ in range(10):
        res["uvicorn"].append(await run(HttpToolsProtocol, 5000))
        res["plnt"].append(await run(limited, 5000))
    for name, values in res.items():
        values.sort()
        print(f"{name:8s} protocol us/request: median {values[len(values) // 2]:.2f} min {values[0]:.2f}")


def checks() -> None:
    allowed = open_gateway_hosts("127.0.0.1", TokenSet())
    headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"), (b"accept", b"*/*")]
    body = b'{"text": "a small invocation", "n": 1}'
    for name, stmt in [("host check", lambda: host_allowed(headers, allowed)),
                       ("is_json_media", lambda: is_json_media(b"application/json")),
                       ("limits.loads", lambda: loads(body)), ("json.loads", lambda: json.loads(body))]:
        n = 200_000
        print(f"{name:14s} us: {min(timeit.repeat(stmt, number=n, repeat=5)) / n * 1e6:.2f}")


if __name__ == "__main__":
    uvloop.run(main())
    checks()
