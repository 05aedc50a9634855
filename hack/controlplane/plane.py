"""Bring the local control plane up and down; report what runs (TEST INFRASTRUCTURE harness).

Real components: one etcd, a hub kube-apiserver and one kube-apiserver per managed cluster (all
on that etcd, distinct --etcd-prefix), a kube-controller-manager per apiserver, OCM's
registration controller, placement controller and addon manager on the hub, and on every
managed cluster OCM's registration agent (started from a bootstrap kubeconfig, accepted as
`clusteradm accept` does) and work agent (with the hub kubeconfig its registration agent got).
Stand-in: the supervisor's local nodes (kubelet), unless `kubelet=True`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hack.controlplane import (
    bootstrap,
    build,
    certs,
    clusteradm,
    kubelet_host,
    kubelet_spec,
    podnet,
    processes,
)
from hack.controlplane import kubelet as kubelet_node
from hack.controlplane.localnode import CREATED_MOUNTPOINTS
from hack.controlplane.processes import ComponentFailed, Proc, State
from hack.controlplane.supervisor import READY_FILE
from ocmfl.constants import HUB_NAMESPACE
from ocmfl.kube import Kube

AGENT_NAMESPACE = bootstrap.AGENT_NAMESPACE
# The PV binder binds pre-bound claims (client data volumes: a hostPath PV named by the claim);
# the protection controllers lift the pvc/pv-protection finalizers admission adds, without
# which a deleted claim, PV or client namespace would wait forever.
KCM_CONTROLLERS = (
    "namespace-controller,garbage-collector-controller,job-controller,"
    "deployment-controller,replicaset-controller,serviceaccount-controller,"
    "root-ca-certificate-publisher-controller,ttl-after-finished-controller,"
    "persistentvolume-binder-controller,persistentvolume-protection-controller,"
    "persistentvolumeclaim-protection-controller,"
    # Client namespaces carry a ResourceQuota (hub_controller.operator.desired.limits): a real
    # cluster counts its use; admission refuses pods under a quota not counted yet.
    "resourcequota-controller,"
    # Type-checks ValidatingAdmissionPolicies (the chart's) into their status, as on a real hub.
    "validatingadmissionpolicy-status-controller"
)


@dataclass(frozen=True)
class ControlPlane:
    """What a test or the demo needs to talk to a running plane."""

    hub_kubeconfig: str
    cluster_kubeconfigs: dict[str, str]  # cluster name -> admin kubeconfig of its apiserver
    # cluster name -> the hub kubeconfig its registration agent got (the klusterlet's identity,
    # also the work agent's; what root on that cluster holds)
    hub_access: dict[str, str]
    clusters: list[str]  # ["cluster1", "cluster2", ...]
    state_dir: str
    slot: int = 0  # address slot: podnet gives this plane's pod, Service and host addresses

    @classmethod
    def from_state(cls, state: State) -> ControlPlane:
        return cls(
            state.kubeconfigs["hub"],
            {c: state.kubeconfigs[c] for c in state.clusters},
            dict(state.hub_access),
            list(state.clusters),
            state.dir,
            state.slot,
        )

    def host_address(self, n: int) -> str:
        """The n-th address on the host that every pod of this plane reaches (podnet)."""
        return podnet.host_address(self.slot, n)


class PlaneError(RuntimeError):
    """The plane cannot be brought up (or reused) as asked."""


MAX_CLUSTERS = podnet.NODES - 1
SLOTS = podnet.SLOTS
SLOTS_FILE = Path("/dev/shm/ocm-fl-cp-slots.json")


def _slot_table(update: Callable[[dict[str, int]], int | None]) -> int | None:
    """Read-modify-write the shared slot table under an flock; drop planes that are gone."""
    lock = SLOTS_FILE.with_suffix(".lock")
    with lock.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            table = json.loads(SLOTS_FILE.read_text())
        except (OSError, ValueError):
            table = {}
        table = {k: int(v) for k, v in table.items() if (Path(k) / processes.STATE_FILE).exists()}
        out = update(table)
        SLOTS_FILE.write_text(json.dumps(table))
        return out


def claim_slot(d: Path) -> int:
    """An address slot (podnet) no other running plane on this machine uses."""

    def take(table: dict[str, int]) -> int:
        key = str(d.resolve())
        if key not in table:
            used = set(table.values())
            # Planes started before slots existed (or not registered) record none: slot 0.
            for other in Path("/dev/shm").glob(f"*/{processes.STATE_FILE}"):
                if str(other.parent.resolve()) != key:
                    with contextlib.suppress(OSError, ValueError):
                        used.add(int(json.loads(other.read_text()).get("slot", 0)))
            free = sorted(set(range(SLOTS)) - used)
            if not free:
                raise PlaneError(f"{SLOTS} control planes already run on this machine")
            table[key] = free[0]
        return table[key]

    got = _slot_table(take)
    assert got is not None
    return got


def release_slot(d: Path) -> None:
    _slot_table(lambda table: table.pop(str(d.resolve()), None))


def cluster_names(n: int) -> list[str]:
    return [f"cluster{i}" for i in range(1, n + 1)]


@contextlib.contextmanager
def _locked(d: Path) -> Iterator[None]:
    """Serialise up/down across processes sharing a state dir."""
    lock = Path(str(d) + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def etcd_data_dir(d: Path) -> Path:
    """etcd data lives on /dev/shm: inside the state dir when that is there, else beside it."""
    if str(d.resolve()).startswith("/dev/shm/"):
        return d / "etcd-data"
    return Path("/dev/shm") / f"ocm-fl-etcd-{hashlib.sha256(str(d).encode()).hexdigest()[:8]}"


def healthy(state: State) -> bool:
    """Every recorded process alive and the hub apiserver ready."""
    if not all(processes.alive(p.pid) for p in state.procs):
        return False
    if not (Path(state.dir) / READY_FILE).exists():
        return False
    pki = Path(state.dir) / "pki"
    ctx = processes.client_tls(pki / "ca.crt", pki / "admin.crt", pki / "admin.key")
    return processes.http_ok(state.apiservers["hub"] + "/readyz", ctx)


def up(
    clusters: int = 2,
    state_dir: Path | None = None,
    echo: bool = False,
    timeout: float = 120.0,
    ocm: bool = True,
    kubelet: bool = False,
) -> State:
    """Start the plane (or reuse a healthy one with the same clusters); return its state.

    `ocm=False` leaves out the OCM controllers and agents (Kubernetes + local nodes only, no
    ManagedClusters); `kubelet=True` gives every apiserver a real kubelet + containerd node
    (kubelet.py).
    """
    d = state_dir or processes.state_dir()
    return _up(clusters, d, echo, timeout, ocm, user=None, kubelet=kubelet)


@contextlib.contextmanager
def session(
    clusters: int = 2,
    state_dir: Path | None = None,
    ocm: bool = True,
    kubelet: bool = False,
) -> Iterator[State]:
    """Use the plane for the life of the context (e.g. a pytest session).

    Starts it or reuses a running one, and registers this process as a user. On exit, a plane
    that some session started (not `up` from the CLI) is stopped once no live user remains.
    """
    d = state_dir or processes.state_dir()
    state = _up(clusters, d, False, 120.0, ocm, os.getpid(), kubelet)
    try:
        yield state
    finally:
        with _locked(d):
            (d / "users" / str(os.getpid())).unlink(missing_ok=True)
            current = State.load(d)
            if current is not None and current.auto_stop and not live_users(d):
                _down_locked(d)


def live_users(d: Path) -> list[int]:
    """Processes registered as users of the plane in `d` that are still alive."""
    users = d / "users"
    if not users.is_dir():
        return []
    return [
        int(f.name) for f in users.iterdir() if f.name.isdigit() and processes.alive(int(f.name))
    ]


def _up(
    clusters: int,
    d: Path,
    echo: bool,
    timeout: float,
    ocm: bool,
    user: int | None,
    kubelet: bool = False,
) -> State:
    if not 1 <= clusters <= MAX_CLUSTERS:
        raise PlaneError(f"--clusters must be 1..{MAX_CLUSTERS}")
    with _locked(d):
        state = _reuse_or_start(clusters, d, echo, timeout, ocm, user is not None, kubelet)
        if user is None and state.auto_stop:  # `up` by hand: keep it running after tests
            state.auto_stop = False
            state.save()
        if user is not None:
            (d / "users").mkdir(exist_ok=True)
            (d / "users" / str(user)).touch()
        return state


def _reuse_or_start(
    clusters: int,
    d: Path,
    echo: bool,
    timeout: float,
    ocm: bool,
    auto_stop: bool,
    kubelet: bool = False,
) -> State:
    existing = State.load(d)
    if existing is not None:
        if healthy(existing):
            if (
                existing.clusters == cluster_names(clusters)
                and existing.ocm == ocm
                and existing.kubelet == kubelet
            ):
                return existing
            raise PlaneError(
                f"a plane with clusters {existing.clusters} (ocm={existing.ocm}) already "
                f"runs in {d}; run `python -m hack.controlplane down` or use another "
                "OCMFL_CP_DIR"
            )
        _down_locked(d)
    missing = build.missing_binaries()
    if not ocm:
        missing = [m for m in missing if m in ("etcd", "kube-apiserver", "kube-controller-manager")]
    if missing:
        if echo:
            print(f"building missing binaries {missing}", flush=True)
        build.build_all(echo=echo)
    try:
        state = _start(d, cluster_names(clusters), echo, timeout, ocm, kubelet)
    except BaseException:
        _down_locked(d)
        raise
    state.auto_stop = auto_stop
    state.save()
    return state


def _say(echo: bool, msg: str) -> None:
    if echo:
        print(msg, flush=True)


def _start(
    d: Path,
    clusters: list[str],
    echo: bool,
    timeout: float,
    ocm: bool,
    kubelet: bool = False,
) -> State:
    t0 = time.monotonic()
    for sub in ("logs", "pods"):
        shutil.rmtree(d / sub, ignore_errors=True)
    d.mkdir(parents=True, exist_ok=True)
    (d / "logs").mkdir()
    logs, pki, kcfg = d / "logs", d / "pki", d / "kubeconfig"
    kcfg.mkdir(exist_ok=True)
    names = ["hub", *clusters]
    state = State(
        dir=str(d),
        clusters=clusters,
        etcd_data=str(etcd_data_dir(d)),
        started_at=time.time(),
        ocm=ocm,
        addon_manager=ocm,
        kubelet=kubelet,
    )
    state.save()
    state.slot = claim_slot(d)
    state.save()
    # The slot is ours now: pod networks a crashed plane left in it go.
    for what in podnet.sweep(state.slot):
        _say(echo, f"removed leftover {what}")

    # --- certificates -------------------------------------------------------------------------
    ca = certs.make_ca()
    ca_crt, ca_key = certs.write(ca, pki, "ca")
    admin = certs.issue(ca, "ocmfl-admin", orgs=("system:masters",), client=True)
    certs.write(admin, pki, "admin")
    # Front-proxy identity: with a requestheader CA configured, the library-go servers of the
    # OCM controllers find a complete extension-apiserver-authentication ConfigMap.
    proxy_crt, proxy_key = certs.write(
        certs.issue(ca, "front-proxy-client", client=True), pki, "front-proxy-client"
    )
    sa_key, sa_pub = certs.make_signing_key()
    (pki / "sa.key").write_bytes(sa_key)
    (pki / "sa.pub").write_bytes(sa_pub)

    # Pods reach their apiserver at its `kubernetes` ClusterIP (local nodes: see localnode;
    # kubelet nodes and their pods also at non-loopback node addresses).
    if kubelet:
        in_cluster = tuple(kubelet_spec.apiserver_ips(state.slot, len(names)))
    else:
        in_cluster = tuple(podnet.kubernetes_service_ip(state.slot, i) for i in range(len(names)))
    serving = certs.issue(
        ca,
        "kube-apiserver",
        server=True,
        ip_addresses=("127.0.0.1", *in_cluster),
        dns_names=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
    )
    srv_crt, srv_key = certs.write(serving, pki, "apiserver")

    def track(p: Proc) -> Proc:
        state.procs.append(p)
        state.save()
        return p

    # --- etcd -----------------------------------------------------------------------------------
    shutil.rmtree(state.etcd_data, ignore_errors=True)
    ep, pp = processes.free_port(), processes.free_port()
    etcd = track(
        processes.spawn(
            "etcd",
            [
                str(build.binary("etcd")),
                "--name=default",
                f"--data-dir={state.etcd_data}",
                f"--listen-client-urls=http://127.0.0.1:{ep}",
                f"--advertise-client-urls=http://127.0.0.1:{ep}",
                f"--listen-peer-urls=http://127.0.0.1:{pp}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{pp}",
                f"--initial-cluster=default=http://127.0.0.1:{pp}",
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--quota-backend-bytes=4294967296",
            ],
            logs / "etcd.log",
        )
    )
    etcd.port = ep
    processes.wait_until(etcd, lambda: processes.http_ok(f"http://127.0.0.1:{ep}/health"), 30)
    _say(echo, f"etcd ready on :{ep} ({time.monotonic() - t0:.1f}s)")

    # --- apiservers -----------------------------------------------------------------------------

    apis: dict[str, Proc] = {}
    for i, n in enumerate(names):
        port = processes.free_port()
        p = track(
            processes.spawn(
                f"kube-apiserver-{n}",
                [
                    str(build.binary("kube-apiserver")),
                    f"--etcd-servers=http://127.0.0.1:{ep}",
                    f"--etcd-prefix=/{n}/registry",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={port}",
                    "--advertise-address=127.0.0.1",
                    f"--tls-cert-file={srv_crt}",
                    f"--tls-private-key-file={srv_key}",
                    f"--client-ca-file={ca_crt}",
                    "--authorization-mode=RBAC",
                    f"--service-cluster-ip-range={podnet.service_cidr(state.slot, i)}",
                    "--allow-privileged=true",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    f"--service-account-key-file={pki / 'sa.pub'}",
                    f"--service-account-signing-key-file={pki / 'sa.key'}",
                    # A real kubelet mounts the token volume ServiceAccount admission adds.
                    f"--disable-admission-plugins={'' if kubelet else 'ServiceAccount'}",
                    "--endpoint-reconciler-type=none",
                    "--enable-priority-and-fairness=false",
                    "--profiling=false",
                    f"--cert-dir={d / 'certs' / n}",
                    f"--requestheader-client-ca-file={ca_crt}",
                    "--requestheader-allowed-names=front-proxy-client",
                    "--requestheader-username-headers=X-Remote-User",
                    "--requestheader-group-headers=X-Remote-Group",
                    "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                    f"--proxy-client-cert-file={proxy_crt}",
                    f"--proxy-client-key-file={proxy_key}",
                    *(["--kubelet-preferred-address-types=InternalIP"] if kubelet else []),
                ],
                logs / f"kube-apiserver-{n}.log",
            )
        )
        p.port = port
        apis[n] = p
        state.apiservers[n] = f"https://127.0.0.1:{port}"
        path = kcfg / f"{n}.kubeconfig"
        certs.write_kubeconfig(path, state.apiservers[n], ca.cert_pem, admin, "ocmfl-admin")
        state.kubeconfigs[n] = str(path)
    state.save()
    admin_ctx = processes.client_tls(ca_crt, pki / "admin.crt", pki / "admin.key")
    for n, p in apis.items():
        url = state.apiservers[n] + "/readyz"
        processes.wait_until(p, lambda u=url: processes.http_ok(u, admin_ctx), timeout)  # type: ignore[misc]
    _say(echo, f"{len(apis)} apiservers ready ({time.monotonic() - t0:.1f}s)")

    # --- controller managers and OCM controllers ------------------------------------------------
    waits: list[tuple[Proc, str]] = []

    def serve(name: str, argv: Callable[[int], list[str]]) -> Proc:
        """Spawn a component whose argv (given its port) serves /healthz there over TLS."""
        port = processes.free_port()
        p = track(processes.spawn(name, argv(port), logs / f"{name}.log"))
        p.port = port
        waits.append((p, f"https://127.0.0.1:{port}/healthz"))
        return p

    def ocm_controller(
        binary: str, command: str, namespace: str, *flags: str
    ) -> Callable[[int], list[str]]:
        return lambda port: [
            str(build.binary(binary)),
            command,
            *flags,
            f"--listen=127.0.0.1:{port}",
            "--disable-leader-election",
            f"--namespace={namespace}",
        ]

    def kube_controller_manager(n: str, port: int) -> list[str]:
        kc = state.kubeconfigs[n]
        return [
            str(build.binary("kube-controller-manager")),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--controllers={KCM_CONTROLLERS}"
            + (",endpointslice-controller,node-lifecycle-controller" if kubelet else "")
            # The hub signs kubernetes.io/kube-apiserver-client CSRs, as a real hub does: the
            # registration agents' hub identities and the addons' KubeClient registrations.
            + (",certificatesigningrequest-signing-controller" if n == "hub" else ""),
            *(
                [f"--cluster-signing-cert-file={ca_crt}", f"--cluster-signing-key-file={ca_key}"]
                if n == "hub"
                else []
            ),
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={d / 'certs' / ('kcm-' + n)}",
            f"--root-ca-file={ca_crt}",
            "--use-service-account-credentials=false",
            "--profiling=false",
            # A pre-bound claim that came before its PV (a work applies both at once) is
            # bound at the binder's next periodic sync: 15 s by default, which a client pod
            # then waits out in ContainerCreating. Both live in the informer cache, so a
            # sync a second costs little here.
            "--pvclaimbinder-sync-period=1s",
            # The hub's default StorageClass (bootstrap.DEFAULT_STORAGE_CLASS) provisions with
            # Kubernetes' own in-tree hostPath provisioner: the PV controller makes a directory
            # under /tmp/hostpath_pv for each claim (single-node only, as the plane is).
            *(["--enable-hostpath-provisioner"] if n == "hub" else []),
        ]

    # The supervisor needs no CRDs: its start (a Python interpreter's imports) overlaps the
    # bootstrap below. The controller managers come after it, so their garbage collector
    # discovers the CRDs at start instead of at its next 30 s discovery resync.
    # --- supervisor: local nodes (or the kubelet nodes' host side) ----------------------------
    if kubelet:
        kubelet_host.create_bridge(state.slot)
    (d / READY_FILE).unlink(missing_ok=True)
    sup = track(
        processes.spawn(
            "supervisor",
            [
                sys.executable,
                "-m",
                "hack.controlplane",
                "supervise",
                f"--state-dir={d}",
            ],
            logs / "supervisor.log",
            env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
    )
    # --- CRDs, namespaces, bootstrap identity -----------------------------------------------------
    hub_crds, cluster_crds = build.crd_files(hub=True), build.crd_files(hub=False)
    kubes = {n: Kube(state.kubeconfigs[n]) for n in names}
    with ThreadPoolExecutor(len(names)) as pool:
        futs = [pool.submit(bootstrap.bootstrap_hub, kubes["hub"], hub_crds)]
        futs += [pool.submit(bootstrap.bootstrap_cluster, kubes[c], cluster_crds) for c in clusters]
        for f in futs:
            f.result()
    for k in kubes.values():
        k.close()
    _say(echo, f"CRDs and namespaces in place ({time.monotonic() - t0:.1f}s)")

    for n in names:
        serve(f"kube-controller-manager-{n}", functools.partial(kube_controller_manager, n))
    hub_kc = f"--kubeconfig={state.kubeconfigs['hub']}"
    if ocm:
        serve("registration", ocm_controller("registration", "controller", HUB_NAMESPACE, hub_kc))
        serve("placement", ocm_controller("placement", "controller", HUB_NAMESPACE, hub_kc))
        serve("addon-manager", ocm_controller("addon", "manager", HUB_NAMESPACE, hub_kc))
    state.save()

    insecure = processes.insecure_tls()
    for p, url in waits:
        processes.wait_until(
            p,
            functools.partial(processes.http_ok, url, insecure),
            timeout,
            "did not answer /healthz",
        )
    waits.clear()
    processes.wait_until(sup, lambda: (d / READY_FILE).exists(), timeout)
    registered_from = time.monotonic()
    if ocm:
        registered_from = _register_clusters(state, serve, echo, timeout)
    for p, url in waits:
        processes.wait_until(
            p,
            functools.partial(processes.http_ok, url, insecure),
            timeout,
            "did not answer /healthz",
        )
    if ocm:
        hub = Kube(state.kubeconfigs["hub"])
        try:
            for c in clusters:
                wait_joined(hub, state, c, timeout)
                # From its registration agent's start to Joined and Available.
                state.joined_seconds[c] = round(time.monotonic() - registered_from, 2)
        finally:
            hub.close()
        _say(echo, f"{len(clusters)} clusters joined ({time.monotonic() - t0:.1f}s)")
    if kubelet:
        kubelet_node.start_all(state, track, ca, echo=echo, timeout=timeout)
    state.startup_seconds = round(time.monotonic() - t0, 2)
    state.save()
    _say(echo, f"control plane up in {state.startup_seconds:.1f}s ({d / processes.STATE_FILE})")
    return state


def klusterlet_dir(d: Path, cluster: str) -> Path:
    """Where a cluster's registration agent keeps its bootstrap and hub kubeconfigs (its
    `--hub-kubeconfig-dir`: the files of the `hub-kubeconfig-secret` it writes, as a
    klusterlet pod has them mounted)."""
    return d / "klusterlet" / cluster


def hub_url_for_agents(state: State) -> str:
    """The hub apiserver as the clusters' agents and pods reach it: the hub's `kubernetes`
    Service address (local nodes) or the bridge address the supervisor forwards (kubelet
    nodes). It goes into the bootstrap kubeconfig, and OCM copies it into every hub kubeconfig
    it makes from there (the registration agent's, the addons')."""
    port = state.apiservers["hub"].rsplit(":", 1)[1]
    if state.kubelet:
        return f"https://{podnet.node_bridge_ip(state.slot)}:{port}"
    return f"https://{podnet.kubernetes_service_ip(state.slot, 0)}:443"


def log_errors(path: str | Path, most: int = 3) -> str:
    """The distinct errors (klog `err="..."`) an OCM component logged last, newest last; its
    last log line when there is none (for error messages)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        return f"(log {path} unreadable: {e})"
    errors = list(dict.fromkeys(re.findall(r'err="([^"]*)"', text)))
    if errors:
        return "; ".join(errors[-most:]) + f" (log {path})"
    lines = text.splitlines()
    return f"{lines[-1] if lines else '(empty log)'} (log {path})"


