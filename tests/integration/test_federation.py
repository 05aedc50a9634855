"""A real federation on 127.0.0.1: SuperLink + 2 SuperNodes as processes, TLS, node auth,
running the digits example app (examples/apps/digits) through the launchers.

One federation is shared by the tests of this module (they run in file order; the last one
breaks a client on purpose). Certificates come from ocmfl.pki, SuperNode keys from
ocmfl.nodekeys; the launchers `ocm-fl-server` / `ocm-fl-client` start everything.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hack.testing import free_port, wait_for
from ocmfl import pki
from ocmfl.nodekeys import write_keypair
from workloads.client_launcher import EXIT_REFUSED
from workloads.data import load_partition, partition
from workloads.sdk import ModelStore

pytestmark = [pytest.mark.federation, pytest.mark.timeout(900)]

BIN = Path(sys.executable).parent
DIGITS_APP = Path(__file__).resolve().parents[2] / "examples" / "apps" / "digits"
CLUSTERS = ("cluster1", "cluster2")
ROUNDS = 3


def _spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """subprocess.run in its own process group: on timeout the whole group (the server and its
    SuperLink) is killed, so nothing is left to disturb the next test."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _wait_for(predicate: Any, timeout: float, what: str, proc: Any = None) -> None:
    """wait_for `predicate`, failing at once when `proc` exits first."""

    def check() -> bool:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: process exited early with {proc.returncode}")
        return bool(predicate())

    wait_for(check, timeout, what, interval=1.0)


@dataclass
class Federation:
    root: Path
    port: int
    tls: Path
    keys: Path
    pubs: Path
    data: Path
    clients: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def server_cmd(self, storage: Path, rounds: int = ROUNDS, *extra: str) -> list[str]:
        # A state dir (SuperLink database) per model store: a restart of the same run reuses
        # it, the next test's run does not inherit the last one's (once, under load, the run
        # after a finished one on the same database never started: its ServerApp's runtime
        # token was refused).
        return [
            str(BIN / "ocm-fl-server"),
            "--state-dir", str(self.root / f"server-state-{storage.name}"),
            "--superlink-address", f"127.0.0.1:{self.port}",
            "--ssl-ca-certfile", str(self.tls / "ca.crt"),
            "--ssl-certfile", str(self.tls / "tls.crt"),
            "--ssl-keyfile", str(self.tls / "tls.key"),
            "--supernode-keys", str(self.pubs),
            "--min-clients", "2",
            "--wait-clients-timeout", "180",
            "--status-interval", "5",
            "--app-dir", str(DIGITS_APP),
            "--run-config", json.dumps({"test-dir": str(self.data / "test")}),
            "--rounds", str(rounds),
            "--storage", str(storage),
            *extra,
        ]  # fmt: skip

    def client_cmd(
        self, name: str, key: str, connect_timeout: float = 300, *extra: str
    ) -> list[str]:
        return [
            str(BIN / "ocm-fl-client"),
            "--server-address", f"127.0.0.1:{self.port}",
            "--root-certificates", str(self.tls / "ca.crt"),
            "--auth-key", str(self.keys / key),
            "--cluster-name", name,
            "--data-dir", str(self.data / (name if name in CLUSTERS else CLUSTERS[0])),
            "--state-dir", str(self.root / f"client-{name}"),
            "--port", str(free_port()),
            "--connect-timeout", str(connect_timeout),
            *extra,
        ]  # fmt: skip


