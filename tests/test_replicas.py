"""ReplicaSet's outlier ejection, on a clock the test moves (Envoy's rules, see gateway/replicas.py)."""

from __future__ import annotations

import json

import pytest

from gateway.replicas import NoReplicaAvailable, Outlier, ReplicaSet


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _set(n: int = 3, **outlier) -> tuple[ReplicaSet, Clock]:
    clock = Clock()
    return ReplicaSet([f"http://r{i}" for i in range(n)], name="up", outlier=Outlier(**outlier), clock=clock), clock


def _fail(replicas: ReplicaSet, index: int, times: int) -> None:
    for _ in range(times):
        replicas.failed(replicas.replicas[index], "http_500")


def test_only_consecutive_faults_eject_and_a_success_in_between_resets_the_count():
    replicas, _ = _set(eject_after=5)
    _fail(replicas, 0, 4)
    replicas.succeeded(replicas.replicas[0])
    _fail(replicas, 0, 4)
    assert replicas.replicas[0].ejected_until == 0
    _fail(replicas, 0, 1)
    assert replicas.replicas[0].ejected_until > 0


def test_ejection_time_grows_with_repeats_up_to_the_cap_and_a_success_resets_it(caplog):
    replicas, clock = _set(eject_after=1, cooldown=10, max_cooldown=25)
    caplog.set_level("INFO", logger="responses_gateway.replicas")
    lengths = []
    for _ in range(4):
        _fail(replicas, 0, 1)
        lengths.append(replicas.replicas[0].ejected_until - clock.now)
        clock.now = replicas.replicas[0].ejected_until  # it returns ...
        replicas.choose()  # ... (noticed at the next choice) and fails again at once
    assert lengths == [10, 20, 25, 25]
    replicas.succeeded(replicas.replicas[0])
    _fail(replicas, 0, 1)
    assert replicas.replicas[0].ejected_until - clock.now == 10
    lines = [json.loads(r.message) for r in caplog.records]
    events = [line["event"] for line in lines]
    assert events.count("replica_ejected") == 5 and events.count("replica_returned") == 4
    assert [line["out_for_s"] for line in lines if line["event"] == "replica_returned"] == [10, 20, 25, 25]
    assert {line["how"] for line in lines if line["event"] == "replica_returned"} == {"ejection_expired"}


def test_the_last_healthy_replica_is_never_ejected_by_traffic():
    replicas, _ = _set(2, eject_after=1)
    _fail(replicas, 0, 1)
    _fail(replicas, 1, 10)
    assert replicas.replicas[0].ejected_until > 0 and replicas.replicas[1].ejected_until == 0
    assert replicas.choose() is replicas.replicas[1]


def test_with_none_healthy_the_choice_panics_least_recently_failed_first():
    replicas, clock = _set(3, eject_after=1)
    replicas.replicas[2].probe_ok = False  # known down: never chosen
    _fail(replicas, 1, 1)
    clock.now += 1
    _fail(replicas, 0, 1)  # r0 failed last; r1 (ejected) before it; r0 could not be ejected (last healthy)
    clock.now += 1
    replicas.replicas[0].ejected_until = clock.now + 5  # say it was ejected too
    assert replicas.choose() is replicas.replicas[1]  # least recently failed
    assert replicas.choose(exclude={"http://r1"}) is replicas.replicas[0]
    with pytest.raises(NoReplicaAvailable):
        replicas.choose(exclude={"http://r0", "http://r1"})


def test_no_replica_only_when_every_one_fails_its_health_check_with_when_to_retry():
    replicas, _ = _set(2, probe_interval=5)
    for replica in replicas.replicas:
        replicas.probed(replica, False)
    with pytest.raises(NoReplicaAvailable) as caught:
        replicas.choose()
    assert caught.value.retry_after == 5
    assert not replicas.ready(probed=True)
    replicas.probed(replicas.replicas[0], True)
    assert replicas.choose() is replicas.replicas[0] and replicas.ready(probed=True)


def test_max_ejection_percent_bounds_how_many_are_out_at_once():
    replicas, _ = _set(4, eject_after=1, max_ejection_percent=50)
    for index in range(4):
        _fail(replicas, index, 1)
    assert sum(r.ejected_until > 0 for r in replicas.replicas) == 2