def _register_clusters(
    state: State,
    serve: Callable[[str, Callable[[int], list[str]]], Proc],
    echo: bool,
    timeout: float,
) -> float:
    """OCM registration, for real: a registration agent per cluster from a bootstrap
    kubeconfig (`clusteradm join`), the hub admin's `clusteradm accept`, then the cluster's
    work agent with the hub kubeconfig its registration agent got. Returns when the
    registration agents started (time.monotonic)."""
    d = Path(state.dir)
    config = bootstrap_kubeconfig(state)
    t0 = time.monotonic()
    agents = {
        c: start_registration_agent(state, c, bootstrap=config, serve=serve) for c in state.clusters
    }
    state.save()

    def accept(c: str) -> None:
        kube = Kube(state.kubeconfigs["hub"])
        try:
            clusteradm.accept(kube, c, timeout, why_not=lambda: log_errors(agents[c].log))
        finally:
            kube.close()

    with ThreadPoolExecutor(len(state.clusters)) as pool:
        list(pool.map(accept, state.clusters))
    _say(echo, f"clusters accepted ({time.monotonic() - t0:.1f}s after their agents started)")
    for c in state.clusters:
        hub_kubeconfig = klusterlet_dir(d, c) / "hub-kubeconfig" / "kubeconfig"
        processes.wait_until(
            agents[c],
            lambda f=hub_kubeconfig: f.is_file() and (f.parent / "tls.crt").is_file(),  # type: ignore[misc]
            timeout,
            "wrote no hub kubeconfig after `clusteradm accept`",
        )
        state.hub_access[c] = str(hub_kubeconfig)
        serve(
            f"work-agent-{c}",
            _ocm_agent(
                "work",
                f"--spoke-cluster-name={c}",
                f"--agent-id={c}",
                "--workload-source-driver=kube",
                f"--workload-source-config={hub_kubeconfig}",
                f"--spoke-kubeconfig={state.kubeconfigs[c]}",
                f"--kubeconfig={state.kubeconfigs[c]}",
                "--status-sync-interval=2s",
            ),
        )
    state.save()
    return t0


