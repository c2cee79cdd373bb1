"""Store up/down hysteresis, driven by a fake clock and a probe that fails on demand."""

from __future__ import annotations

import pytest

from kvgate.store.base import StoreUnavailable
from kvgate.store.health import StoreHealth, StoreHealthCollector


class Probe:
    def __init__(self) -> None:
        self.ok = True
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if not self.ok:
            raise ConnectionError("refused")


async def test_one_outage_is_one_transition_each_way() -> None:
    now = [0.0]
    health = StoreHealth("redis", "redis://x", recover_after_s=2.0, probe_interval_s=0.5,
                         clock=lambda: now[0])  # fmt: skip
    probe = Probe()
    await health.check(probe)  # up: no probe at all
    assert probe.calls == 0
    for _ in range(5):  # many broken connections, one transition
        health.failed(ConnectionError("reset"))
    assert health.transitions == {"down": 1, "up": 0}
    probe.ok = False
    with pytest.raises(StoreUnavailable):
        await health.check(probe)  # not due yet: fails without probing
    assert probe.calls == 0
    now[0] = 0.6
    with pytest.raises(StoreUnavailable):
        await health.check(probe)  # due, probe fails
    assert probe.calls == 1
    probe.ok = True
    for t in (1.2, 1.8, 2.4, 3.0):  # answers, but not yet for 2 s
        now[0] = t
        with pytest.raises(StoreUnavailable, match="recovering"):
            await health.check(probe)
    probe.ok = False  # a relapse restarts the recovery window
    now[0] = 3.6
    with pytest.raises(StoreUnavailable):
        await health.check(probe)
    probe.ok = True
    for t in (4.2, 4.8, 5.4, 6.0):
        now[0] = t
        with pytest.raises(StoreUnavailable):
            await health.check(probe)
    now[0] = 6.6  # 2.4 s of good probes since 4.2
    await health.check(probe)
    assert health.up and health.transitions == {"down": 1, "up": 1}


def test_collector_exports_every_backend() -> None:
    a, b = StoreHealth("redis", "redis://x"), StoreHealth("etcd", "etcd://y")
    a.failed(OSError("x"))
    a.reacquired("lease_lost")
    names = {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for m in StoreHealthCollector(lambda: [a, b]).collect()
        for s in m.samples
    }
    assert ("kvgate_store_backend_up", (("backend", "redis"),), 0.0) in names
    assert ("kvgate_store_backend_up", (("backend", "etcd"),), 1.0) in names
    assert ("kvgate_store_transitions_total", (("backend", "redis"), ("to", "down")), 1.0) in names
    assert (
        "kvgate_store_lease_reacquired_total",
        (("backend", "redis"), ("reason", "lease_lost")),
        1.0,
    ) in names
