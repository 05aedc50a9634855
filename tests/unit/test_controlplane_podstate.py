"""Pod phase and status as the local node reports them (kubelet rules, no processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from hack.controlplane import podstate
from hack.controlplane.podstate import Ctr, PodRun


class _Proc:
    def __init__(self, returncode: int | None) -> None:
        self.returncode = returncode
        self.pid = 4242


def _ctr(
    name: str, *, running: bool = False, exit_code: int | None = None, fatal: bool = False
) -> Ctr:
    c = Ctr(name, "busybox", Path("/dev/null"))
    if running:
        c.popen = cast(Any, _Proc(None))
        c.waiting = None
    if exit_code is not None:
        c.popen = cast(Any, _Proc(exit_code))
        c.terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
        c.done, c.waiting = True, None
    if fatal:
        c.waiting, c.fatal = ("ErrImagePull", "no mapping"), True
    return c


def _run(main: list[Ctr], init: list[Ctr] | None = None, policy: str = "Never") -> PodRun:
    run = PodRun("u", "ns", "p", "127.21.0.1", Path("/tmp"), init or [], main, policy)
    run.prepared = True
    return run


def test_all_containers_exited_zero_is_succeeded_and_not_ready() -> None:
    st = podstate.pod_status(_run([_ctr("a", exit_code=0), _ctr("b", exit_code=0)]))
    assert st["phase"] == "Succeeded"
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PodCompleted")
    assert st["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_a_failed_container_under_never_fails_the_pod_once_all_exited() -> None:
    assert podstate.pod_phase(_run([_ctr("a", exit_code=0), _ctr("b", running=True)])) == "Running"
    assert podstate.pod_phase(_run([_ctr("a", exit_code=0), _ctr("b", exit_code=3)])) == "Failed"


def test_running_containers_make_the_pod_ready_with_its_address() -> None:
    st = podstate.pod_status(_run([_ctr("a", running=True)], policy="Always"))
    assert st["phase"] == "Running"
    assert st["podIP"] == "127.21.0.1"
    assert all(c["status"] == "True" for c in st["conditions"])
    assert st["containerStatuses"][0]["ready"] is True


def test_unrunnable_image_keeps_the_pod_pending_with_the_reason() -> None:
    st = podstate.pod_status(_run([_ctr("a", fatal=True)]))
    assert st["phase"] == "Pending"
    assert st["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"
    assert st["reason"] == "ErrImagePull"


def test_init_containers_gate_the_main_containers() -> None:
    run = _run([_ctr("main")], init=[_ctr("init", running=True)])
    st = podstate.pod_status(run)
    assert st["phase"] == "Pending"
    assert next(c for c in st["conditions"] if c["type"] == "Initialized")["status"] == "False"
    failed = _run([_ctr("main")], init=[_ctr("init", exit_code=1)])
    assert podstate.pod_phase(failed) == "Failed"


def test_exit_codes_of_signals_follow_the_128_plus_n_convention() -> None:
    assert podstate.exit_info(-15) == (143, "Error")
    assert podstate.exit_info(0) == (0, "Completed")
