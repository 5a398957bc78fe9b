"""The declared fake of the driver protocol (tests/fake_driver.py) stays in step with the protocol
and with what the real drivers do that tests above them rely on."""

from __future__ import annotations

import inspect

import pytest
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.drivers.protocol import InstallRequest, ReleaseDriver
from plnt.reconciler.errors import PlntError

from tests.fake_driver import FakeDriver

PROTOCOL_METHODS = sorted(name for name, _ in inspect.getmembers(ReleaseDriver, inspect.isfunction)
                          if not name.startswith("_"))


def test_the_protocol_is_read() -> None:
    assert {"install", "promote", "remove", "live", "drift", "repair", "assign"} <= set(PROTOCOL_METHODS)


@pytest.mark.parametrize("method", PROTOCOL_METHODS)
def test_the_fake_has_each_protocol_method_with_its_signature(method: str) -> None:
    wanted, fake = getattr(ReleaseDriver, method), getattr(FakeDriver, method)
    assert inspect.signature(fake) == inspect.signature(wanted), f"FakeDriver.{method} drifted from the protocol"
    assert inspect.iscoroutinefunction(fake) == inspect.iscoroutinefunction(wanted)


def test_the_snapshot_it_offers_is_one_the_local_driver_offers() -> None:
    assert inspect.signature(FakeDriver.snapshot) == inspect.signature(LocalDriver.snapshot)


def request(version: str = "1.0.0", track: str = "canary") -> InstallRequest:
    return InstallRequest(namespace="default", name="a", track=track, version=version,  # type: ignore[arg-type]
                          spec_fingerprint="sha256:" + "f" * 64, recipe_digest="sha256:" + "0" * 64, recipe_dir="/r",
                          traffic_percent=10)


async def test_install_promote_remove_keep_records_as_a_driver_does() -> None:
    driver = FakeDriver()
    stable = await driver.install(request("1.0.0", "stable"))
    canary = await driver.install(request("1.1.0"))
    assert (await driver.live())["default/a"].canary == canary
    promoted = await driver.promote("default", "a")
    assert promoted.version == "1.1.0" and promoted.track == "stable" and promoted.traffic_percent == 0
    assert (await driver.live())["default/a"].canary is None and stable.version == "1.0.0"
    assert await driver.promote("default", "a") == promoted, "a retried promote finds its own work"
    await driver.remove("default", "a", "stable")
    await driver.remove("default", "a", "stable")  # nothing to remove is not an error
    assert await driver.live() == {}
    assert [c.method for c in driver.calls].count("install") == 2


async def test_a_planned_failure_happens_once() -> None:
    driver = FakeDriver()
    driver.fail_next("install")
    with pytest.raises(PlntError, match="fake install failure"):
        await driver.install(request())
    assert (await driver.install(request())).version == "1.0.0"
