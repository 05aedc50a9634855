"""Placement object and per-cluster resolution from decisions and claims."""

from __future__ import annotations

from fl_fixtures import REF, spec

from hub_controller.membership import (
    ClusterInfo,
    cluster_info,
    decided_clusters,
    decision_clusters,
    resolve_clusters,
)
from hub_controller.operator.desired.placement import desired_placement
from hub_controller.operator.fold import placement_condition
from hub_controller.operator.observed import placement_state
from ocmfl import constants


def test_placement_is_named_after_the_resource_and_owned_by_it() -> None:
    p = desired_placement(REF, spec())
    assert p["kind"] == "Placement"
    assert p["metadata"]["name"] == REF.name
    assert p["metadata"]["namespace"] == REF.namespace
    assert p["metadata"]["ownerReferences"][0]["uid"] == REF.uid
    assert p["metadata"]["labels"][constants.LABEL_OWNER_UID] == REF.uid
    assert p["spec"]["clusterSets"] == ["global"]
    expr = p["spec"]["predicates"][0]["requiredClusterSelector"]["claimSelector"]
    assert expr["matchExpressions"][0]["key"] == "fl.data-path"
    assert "tolerations" not in p["spec"]  # empty lists are left out


def test_missing_binding_is_a_condition_that_names_the_fix_and_never_a_binding() -> None:
    state = placement_state(
        {
            "status": {
                "conditions": [
                    {
                        "type": "PlacementSatisfied",
                        "status": "False",
                        "reason": "NoManagedClusterSetBindings",
                        "message": "None of ManagedClusterSets is bound",
                    }
                ]
            }
        }
    )
    status, reason, message = placement_condition(state, spec(), "team-a")
    assert (status, reason) == ("False", "NoManagedClusterSetBindings")
    assert "clusteradm clusterset bind global --namespace team-a" in message
    assert "never creates bindings" in message


def test_placement_without_status_is_pending() -> None:
    assert placement_condition(placement_state(None), spec(), "ns")[0] == "Unknown"
    assert placement_condition(placement_state({}), spec(), "ns")[1] == "PlacementPending"


def test_decisions_are_the_union_of_all_decision_objects() -> None:
    d1 = {"status": {"decisions": [{"clusterName": "c2", "reason": ""}, {"clusterName": "c1"}]}}
    d2 = {"status": {"decisions": [{"clusterName": "c3"}, {"clusterName": "c1"}]}}
    assert decided_clusters([decision_clusters(d1), decision_clusters(d2)]) == ["c1", "c2", "c3"]


def test_cluster_info_reads_claims_from_managed_cluster_status() -> None:
    mc = {
        "metadata": {"name": "c1", "labels": {"zone": "eu"}},
        "status": {"clusterClaims": [{"name": "fl.data-path", "value": "/srv/digits"}]},
    }
    info = cluster_info(mc)
    assert info == ClusterInfo("c1", {"fl.data-path": "/srv/digits"}, {"zone": "eu"})


def test_decided_cluster_with_claim_gets_its_data_path_and_why() -> None:
    infos = {"c1": ClusterInfo("c1", {"fl.data-path": "/srv/a"})}
    [r] = resolve_clusters(["c1"], infos, "fl.data-path")
    assert r.data_path == "/srv/a"
    assert "data at /srv/a" in r.reason


def test_decided_cluster_without_claim_is_reported_and_gets_no_data_path() -> None:
    infos = {"c1": ClusterInfo("c1", {"other": "x"})}
    [r] = resolve_clusters(["c1"], infos, "fl.data-path")
    assert r.data_path is None and not r.has_data
    assert "no ClusterClaim fl.data-path" in r.reason


def test_relative_or_escaping_claim_value_is_not_used() -> None:
    infos = {
        "c1": ClusterInfo("c1", {"k": "data/x"}),
        "c2": ClusterInfo("c2", {"k": "/srv/../etc"}),
    }
    assert [r.data_path for r in resolve_clusters(["c1", "c2"], infos, "k")] == [None, None]


def test_decided_cluster_unknown_to_the_hub_is_reported() -> None:
    [r] = resolve_clusters(["ghost"], {}, "k")
    assert not r.has_data and "no ManagedCluster" in r.reason