def new_federation(
    root: Path, names: Sequence[str], registered: Sequence[str], **split: Any
) -> Federation:
    """A server certificate from a fresh CA, a SuperNode key pair per name (the public keys of
    `registered` where the server registers them) and the data of CLUSTERS, partitioned as
    `split` says (workloads.data.partition), under `root`."""
    ca = pki.create_ca(key_kind="ec")
    server = pki.issue_server_cert(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"])
    tls = pki.save_tls_dir(root / "tls", server, ca.cert)
    keys, pubs = root / "keys", root / "pubs"
    pubs.mkdir()
    for name in names:
        pub = write_keypair(keys / name, comment=name)
        if name in registered:
            (pubs / f"{name}.pub").write_bytes(pub.read_bytes())
    partition(root / "data", list(CLUSTERS), seed=0, **split)
    return Federation(root, free_port(), tls, keys, pubs, root / "data")


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    root = tmp_path_factory.mktemp("federation")
    # The rogue key is never registered.
    f = new_federation(root, (*CLUSTERS, "rogue"), CLUSTERS, split="label-skew", sizes="2,1")
    try:
        for name in CLUSTERS:
            f.clients[name] = _spawn(f.client_cmd(name, name), root / f"{name}.log")
        for name in CLUSTERS:  # data checked, SuperNode starting
            log = root / f"{name}.log"
            _wait_for(lambda log=log: "connecting to" in log.read_text(), 60,
                      f"{name} client start", f.clients[name])  # fmt: skip
        yield f
    finally:
        for proc in f.clients.values():
            _kill_group(proc, signal.SIGTERM)


def _checkpoint_rounds(storage: Path) -> list[int]:
    path = storage / "manifest.json"
    if not path.exists():
        return []
    try:
        return [c["round"] for c in json.loads(path.read_text())["checkpoints"]]
    except (ValueError, KeyError):
        return []


@pytest.mark.rotation(
    turn=0,
    covered_by=(
        "tests/drills/test_drill_server_killed.py::test_drill_server_pod_killed_mid_round_resumes_from_the_checkpoint",
        "tests/e2e/test_e2e_federation.py::test_federation_trains_to_completion_over_mtls_and_cleans_up",
        "tests/integration/test_federation.py::test_a_node_whose_key_was_never_registered_is_refused_and_gives_up",
    ),
)
def test_training_survives_server_restart_and_beats_the_initial_model(fed: Federation) -> None:
    storage = fed.root / "model"
    log = fed.root / "server.log"
    first = _spawn(fed.server_cmd(storage), log)
    try:
        _wait_for(lambda: 1 in _checkpoint_rounds(storage), 300, "round 1 checkpoint", first)
    finally:
        _kill_group(first)  # the whole hub side dies, as when its pod is deleted
    killed_after = max(_checkpoint_rounds(storage))
    assert killed_after < ROUNDS, "server finished before it could be killed"

    second = _run(fed.server_cmd(storage), timeout=600)
    last_line = second.stdout.strip().splitlines()[-1]
    assert second.returncode == 0, second.stdout[-3000:]
    assert last_line.startswith("ocm-fl-server: completed: ") and "3 rounds" in last_line

    store = ModelStore(storage)
    manifest = store.manifest()
    assert [c["round"] for c in manifest["checkpoints"]] == [1, 2, 3]
    starts = manifest["info"]["starts"]
    assert starts[0]["round"] == 0 and starts[0]["rounds_to_run"] == ROUNDS
    resumed = starts[-1]
    assert resumed["round"] >= killed_after >= 1  # resumed, did not start over
    assert resumed["rounds_to_run"] == ROUNDS - resumed["round"]

    final = store.final()
    assert final is not None and final.round == ROUNDS
    initial_acc = starts[0]["server"]["test-accuracy"]
    final_acc = manifest["final"]["metrics"]["server"]["test-accuracy"]
    assert final_acc > initial_acc + 0.3 and final_acc > 0.6

    # Each client trained on its own partition only: sample counts match its manifest.
    for checkpoint in manifest["checkpoints"]:
        for phase in ("train", "evaluate"):
            reported = {c: m["num-examples"] for c, m in checkpoint["metrics"][phase].items()}
            expected = {c: load_partition(fed.data / c).samples for c in CLUSTERS}
            assert reported == expected


def test_a_node_whose_key_was_never_registered_is_refused_and_gives_up(fed: Federation) -> None:
    # One retry per SuperNode start: the launcher then sees each refusal (Flower's 305).
    rogue = _spawn(
        fed.client_cmd("rogue", "rogue", 20, "--max-retries", "1"), fed.root / "rogue.log"
    )
    server = _spawn(fed.server_cmd(fed.root / "model-rogue"), fed.root / "server-rogue.log")
    try:
        assert rogue.wait(timeout=120) == EXIT_REFUSED
        # The server ends on its own: killed, it would leave the real clients reconnecting
        # (in backoff) when the next test's server starts.
        assert server.wait(timeout=300) == 0
    finally:
        _kill_group(server)
        _kill_group(rogue)
    assert "server refused this node" in (fed.root / "rogue.log").read_text()


def test_crashing_client_below_minimum_fails_the_run(fed: Federation) -> None:
    broken = fed.data / "cluster2" / "data.npz"
    broken.rename(broken.with_suffix(".moved"))  # its ClientApp now fails on every message
    done = _run(fed.server_cmd(fed.root / "model-2", 2, "--round-timeout", "120"), timeout=600)
    last_line = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 1, done.stdout[-3000:]
    assert last_line.startswith("ocm-fl-server: failed: ")
    assert "finished:failed" in last_line and "minimum is 2" in last_line
    assert ModelStore(fed.root / "model-2").final() is None


# --- differential privacy and secure aggregation through the real path (docs/privacy.md) ---
PRIVATE = ("p1", "p2")
# p2's data requires central DP with at least this noise, clipped to at most this norm, and
# secure aggregation.
P2_REQUIREMENT = "central-dp,clip=5,noise=0.5,secagg"
SECAGG = {"reconstructionThreshold": 2}
CENTRAL = {"mode": "central", "clippingNorm": 5.0, "noiseMultiplier": 0.5, "delta": 1e-5}


@pytest.fixture(scope="module")
def private_fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    """Two clusters whose clients enforce privacy in their ClientApp workers (--privacy):
    p1 only what the server asks, p2 also its own requirement."""
    from ocmfl.privacy import ClientPrivacy, client_privacy, parse_requirement

    f = new_federation(tmp_path_factory.mktemp("private"), PRIVATE, PRIVATE, split="iid")
    enforced = {
        "p1": ClientPrivacy("p1"),
        "p2": client_privacy("p2", None, parse_requirement(P2_REQUIREMENT)),
    }
    try:
        for name in PRIVATE:
            cmd = f.client_cmd(name, name, 300, "--privacy", enforced[name].to_json())
            f.clients[name] = _spawn(cmd, f.root / f"{name}.log")
        yield f
    finally:
        for proc in f.clients.values():
            _kill_group(proc, signal.SIGTERM)


def test_central_dp_with_secure_aggregation_runs_through_the_workers_and_reports_the_privacy(
    private_fed: Federation,
) -> None:
    """Central DP and SecAgg+ together, as p2 requires: every round is a SecAgg+ round between
    the two workers (their updates clipped, then masked), the noise goes on the unmasked
    aggregate, and the privacy spent is the accountant's."""
    from ocmfl.privacy import DpSettings
    from workloads.sdk.privacy import spent

    result = private_fed.root / "central.json"
    done = _run(private_fed.server_cmd(private_fed.root / "model-central", 2, "--privacy",
                                       json.dumps(CENTRAL), "--secure-aggregation",
                                       json.dumps(SECAGG), "--result-file", str(result)),
                timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    summed = [ln for ln in done.stdout.splitlines() if "SecAgg+ round: 2 masked updates" in ln]
    assert len(summed) == 2, done.stdout[-3000:]  # one per round, both clusters in each
    outcome = json.loads(result.read_text())
    expected = spent(DpSettings.from_spec(CENTRAL), 2)
    assert outcome["privacy"]["epsilon"] == pytest.approx(expected["epsilon"])
    assert outcome["privacy"]["rounds"] == 2
    # Each worker clipped its replies to the server's norm (its privacy mod logs each one).
    for name in PRIVATE:
        log = (private_fed.root / f"{name}.log").read_text()
        assert f"ocm-fl privacy: cluster {name}: train reply clipped to norm 5" in log, log[-3000:]
    checkpoints = json.loads((private_fed.root / "model-central" / "manifest.json").read_text())
    assert [c["metrics"]["privacy"]["rounds"] for c in checkpoints["checkpoints"]] == [1, 2]


def test_a_server_without_the_dp_a_cluster_requires_fails_naming_that_cluster(
    private_fed: Federation,
) -> None:
    """The tenant's server runs no DP: p2's worker refuses the train message before its app
    sees it, and the run fails with p2's requirement, though p1 alone would meet the minimum."""
    done = _run(private_fed.server_cmd(private_fed.root / "model-plain", 2, "--min-clients", "1"),
                timeout=600)  # fmt: skip
    last_line = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 1, done.stdout[-3000:]
    assert "PrivacyRequirementError" in last_line and "cluster p2 requires central DP" in last_line
    assert "secure aggregation" in last_line
    assert ModelStore(private_fed.root / "model-plain").final() is None
