"""Hub server objects: Job, LoadBalancer Service, model storage, address, model artifact."""

from __future__ import annotations

import json

from fl_fixtures import REF, spec

from hub_controller.operator.desired.server import (
    desired_job,
    desired_model_claim,
    desired_service,
    server_args,
)
from hub_controller.operator.observed import (
    job_state,
    model_from_termination_message,
    server_address,
)
from ocmfl import constants


def test_service_is_a_load_balancer_on_the_fleet_port_owned_and_labelled() -> None:
    svc = desired_service(REF)
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["ports"][0]["port"] == constants.FLEET_PROXY_PORT
    assert svc["metadata"]["ownerReferences"][0]["uid"] == REF.uid
    assert svc["metadata"]["labels"][constants.LABEL_COMPONENT] == "server"
    job = desired_job(REF, spec())
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in svc["spec"]["selector"].items())


def test_server_job_runs_ocm_fl_server_once_with_the_rounds_and_min_clients() -> None:
    job = desired_job(REF, spec(rounds=7))
    assert job["spec"]["backoffLimit"] == 0
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["ocm-fl-server"]
    args = container["args"]
    assert args == server_args(REF, spec(rounds=7))
    assert args[args.index("--rounds") + 1] == "7"
    assert args[args.index("--min-clients") + 1] == "2"
    assert "--init-model" not in args


def test_strategy_params_and_init_model_reach_the_server() -> None:
    s = spec(
        strategy={"name": "fedprox", "params": {"proximalMu": 0.01}},
        initModel="/models/start.pt",
    )
    args = server_args(REF, s)
    assert args[args.index("--strategy") + 1] == "fedprox"
    assert json.loads(args[args.index("--strategy-params") + 1])["proximalMu"] == 0.01
    assert args[args.index("--init-model") + 1] == "/models/start.pt"


def test_pvc_is_created_only_without_claim_name() -> None:
    assert desired_model_claim(REF, spec()) is None
    assert desired_model_claim(REF, spec(storage={"type": "PVC", "claimName": "mine"})) is None
    pvc = desired_model_claim(REF, spec(storage={"type": "PVC", "size": "2Gi"}))
    assert pvc is not None
    assert pvc["spec"]["resources"]["requests"]["storage"] == "2Gi"
    job = desired_job(REF, spec(storage={"type": "PVC", "claimName": "mine"}))
    volume = job["spec"]["template"]["spec"]["volumes"][0]
    assert volume["persistentVolumeClaim"] == {"claimName": "mine"}


def test_address_prefers_advertise_address_then_load_balancer_ingress() -> None:
    svc = {"status": {"loadBalancer": {"ingress": [{"ip": "127.0.0.5"}]}}}
    assert server_address(spec(advertiseAddress="fl.example:443"), svc) == "fl.example:443"
    assert server_address(spec(), svc) == f"127.0.0.5:{constants.FLEET_PROXY_PORT}"
    assert server_address(spec(), {"status": {}}) is None
    assert server_address(spec(), None) is None


def test_job_state_reads_terminal_conditions() -> None:
    done = {"status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}
    failed = {
        "status": {
            "failed": 1,
            "conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimit"}],
        }
    }
    assert job_state(done).complete and job_state(done).done
    assert job_state(failed).failed_condition and job_state(failed).message == "BackoffLimit"
    assert not job_state(None).exists


def test_model_artifact_comes_from_the_termination_message() -> None:
    msg = json.dumps(
        {"path": "/m/final.pt", "round": 3, "sha256": "ab", "metrics": {"acc": 0.9, "note": "x"}}
    )
    pod = {
        "status": {
            "containerStatuses": [
                {"name": "server", "state": {"terminated": {"exitCode": 0, "message": msg}}}
            ]
        }
    }
    model = model_from_termination_message(pod)
    assert model is not None and model.round == 3 and model.metrics == {"acc": 0.9}
    bad = {
        "status": {
            "containerStatuses": [
                {"name": "server", "state": {"terminated": {"message": "not json"}}}
            ]
        }
    }
    assert model_from_termination_message(bad) is None


def test_model_location_names_the_host_directory_or_the_claim_not_the_container_path() -> None:
    from hub_controller.operator.desired.server import MODEL_DIR, model_location

    inside = f"{MODEL_DIR}/final/model.npz"
    host = spec(storage={"type": "HostPath", "path": "/srv/models/"})
    assert model_location(REF, host, inside) == "/srv/models/final/model.npz"
    pvc = spec(storage={"type": "PVC", "claimName": "mine"})
    assert model_location(REF, pvc, inside) == "pvc://mine/final/model.npz"
