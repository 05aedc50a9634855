"""The aggregator's limits, scope and bounded store, and the agent's token check (pure)."""

from __future__ import annotations

import base64
import datetime as dt

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from agent_addon.state import Forbidden, Unauthorized
from agent_addon.tokens import TokenCheck, bearer_token
from hub_controller.aggregator.limits import Limits, TokenBucket
from hub_controller.aggregator.metrics import OTHER, AggregatorMetrics
from hub_controller.aggregator.scope import WorkScope
from hub_controller.aggregator.store import ReportStore, StoreFull, StoreLimits
from ocmfl import constants
from ocmfl.status.v1 import report_pb2


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_limits_from_env_name_the_bad_variable() -> None:
    env = {"OCMFL_AGGREGATOR_MAX_STREAMS_PER_CLUSTER": "2", "OCMFL_AGGREGATOR_REPORTS_PER_S": "7.5"}
    limits = Limits.from_env(env.get)
    assert (limits.max_streams_per_cluster, limits.reports_per_s) == (2, 7.5)
    assert limits.max_rows == Limits().max_rows
    with pytest.raises(ValueError, match="OCMFL_AGGREGATOR_MAX_ROWS='many': must be a int"):
        Limits.from_env({"OCMFL_AGGREGATOR_MAX_ROWS": "many"}.get)
    with pytest.raises(ValueError, match="OCMFL_AGGREGATOR_MAX_RUNS='0': must be positive"):
        Limits.from_env({"OCMFL_AGGREGATOR_MAX_RUNS": "0"}.get)


def test_token_bucket_gives_a_burst_then_the_rate_and_refuses_long_waits() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=10, burst=3, clock=clock)
    assert [bucket.reserve(1.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve(1.0) == pytest.approx(0.1)
    assert bucket.reserve(0.15) is None  # would wait 0.2 s
    clock.now += 1.0
    assert bucket.reserve(0.0) == 0.0


def test_work_scope_is_not_final_until_the_works_are_seen_or_the_grace_ends() -> None:
    clock = Clock()
    scope = WorkScope({("c1", "u1"): [("ns", "a")]}, grace_s=30, clock=clock)
    assert not scope.ready()
    clock.now += 31
    assert scope.ready()
    scope = WorkScope({("c1", "u1"): [("ns", "a")]}, grace_s=30, clock=clock)
    scope.mark_ready()
    assert scope.ready()
    assert scope.allows("c1", "ns", "a", "u1")
    assert not scope.allows("c2", "ns", "a", "u1")
    assert not scope.allows("c1", "ns", "b", "u1")
    assert not scope.allows("c1", "ns", "a", "u2")


def report(cluster: str, uid: str, *rounds: int) -> report_pb2.Report:
    ts = Timestamp()
    ts.FromDatetime(dt.datetime.now(dt.UTC))
    return report_pb2.Report(
        cluster=cluster,
        fl_namespace="ns",
        fl_name="a",
        fl_uid=uid,
        client_phase=report_pb2.CLIENT_PHASE_RUNNING,
        timestamp=ts,
        sequence=1,
        metrics=[
            report_pb2.RoundMetrics(round=r, phase=report_pb2.ROUND_PHASE_FIT) for r in rounds
        ],
    )


def test_store_evicts_a_clusters_oldest_rows_and_refuses_past_run_and_store_limits() -> None:
    store = ReportStore(
        StoreLimits(max_rows_per_cluster=3, max_rows_per_run=5, max_rows=7, max_runs=2)
    )
    store.apply("c1", report("c1", "u1", 1, 2, 3, 4))
    assert sorted(store.snapshot("u1")["c1"].rounds) == [(2, "fit"), (3, "fit"), (4, "fit")]
    store.apply("c2", report("c2", "u1", 1, 2))
    with pytest.raises(StoreFull, match="run u1 already has 5 rows") as e:
        store.apply("c3", report("c3", "u1", 1))
    assert e.value.reason == "run_rows" and "c3" not in store.snapshot("u1")
    store.apply("c1", report("c1", "u1", 5))  # replaces an evicted row: no growth
    assert store.size() == (1, 2, 5)
    store.apply("c1", report("c1", "u2", 1, 2))
    with pytest.raises(StoreFull, match="at most 7 report rows"):
        store.apply("c2", report("c2", "u2", 1))
    with pytest.raises(StoreFull, match="at most 2 runs"):
        store.apply("c1", report("c1", "u3"))
    store.forget("u1")
    assert store.size() == (1, 1, 2)
    store.apply("c1", report("c1", "u3", 1))


def test_metric_series_past_the_cap_count_as_other() -> None:
    metrics = AggregatorMetrics(max_series=2)
    assert metrics.series("c1", "ns", "a") == ("c1", "ns", "a")
    assert metrics.series("c1", "ns", "b") == ("c1", "ns", "b")
    assert metrics.series("c1", "ns", "c") == (OTHER, OTHER, OTHER)
    assert metrics.series("c1", "ns", "a") == ("c1", "ns", "a")


def secret(token: str, uid: str) -> dict[str, object]:
    return {
        "metadata": {"labels": {constants.LABEL_OWNER_UID: uid}},
        "data": {constants.CLIENT_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def test_token_check_reads_the_federations_secret_and_caches_it() -> None:
    clock = Clock()
    reads: list[tuple[str, str]] = []
    current = {"token": "t" * 43}

    def read(ns: str, name: str) -> dict[str, object]:
        reads.append((ns, name))
        return secret(current["token"], "uid-1")

    check = TokenCheck(read, clock=clock)
    assert check.verify(("team-a", "x"), "t" * 43) == "uid-1"
    assert reads[0][1] == constants.CLIENT_TOKEN_SECRET and reads[0][0].startswith("fl-team-a-x-")
    assert check.verify(("team-a", "x"), "t" * 43) == "uid-1" and len(reads) == 1
    with pytest.raises(Unauthorized):
        check.verify(("team-a", "x"), None)
    with pytest.raises(Forbidden):
        check.verify(("team-a", "x"), "wrong")
    assert len(reads) == 1  # a wrong token re-reads at most once a second
    current["token"] = "n" * 43  # the federation was re-created: new token
    clock.now += 2
    assert check.verify(("team-a", "x"), "n" * 43) == "uid-1" and len(reads) == 2


def test_bearer_token_parses_only_the_bearer_scheme() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("") is None and bearer_token(None) is None
