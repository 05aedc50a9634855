"""Hub server objects: Job, LoadBalancer Service, model storage, address, model artifact."""

from __future__ import annotations

import json

from fl_fixtures import REF, spec

from hub_controller.operator.desired.server import (
    MODEL_DIR,
    SERVER_BACKOFF_LIMIT,
    desired_job,
    desired_model_claim,
    desired_service,
    server_args,
)
from hub_controller.operator.observed import (
    job_state,
    model_from_termination_message,
    outcome_from_termination_message,
    server_address,
)
from ocmfl import constants
from ocmfl.constants import SERVER_FAILED_EXIT


def test_service_is_a_load_balancer_on_the_fleet_port_owned_and_labelled() -> None:
    svc = desired_service(REF)
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["ports"][0]["port"] == constants.FLEET_PROXY_PORT
    assert svc["metadata"]["ownerReferences"][0]["uid"] == REF.uid
    assert svc["metadata"]["labels"][constants.LABEL_COMPONENT] == "server"
    job = desired_job(REF, spec())
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in svc["spec"]["selector"].items())


def test_server_job_runs_ocm_fl_server_with_the_rounds_and_min_clients() -> None:
    job = desired_job(REF, spec(rounds=7))
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["ocm-fl-server"]
    args = container["args"]
    assert args == server_args(REF, spec(rounds=7))
    assert args[args.index("--rounds") + 1] == "7"
    assert args[args.index("--min-clients") + 1] == "2"
    assert "--init-model" not in args


def test_the_app_its_run_config_and_init_model_reach_the_server() -> None:
    app = {"path": "/opt/ocm-fl/apps/mine", "runConfig": {"lr": 0.01}, "installDependencies": True}
    args = server_args(REF, spec(app=app, initModel="base.pth"))
    assert args[args.index("--app-dir") + 1] == "/opt/ocm-fl/apps/mine"
    assert json.loads(args[args.index("--run-config") + 1]) == {"lr": 0.01}
    assert args[args.index("--init-model") + 1] == "base.pth"
    assert "--install-dependencies" in args
    assert "--install-dependencies" not in server_args(REF, spec())


