"""`plnt bench` and the figures it prints (gateway/bench.py)."""

from __future__ import annotations

import json
import math

import pytest
from plnt.core.auth import TokenSet
from plnt.core.routes import Backend, Route, RouteTable
from plnt.gateway.app import create_app
from plnt.gateway.bench import Load, Sample, percentile, stats_cache_counts, summarize
from plnt.gateway.router import Router
from plnt.reconciler.cli.main import app as cli
from typer.testing import CliRunner

from tests.gateway.fakes import FakeRunner
from tests.openai_peer import UvicornThread


def test_percentile_interpolates() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 95) == 3.0
    assert math.isnan(percentile([], 50))


def test_summarize_counts_errors_cache_and_streams() -> None:
    load = Load(stream=True, wall_s=2.0, samples=[
        Sample(0.010, 200, ttft_s=0.002, tpot_s=0.001, tokens=3, cache_hits=1, cache_misses=1),
        Sample(0.020, 200, ttft_s=0.004, tpot_s=0.003, tokens=5, cache_hits=2, cache_misses=0),
        Sample(0.5, 502, error="HTTP 502"),
        Sample(0.1, 0, error="UpstreamConnectError: refused"),
    ])
    s = summarize(load)
    assert (s["requests"], s["errors"], s["error_rate"], s["throughput_rps"]) == (4, 2, 0.5, 2.0)
    assert s["latency_ms"]["p50"] == pytest.approx(15.0)  # of the successful ones
    assert s["ttft_ms"]["p50"] == pytest.approx(3.0)
    assert s["tpot_ms"]["p50"] == pytest.approx(2.0)
    assert s["step_cache"] == {"hits": 3, "lookups": 4, "hit_rate": 0.75}
    assert s["error_kinds"] == {"HTTP 502": 1, "UpstreamConnectError: refused": 1}


def test_stats_cache_counts_sums_backends() -> None:
    stats = {"backends": [{"stats": {"stepCache": {"hits": 3, "misses": 1}}},
                          {"stats": {"stepCache": {"hits": 2, "misses": 2}}},
                          {"stats": None, "error": "refused"}]}
    assert stats_cache_counts(stats) == (5, 3)
    assert stats_cache_counts({"backends": []}) is None


@pytest.mark.integration
def test_plnt_bench_command() -> None:
    """`plnt bench` against a real gateway whose runner is a fake runner (FakeRunner,
    tests/gateway/fakes.py) standing in for plnt.runner; both served by uvicorn in threads."""
    runner = FakeRunner("1.0.0", tokens=("a", " b", " c"))
    with UvicornThread(runner.app()) as runner_server:
        table = RouteTable([Route("default", "assistant", stable=Backend(runner_server.url, "1.0.0", "rel-1"))])
        gateway = create_app(Router(table), list_workflows=list, tokens=TokenSet.parse(None, ["tok"]))
        with UvicornThread(gateway) as gw:
            cli_runner = CliRunner()
            result = cli_runner.invoke(cli, ["bench", "assistant", "-n", "40", "-c", "4", "--url", gw.url],
                                       env={"PLNT_TOKEN": "tok"})
            assert result.exit_code == 0, result.output
            assert "requests 40  errors 0 (0.00%)" in result.output
            assert "latency   p50" in result.output
            assert "step cache hit rate 50.0% (40 of 80 lookups, from results)" in result.output

            # Tokens 30 ms apart (three servers and the CLI share one GIL here: closer tokens may
            # arrive together, which is the GIL's doing, not the gateway's).
            runner.token_delay_s = 0.03
            result = cli_runner.invoke(cli, ["bench", "assistant", "-n", "6", "-c", "2", "--stream", "--json",
                                             "--url", gw.url, "--token", "tok"])
            assert result.exit_code == 0, result.output
            figures = json.loads(result.output)
            assert figures["errors"] == 0 and figures["tokens_per_request"] == 3
            assert figures["ttft_ms"]["p50"] >= 25 and figures["tpot_ms"]["p50"] >= 15

            result = cli_runner.invoke(cli, ["bench", "assistant", "--url", gw.url], env={"PLNT_TOKEN": ""})
            assert result.exit_code == 2 and "refused the token (401)" in result.output
            result = cli_runner.invoke(cli, ["bench", "nope", "--url", gw.url, "--token", "tok"])
            assert result.exit_code == 1 and "no workflow named nope" in result.output