def start_registration_agent(
    state: State,
    cluster: str,
    *,
    bootstrap: str,
    spoke: str | None = None,
    hub_kubeconfig_secret: str = "hub-kubeconfig-secret",
    serve: Callable[[str, Callable[[int], list[str]]], Proc] | None = None,
) -> Proc:
    """Start OCM's registration agent for `cluster` from the bootstrap kubeconfig text
    `bootstrap` (`clusteradm join`), on the apiserver of `spoke` (default: the cluster's own),
    keeping its hub kubeconfig in `klusterlet_dir` and in the Secret `hub_kubeconfig_secret`
    (another name lets a second agent share a spoke: tests). Recorded in the plane's state."""
    d = Path(state.dir)
    kd = klusterlet_dir(d, cluster)
    kd.mkdir(parents=True, exist_ok=True)
    (kd / "bootstrap.kubeconfig").write_text(bootstrap)
    (kd / "bootstrap.kubeconfig").chmod(0o600)
    spoke_kc = state.kubeconfigs[spoke or cluster]
    argv = _ocm_agent(
        "registration",
        f"--cluster-name={cluster}",
        f"--bootstrap-kubeconfig={kd / 'bootstrap.kubeconfig'}",
        f"--hub-kubeconfig-dir={kd / 'hub-kubeconfig'}",
        f"--hub-kubeconfig-secret={hub_kubeconfig_secret}",
        f"--kubeconfig={spoke_kc}",
        f"--spoke-kubeconfig={spoke_kc}",
        "--cluster-healthcheck-period=10s",
    )
    name = f"registration-agent-{cluster}"
    if serve is not None:
        return serve(name, argv)
    port = processes.free_port()
    proc = processes.spawn(name, argv(port), Path(state.dir) / "logs" / f"{name}.log")
    proc.port = port
    state.procs.append(proc)
    state.save()
    return proc