def test_pod_settings_reach_the_server_pod_and_our_labels_win() -> None:
    pod = {
        "labels": {"kueue.x-k8s.io/queue-name": "team-a"},
        "annotations": {"note": "x"},
        "schedulerName": "volcano",
        "priorityClassName": "high",
        "nodeSelector": {"gpu": "true"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    template = desired_job(REF, spec(pod=pod))["spec"]["template"]
    assert template["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert template["metadata"]["labels"][constants.LABEL_OWNER_UID] == REF.uid
    assert template["metadata"]["annotations"] == {"note": "x"}
    pod_spec = template["spec"]
    assert (pod_spec["schedulerName"], pod_spec["priorityClassName"]) == ("volcano", "high")
    assert pod_spec["nodeSelector"] == {"gpu": "true"}
    assert pod_spec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "schedulerName" not in desired_job(REF, spec())["spec"]["template"]["spec"]


def test_s3_storage_gives_the_server_the_bucket_and_the_secret() -> None:
    s3 = {"bucketName": "fl", "prefix": "runs", "endpoint": "http://127.0.0.1:9000",
          "credentialsSecret": "s3-creds", "region": "eu-1"}  # fmt: skip
    job = desired_job(REF, spec(storage={"type": "S3", "s3": s3}))
    container = job["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--storage") + 1] == "s3://fl/runs"
    assert "--persist-dir" not in args  # its volume is an emptyDir: nothing outlives the pod
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AWS_ENDPOINT_URL_S3"] == "http://127.0.0.1:9000" and env["AWS_REGION"] == "eu-1"
    # Only the AWS keys come from the Secret (its other keys never become env).
    assert "envFrom" not in container
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert refs["AWS_ACCESS_KEY_ID"] == {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}
    assert refs["AWS_SECRET_ACCESS_KEY"]["name"] == "s3-creds"
    assert refs["AWS_SESSION_TOKEN"]["optional"] is True
    assert desired_model_claim(REF, spec(storage={"type": "S3", "s3": s3})) is None


def test_pvc_is_created_only_without_claim_name() -> None:
    assert desired_model_claim(REF, spec(storage={"type": "HostPath"})) is None
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


def test_a_failed_servers_own_reason_comes_from_the_termination_message() -> None:
    msg = json.dumps({"ok": False, "reason": "run 1 finished:failed: ValueError: bad column"})
    pod = {
        "status": {
            "containerStatuses": [
                {"name": "server", "state": {"terminated": {"exitCode": 1, "message": msg}}}
            ]
        }
    }
    outcome = outcome_from_termination_message(pod)
    assert outcome is not None and outcome.ok is False and outcome.model is None
    assert outcome.reason == "run 1 finished:failed: ValueError: bad column"


def test_only_an_exit_0_with_a_completed_verdict_is_a_succeeded_server() -> None:
    def pod(code: int, ok: bool) -> dict[str, object]:
        terminated = {"exitCode": code, "message": json.dumps({"ok": ok, "reason": "r"})}
        return {
            "status": {
                "containerStatuses": [{"name": "server", "state": {"terminated": terminated}}]
            }
        }

    outcomes = [
        outcome_from_termination_message(pod(c, ok))
        for c, ok in ((0, True), (1, True), (0, False), (1, False))
    ]
    assert [o.succeeded if o else None for o in outcomes] == [True, False, False, False]


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
    host = spec(storage={"type": "HostPath"})
    # Under the admin's root, in the resource's own directory (namespace, name, uid).
    assert (
        model_location(REF, host, inside, "/srv/models/")
        == f"/srv/models/{REF.namespace}/{REF.name}-{REF.uid}/final/model.npz"
    )
    pvc = spec(storage={"type": "PVC", "claimName": "mine"})
    assert model_location(REF, pvc, inside) == "pvc://mine/final/model.npz"
    incumbent = spec(storage={"type": "PersistentVolumeClaim", "name": "theirs"})
    assert model_location(REF, incumbent, inside) == "pvc://theirs/final/model.npz"
    assert model_location(REF, spec(), "s3://fl/runs/final/model.npz").startswith("s3://")


def test_a_killed_server_pod_is_replaced_a_bounded_number_of_times_but_a_verdict_is_final() -> None:
    job = desired_job(REF, spec())["spec"]
    assert job["backoffLimit"] == SERVER_BACKOFF_LIMIT > 0
    # podFailurePolicy needs restartPolicy Never (the Job controller replaces the pod).
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    rules = job["podFailurePolicy"]["rules"]
    # Rules apply in order: a disruption (eviction, drain) never counts, even when the
    # SIGTERMed launcher then exits 1.
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    fail = rules[1]
    assert fail["action"] == "FailJob"
    assert fail["onExitCodes"] == {
        "containerName": job["template"]["spec"]["containers"][0]["name"],
        "operator": "In",
        "values": [SERVER_FAILED_EXIT],
    }
    # SIGKILL (137) and other crashes are not a verdict: they count against backoffLimit.
    assert 137 not in fail["onExitCodes"]["values"]


def test_the_superlink_database_lives_on_the_store_volume_per_resource() -> None:
    # HostPath (default) and PVC stores are volumes that outlive the pod: a replacement pod
    # keeps the SuperLink's node ids there.
    for storage in ({}, {"storage": {"type": "PVC", "size": "1Gi"}}):
        args = server_args(REF, spec(**storage))
        persist = args[args.index("--persist-dir") + 1]
        assert persist == f"{MODEL_DIR}/.ocm-fl-server/{REF.uid}"
        assert args[args.index("--state-dir") + 1] not in persist


def test_rounds_and_history_of_an_app_without_the_sdk_come_from_the_termination_message() -> None:
    history = [
        {"round": 1, "loss": 0.9, "accuracy": 0.3},
        {"round": 2, "accuracy": 0.6},
        {"round": 0, "loss": 1.0},  # not a round
        {"round": True, "loss": 1.0},  # not an int
        {"round": 3, "loss": "high"},  # no number
        "not a row",
    ]
    msg = json.dumps({"ok": True, "reason": "run 4 completed 2 rounds", "round": 2,
                      "history": history})  # fmt: skip
    terminated = {"exitCode": 0, "message": msg}
    pod = {
        "status": {"containerStatuses": [{"name": "server", "state": {"terminated": terminated}}]}
    }
    outcome = outcome_from_termination_message(pod)
    assert outcome is not None and outcome.model is None and outcome.rounds == 2
    rows = [(h.round, h.cluster, h.loss, h.accuracy) for h in outcome.history]
    assert rows == [(1, "global", 0.9, 0.3), (2, "global", None, 0.6)]
