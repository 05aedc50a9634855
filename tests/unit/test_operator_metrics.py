"""The controller's Prometheus gauges (hub_controller.operator.metrics): what the chart's
alerts read (tests/unit/test_alert_rules.py, tests/integration/test_prometheus.py)."""

from __future__ import annotations

from fl_fixtures import spec

from hub_controller.api import FederatedLearningStatus, Phase
from hub_controller.operator.metrics import PHASES, FederationMetrics

NS, NAME = "team-a", "digits"


def _value(m: FederationMetrics, metric: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(metric, {"namespace": NS, "name": NAME, **labels})


def test_the_phase_is_a_state_set_and_rounds_come_from_status_and_spec() -> None:
    m = FederationMetrics()
    s = spec(rounds=5)
    m.observe(NS, NAME, FederatedLearningStatus(phase=Phase.RUNNING, round=2), s, now=100.0)
    assert {p: _value(m, "ocmfl_federation_phase", phase=p) for p in PHASES} == {
        "Pending": 0.0,
        "Waiting": 0.0,
        "Running": 1.0,
        "Completed": 0.0,
        "Failed": 0.0,
    }
    assert _value(m, "ocmfl_federation_round") == 2
    assert _value(m, "ocmfl_federation_rounds_requested") == 5
    assert _value(m, "ocmfl_federation_round_timeout_seconds") == s.server.timeouts.round_seconds


def test_progress_moves_only_when_the_run_starts_or_its_round_goes_up() -> None:
    m = FederationMetrics()
    s = spec(rounds=5)

    def at(now: float, phase: Phase, round_: int) -> float | None:
        m.observe(NS, NAME, FederatedLearningStatus(phase=phase, round=round_), s, now=now)
        return _value(m, "ocmfl_federation_progress_timestamp_seconds")

    assert at(10.0, Phase.WAITING, 0) == 10.0  # first seen (also: the hub just started)
    assert at(20.0, Phase.WAITING, 0) == 10.0
    assert at(30.0, Phase.RUNNING, 0) == 30.0  # started
    assert at(40.0, Phase.RUNNING, 0) == 30.0  # a pass without progress: a stall shows
    assert at(50.0, Phase.RUNNING, 1) == 50.0  # a round done
    assert at(60.0, Phase.COMPLETED, 5) == 50.0


def test_an_invalid_resource_has_its_phase_and_a_deleted_one_has_no_series() -> None:
    m = FederationMetrics()
    m.observe(NS, NAME, FederatedLearningStatus(phase=Phase.FAILED), None, now=1.0)
    assert _value(m, "ocmfl_federation_phase", phase="Failed") == 1.0
    assert _value(m, "ocmfl_federation_rounds_requested") is None
    m.forget(NS, NAME)
    names = {s.name for fam in m.registry.collect() for s in fam.samples}
    assert not names & {"ocmfl_federation_phase", "ocmfl_federation_round"}, names
    m.forget(NS, NAME)  # twice: nothing left, nothing raised