def stop_component(state: State, name: str) -> None:
    """Stop one recorded process of the plane (e.g. a registration agent a test started) and
    forget it, so the plane stays healthy."""
    for proc in [p for p in state.procs if p.name == name]:
        processes.kill_group(proc.pid, grace=5.0)
        state.procs.remove(proc)
    state.save()


def bootstrap_kubeconfig(state: State) -> str:
    """A fresh bootstrap kubeconfig for a cluster joining this plane's hub."""
    hub = Kube(state.kubeconfigs["hub"])
    try:
        return clusteradm.bootstrap_kubeconfig(
            hub, hub_url_for_agents(state), (Path(state.dir) / "pki" / "ca.crt").read_bytes()
        )
    finally:
        hub.close()


def _ocm_agent(binary: str, *flags: str) -> Callable[[int], list[str]]:
    """argv (given its health port) of an OCM agent on a managed cluster."""
    return lambda port: [
        str(build.binary(binary)),
        "agent",
        *flags,
        f"--listen=127.0.0.1:{port}",
        "--disable-leader-election",
        f"--namespace={AGENT_NAMESPACE}",
    ]


JOINED = ("HubAcceptedManagedCluster", "ManagedClusterJoined", "ManagedClusterConditionAvailable")


def wait_joined(hub: Kube, state: State, cluster: str, timeout: float) -> None:
    """Until the registration agent has the cluster Joined and Available (its lease and its
    status), with a ComponentFailed naming the agent, its log and the conditions so far."""
    deadline = time.monotonic() + timeout
    agent = next(p for p in state.procs if p.name == f"registration-agent-{cluster}")
    conds: dict[str, str] = {}
    while time.monotonic() < deadline:
        mc = hub.get(f"{clusteradm.MANAGED_CLUSTERS}/{cluster}") or {}
        conds = {
            str(c.get("type")): str(c.get("status"))
            for c in (mc.get("status") or {}).get("conditions") or []
        }
        if all(conds.get(t) == "True" for t in JOINED):
            return
        if not processes.alive(agent.pid):
            break
        time.sleep(0.2)
    why = f"did not join {cluster} (conditions {conds})"
    raise ComponentFailed(agent.name, Path(agent.log), why)


def down(state_dir: Path | None = None) -> bool:
    """Stop everything recorded in the state dir; True if something was running."""
    d = state_dir or processes.state_dir()
    with _locked(d):
        return _down_locked(d)


def _down_locked(d: Path) -> bool:
    state = State.load(d)
    found = False
    if state is not None and state.kubelet:  # the nodes first: SIGKILL, all they left
        found = any(processes.alive(p.pid) for p in state.procs)
        kubelet_node.teardown(state.slot, state.clusters)
    # The local nodes' pods first, outright: nothing they keep survives `down`, and the
    # supervisor then finds no pod to wait for (a client pod's graceful stop took 2-3 s).
    pid_dir = d / "pod-pids"
    if pid_dir.is_dir():
        for f in pid_dir.iterdir():
            if f.name.isdigit():
                processes.kill_group(int(f.name), grace=0.0)
            f.unlink(missing_ok=True)
    if state is not None:
        found = found or any(processes.alive(p.pid) for p in state.procs)
        _stop_procs(state.procs)
        # Network namespaces (and whatever still runs in them), veths, bridges, local route.
        podnet.sweep(state.slot)
    created = CREATED_MOUNTPOINTS
    # Mount points are shared by every plane on the machine: removing one that another plane's
    # pod has mounted would detach that mount, so only the last plane running removes them.
    if created.exists() and not _other_planes(d):
        for line in sorted(set(created.read_text().splitlines()), key=len, reverse=True):
            made = Path(line)
            with contextlib.suppress(OSError):
                if made.is_dir() and not made.is_symlink():
                    made.rmdir()
                elif made.is_file() and made.stat().st_size == 0:
                    made.unlink()
        created.unlink()
    if state is not None and state.etcd_data:
        shutil.rmtree(state.etcd_data, ignore_errors=True)
    subs = ("pods", "pod-pids", "certs", "pki", "kubeconfig", "klusterlet", "etcd-data", "users")
    for sub in subs:
        shutil.rmtree(d / sub, ignore_errors=True)
    for fname in (processes.STATE_FILE, READY_FILE):
        (d / fname).unlink(missing_ok=True)
    release_slot(d)
    return found


def _stop_procs(procs: list[Proc]) -> None:
    """Stop a plane's processes, all at once. Only the supervisor shuts down gracefully: it
    stops its pods' processes and removes their network namespaces, which needs no apiserver.
    etcd, the apiservers and the controllers are killed outright: `down` deletes everything
    they keep, so their graceful shutdowns (about 2.7 s for an apiserver with watches open)
    would only delay it."""
    if procs:
        with ThreadPoolExecutor(len(procs)) as pool:
            graces = [10.0 if p.name == "supervisor" else 0.0 for p in procs]
            list(pool.map(lambda p, g: processes.kill_group(p.pid, grace=g), procs, graces))


def _other_planes(d: Path) -> list[Path]:
    """State dirs under /dev/shm (besides `d`) whose plane has a live process."""
    out = []
    for f in Path("/dev/shm").glob(f"*/{processes.STATE_FILE}"):
        if f.parent.resolve() == d.resolve():
            continue
        st = State.load(f.parent)
        if st is not None and any(processes.alive(p.pid) for p in st.procs):
            out.append(f.parent)
    return out


def status_report(state_dir: Path | None = None) -> tuple[bool, str]:
    """(running?, human-readable table of components, ports, RSS and kubeconfigs)."""
    d = state_dir or processes.state_dir()
    state = State.load(d)
    if state is None:
        return False, f"no control plane recorded in {d}"
    lines = [
        f"state dir {d}; clusters {', '.join(state.clusters)}; startup {state.startup_seconds:.1f}s"
    ]
    if state.joined_seconds:
        joined = ", ".join(f"{c} {s:.1f}s" for c, s in state.joined_seconds.items())
        lines.append(f"registration agent start -> Joined: {joined}")
    total = 0
    for p in state.procs:
        rss = processes.rss_bytes(p.pid) if processes.alive(p.pid) else 0
        total += rss
        lines.append(
            f"  {p.name:34} pid {p.pid:>7}  port {p.port:>5}  "
            f"{'running' if rss else 'DEAD':7}  {rss / 2**20:7.1f} MiB"
        )
    lines.append(f"  {'total RSS':34} {'':26} {total / 2**20:7.1f} MiB")
    for n, k in state.kubeconfigs.items():
        lines.append(f"  kubeconfig {n:10} {k}")
    ok = healthy(state)
    lines.append("healthy" if ok else "NOT healthy (run `down` then `up`)")
    return ok, "\n".join(lines)


def total_rss(state: State) -> dict[str, int]:
    """RSS in bytes per component (descendants included) of a running plane."""
    return {p.name: processes.rss_bytes(p.pid) for p in state.procs}


def kubeconfig_env(state: State) -> dict[str, str]:
    """Handy environment for shells: KUBECONFIG of the hub and each cluster."""
    env = {"KUBECONFIG": state.kubeconfigs["hub"]}
    env.update({f"KUBECONFIG_{c.upper()}": state.kubeconfigs[c] for c in state.clusters})
    return env


__all__ = [
    "ComponentFailed",
    "PlaneError",
    "State",
    "down",
    "kubeconfig_env",
    "status_report",
    "total_rss",
    "up",
]
