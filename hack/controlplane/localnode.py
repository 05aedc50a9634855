"""The local node: TEST INFRASTRUCTURE standing in for kubelet + container runtime.

One per apiserver, inside the supervisor. It registers a Ready Node, binds pending pods to it,
runs each container as a local process (see podplan for the image mapping) in a private mount
namespace and in its pod's own network namespace (podnet: a veth on the node's bridge, an
address from the node's pod range), reports pod status back, and acts as kube-proxy (ClusterIP
forwarding) and LoadBalancer controller (ingress IP = the Service's ClusterIP, forwarded to a
ready pod).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from hack.controlplane import podnet, podplan, podstate
from hack.controlplane.bootstrap import now
from hack.controlplane.forwarder import Forwarder
from hack.controlplane.podstate import Ctr, PodRun
from ocmfl.kube import Informer, Kube, KubeError, Obj

log = logging.getLogger(__name__)

NODE_LABEL = "ocmfl.local/test-infrastructure"
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# Mount points created on the host, shared by all planes; the last plane going down removes them.
CREATED_MOUNTPOINTS = Path("/dev/shm/ocm-fl-cp-mountpoints")
MAX_BACKOFF = 30.0  # seconds between restarts (kubelet: 10 s doubling to 5 min)
PULL_BACKOFF = 2.0  # seconds an image stays ErrImagePull before ImagePullBackOff
# Seconds between refreshes of a running pod's Secret/ConfigMap volumes (kubelet: its sync
# period, about a minute, plus its cache's TTL; shorter here so the drills stay short).
VOLUME_SYNC_S = 5.0
# What kube-scheduler writes on a pod whose nodeSelector no node matches (one node here).
UNSCHEDULABLE = (
    "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. "
    "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
)


def node_name(cluster: str) -> str:
    return f"ocmfl-local-{cluster}"


class LocalNode:
    """Kubelet stand-in for one apiserver (see module docstring)."""

    def __init__(
        self,
        cluster: str,
        slot: int,
        node: int,
        kube: Kube,
        apiserver_port: int,
        state_dir: Path,
        stop: threading.Event,
    ) -> None:
        self.cluster = cluster
        self.slot, self.node = slot, node
        self.host_ip = podnet.gateway(slot, node)  # the node's address, as pods see it
        self.addresses = podnet.PodAddresses(slot, node)
        self.kube = kube
        self.port = apiserver_port
        self.name = node_name(cluster)
        self.stop = stop
        self.root = state_dir / "pods" / cluster
        self.pid_dir = state_dir / "pod-pids"
        self.created_file = CREATED_MOUNTPOINTS
        self.ca_file = state_dir / "pki" / "ca.crt"
        self.state_dir = state_dir
        self.wake = threading.Event()
        self.pods = Informer(kube, "/api/v1/pods", self.wake, stop, f"pods-{cluster}")
        self.services = Informer(kube, "/api/v1/services", self.wake, stop, f"svc-{cluster}")
        self.runs: dict[str, PodRun] = {}
        self.tools = {t: shutil.which(t) or t for t in ("setpriv", "nsenter", "unshare")}
        self.forwarder: Forwarder | None = None
        self.thread = threading.Thread(target=self._loop, name=f"node-{cluster}", daemon=True)
        self.ready = threading.Event()

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        podnet.ensure_bridge(self.slot, self.node)
        self.register_node()
        self.forwarder = Forwarder(self.cluster)
        self.pods.start()
        self.services.start()
        self.thread.start()

    @property
    def labels(self) -> dict[str, str]:
        return {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            NODE_LABEL: "true",
        }

    def register_node(self) -> None:
        labels = self.labels
        self.kube.create(
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": self.name, "labels": labels},
                "spec": {"podCIDR": str(podnet.pod_cidr(self.slot, self.node))},
            },
        )
        self.kube.patch(
            f"/api/v1/nodes/{self.name}/status",
            {
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "ocm-fl local node (test infrastructure)",
                            "lastHeartbeatTime": now(),
                            "lastTransitionTime": now(),
                        }
                    ],
                    "addresses": [
                        {"type": "InternalIP", "address": self.host_ip},
                        {"type": "Hostname", "address": self.name},
                    ],
                    "capacity": {"cpu": "2", "memory": "8Gi", "pods": "250"},
                    "allocatable": {"cpu": "2", "memory": "8Gi", "pods": "250"},
                }
            },
        )

    def _loop(self) -> None:
        self.pods.synced.wait()
        self.services.synced.wait()
        self.ready.set()
        while not self.stop.is_set():
            self.wake.wait(0.5)
            self.wake.clear()
            try:
                self.reconcile()
            except Exception:
                log.exception("local node %s: reconcile failed", self.name)
        self.shutdown()

    def shutdown(self) -> None:
        """Kill every pod process (SIGTERM, then SIGKILL after 3 s)."""
        if self.forwarder is not None:
            self.forwarder.close()
        ctrs = [c for r in self.runs.values() for c in r.all() if c.running]
        for c in ctrs:
            self._signal(c, signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and any(c.popen and c.popen.poll() is None for c in ctrs):
            time.sleep(0.05)
        for c in ctrs:
            self._signal(c, signal.SIGKILL)
            if c.popen:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.popen.wait(2)
                self._forget_pid(c.popen.pid)
        for run in self.runs.values():
            self._teardown_net(run)

    # --- reconcile ---------------------------------------------------------------------------
    def reconcile(self) -> None:
        services = self.services.snapshot()
        pods = self.pods.snapshot()
        seen: set[str] = set()
        for pod in pods:
            meta, spec = pod["metadata"], pod.get("spec", {})
            deleting = bool(meta.get("deletionTimestamp"))
            if not spec.get("nodeName"):
                if not deleting:
                    self._schedule(pod)
                continue
            if spec["nodeName"] != self.name:
                continue
            uid = meta["uid"]
            seen.add(uid)
            run = self.runs.get(uid)
            if deleting:
                self._terminate(pod, run)
                continue
            if run is None:
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                run = self._new_run(pod)
            try:
                self._step(pod, run, services, pods)
            except Exception as e:  # one broken pod must not stall the others
                log.exception("pod %s/%s", run.ns, run.name)
                for c in run.all():
                    if not c.running and not c.done:
                        c.waiting, c.fatal = ("LocalNodeError", f"{type(e).__name__}: {e}"), True
                run.prepared = True
            self._report(pod, run)
        for uid in set(self.runs) - seen:
            run = self.runs[uid]
            for c in run.all():
                self._signal(c, signal.SIGKILL)
            self._drop(run)
        self._reconcile_services(services, pods)

    def _schedule(self, pod: Obj) -> None:
        """Bind the pod to this node, or, like kube-scheduler, mark it Unschedulable when its
        nodeSelector does not match the node (the only scheduling constraint checked here)."""
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        labels = self.labels
        if all(labels.get(k) == v for k, v in selector.items()):
            self._bind(pod)
            return
        conds = (pod.get("status") or {}).get("conditions") or []
        if any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds
        ):
            return
        meta = pod["metadata"]
        cond = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": UNSCHEDULABLE,
            "lastProbeTime": None,
            "lastTransitionTime": now(),
        }
        try:
            self.kube.patch(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                {"status": {"phase": "Pending", "conditions": [cond]}},
            )
        except KubeError as e:
            if e.status != 404:
                log.warning("unschedulable %s/%s: %s", meta["namespace"], meta["name"], e)

    def _bind(self, pod: Obj) -> None:
        meta = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.name},
        }
        try:
            self.kube.request(
                "POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding", body
            )
        except KubeError as e:
            if e.status not in (404, 409):
                log.warning("bind %s/%s: %s", meta["namespace"], meta["name"], e)

    def _new_run(self, pod: Obj) -> PodRun:
        meta, spec = pod["metadata"], pod["spec"]
        host_network = bool(spec.get("hostNetwork"))
        ip = self.host_ip if host_network else self.addresses.allocate()
        d = self.root / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        (d / "logs").mkdir(parents=True, exist_ok=True)

        def ctrs(key: str) -> list[Ctr]:
            return [
                Ctr(c["name"], c.get("image", ""), d / "logs" / f"{c['name']}.log")
                for c in spec.get(key) or []
            ]

        run = PodRun(
            meta["uid"],
            meta["namespace"],
            meta["name"],
            ip,
            d,
            ctrs("initContainers"),
            ctrs("containers"),
            spec.get("restartPolicy", "Always"),
            host_ip=self.host_ip,
            host_network=host_network,
        )
        self.runs[run.uid] = run
        log.info("pod %s/%s -> %s (%s)", run.ns, run.name, ip, d)
        return run

    # --- preparing containers ----------------------------------------------------------------
    def _lookup(self, kind: str, ns: str, name: str) -> dict[str, str] | None:
        plural = "configmaps" if kind == "configmap" else "secrets"
        obj = self.kube.get(f"/api/v1/namespaces/{ns}/{plural}/{name}")
        if obj is None:
            return None
        if kind == "secret":
            out = podplan.decode_secret(obj.get("data"))
            out.update(obj.get("stringData") or {})
            return out
        return {**(obj.get("data") or {}), **(obj.get("binaryData") or {})}

    def _claim(self, ns: str, name: str) -> tuple[Obj | None, Obj | None]:
        """A claim and the PersistentVolume it names (either None when absent)."""
        pvc = self.kube.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}")
        volume = ((pvc or {}).get("spec") or {}).get("volumeName")
        pv = self.kube.get(f"/api/v1/persistentvolumes/{volume}") if volume else None
        return pvc, pv

    def _token(self, ns: str, sa: str, audience: str | None, seconds: int) -> str | None:
        body: Obj = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": max(seconds, 600)},
        }
        if audience:
            body["spec"]["audiences"] = [audience]
        try:
            got = self.kube.request(
                "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", body
            )
        except KubeError:
            return None
        return str(got.get("status", {}).get("token") or "") or None

    def _ready_ip(self, svc: Obj, pods: list[Obj]) -> tuple[str, Obj] | None:
        sel = svc.get("spec", {}).get("selector")
        ns = svc["metadata"]["namespace"]
        cands = []
        for p in pods:
            run = self.runs.get(p["metadata"]["uid"])
            if (
                p["metadata"]["namespace"] == ns
                and run
                and run.ready
                and not p["metadata"].get("deletionTimestamp")
                and podplan.selects(sel, p["metadata"].get("labels"))
            ):
                cands.append(
                    (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"], run.ip, p)
                )
        if not cands:
            return None
        _, _, ip, pod = sorted(cands)[0]
        return ip, pod

    def _prepare(self, pod: Obj, run: PodRun, services: list[Obj], pods: list[Obj]) -> None:
        """Materialise volumes and plan every container; NotYet retries, NotRunnable sticks."""
        spec = pod["spec"]
        ns = run.ns
        if run.netns is None and not run.host_network:
            try:  # the pod sandbox: its own network namespace, like a CNI ADD
                run.netns = podnet.create_pod_net(self.slot, self.node, run.ip)
            except podnet.NetError as e:
                raise podplan.NotYet("FailedCreatePodSandBox", str(e)) from e
        svc_here = [s for s in services if s["metadata"]["namespace"] == ns]

        def resolve(svc: Obj) -> tuple[str, dict[str, int]] | None:
            got = self._ready_ip(svc, pods)
            return None if got is None else (got[0], podplan.target_ports(svc, got[1]))

        base = {
            "HOME": "/root",
            "HOSTNAME": run.name,
            "POD_IP": run.ip,
            "LANG": "C.UTF-8",
            # In-cluster clients reach the apiserver through its `kubernetes` Service.
            "KUBERNETES_SERVICE_HOST": podnet.kubernetes_service_ip(self.slot, self.node),
            "KUBERNETES_SERVICE_PORT": "443",
        }
        if spec.get("enableServiceLinks", True):
            base.update(podplan.service_env(svc_here, resolve))
        names: dict[str, str] = {}
        for s in services:
            sname, sns = s["metadata"]["name"], s["metadata"]["namespace"]
            # Names resolve to the ClusterIP (forwarded to a ready pod) like cluster DNS does;
            # headless services resolve to a ready pod itself.
            cip = s.get("spec", {}).get("clusterIP")
            if cip and cip != "None":
                addr = cip
            else:
                got = self._ready_ip(s, pods)
                if got is None:
                    continue
                addr = got[0]
            for suffix in ("", ".svc", ".svc.cluster.local"):
                names[f"{sname}.{sns}{suffix}"] = addr
            if sns == ns:
                names[sname] = addr
        (run.dir / "hosts").write_text(podplan.hosts_file_text(run.name, run.ip, names))
        volumes = podplan.materialise_volumes(
            pod, run.dir, self._lookup, run.ip, self.host_ip, self._token, self._claim
        )
        sa_dir = self._service_account_dir(pod, run)
        by_name = {c["name"]: c for c in (spec.get("initContainers") or []) + spec["containers"]}
        for ctr in run.all():
            c = by_name[ctr.name]
            try:
                local_images = podplan.read_local_images(self.state_dir)
                rt = podplan.resolve_image(c.get("image", ""), local_images)
                env = podplan.container_env(
                    pod, c, {**base, "PATH": rt.path}, self._lookup, run.ip, self.host_ip
                )
                argv = podplan.argv_for(c, rt, env)
                # The image's own files first, volumes on top (as a container runtime does).
                mounts = [*rt.mounts, *podplan.container_mounts(c, volumes)]
                if sa_dir and not any(m.target == SA_MOUNT for m in mounts):
                    mounts.append(podplan.Mount(str(sa_dir), SA_MOUNT, read_only=True))
                # Like kubelet: a per-container file at terminationMessagePath whose content
                # becomes state.terminated.message when the container exits.
                message_file = run.dir / f"termination-{ctr.name}"
                message_file.write_bytes(b"")
                ctr.message_file = message_file
                target = c.get("terminationMessagePath") or "/dev/termination-log"
                mounts.append(podplan.Mount(str(message_file), target))
            except podplan.NotRunnable as e:
                ctr.waiting, ctr.fatal = (e.reason, e.message), True
                ctr.next_start = time.monotonic() + PULL_BACKOFF
                continue
            ctr.plan = podplan.ContainerPlan(
                ctr.name, ctr.image, argv, env, mounts, c.get("workingDir") or "/"
            )
            ctr.waiting = ("ContainerCreating", "")
            for m in mounts:
                self._ensure_mountpoint(Path(m.source), Path(m.target))
        run.prepared = True

    def _service_account_dir(self, pod: Obj, run: PodRun) -> Path | None:
        """In-cluster credentials, as ServiceAccount admission + kubelet would mount them.

        Skipped when automountServiceAccountToken is false (pod or ServiceAccount); waits
        (NotYet) until the ServiceAccount exists, since the token comes from TokenRequest.
        """
        spec = pod["spec"]
        sa = spec.get("serviceAccountName") or "default"
        if spec.get("automountServiceAccountToken") is False:
            return None
        obj = self.kube.get(f"/api/v1/namespaces/{run.ns}/serviceaccounts/{sa}")
        if obj is None:
            raise podplan.NotYet("FailedMount", f"serviceaccount {run.ns}/{sa} not found")
        if (
            obj.get("automountServiceAccountToken") is False
            and spec.get("automountServiceAccountToken") is None
        ):
            return None
        token = self._token(run.ns, sa, None, 86400)
        if token is None:
            raise podplan.NotYet("FailedMount", f"no token for serviceaccount {run.ns}/{sa}")
        d = run.dir / "serviceaccount"
        d.mkdir(parents=True, exist_ok=True)
        (d / "token").write_text(token)
        (d / "namespace").write_text(run.ns)
        shutil.copyfile(self.ca_file, d / "ca.crt")
        return d

    def _ensure_mountpoint(self, source: Path, target: Path) -> None:
        """Create a missing mount target (recorded so `down` can remove it)."""
        if target.exists():
            return
        missing = []
        p = target
        while not p.exists():
            missing.append(p)
            p = p.parent
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
        with self.created_file.open("a") as fh:
            fh.writelines(f"{m}\n" for m in missing)

    # --- running -----------------------------------------------------------------------------
    def _step(self, pod: Obj, run: PodRun, services: list[Obj], pods: list[Obj]) -> None:
        if not run.prepared:
            if time.monotonic() < run.next_prepare:
                return
            try:
                self._prepare(pod, run, services, pods)
            except podplan.NotYet as e:
                for c in run.all():
                    c.waiting = ("ContainerCreating", f"{e.reason}: {e.message}")
                run.next_prepare = time.monotonic() + 1.0
                return
            except podplan.NotRunnable as e:
                for c in run.all():
                    c.waiting, c.fatal = (e.reason, e.message), True
                run.prepared = True
                return
            except OSError as e:  # e.g. a mountPath that cannot be created
                for c in run.all():
                    c.waiting, c.fatal = ("CreateContainerError", str(e)), True
                run.prepared = True
                return
        live = any(c.running for c in run.all())
        if live and time.monotonic() >= run.next_volume_sync and not run.deleting:
            # As the kubelet's periodic volume sync: a Secret changed after the pod started
            # (e.g. SuperNode keys of clusters that joined a running federation) reaches it.
            first = not run.next_volume_sync  # the pass that just prepared it: files are new
            run.next_volume_sync = time.monotonic() + VOLUME_SYNC_S
            try:
                changed = [] if first else podplan.refresh_volumes(pod, run.dir, self._lookup)
            except Exception as e:  # the pod keeps its last files (as with a kubelet)
                log.warning("pod %s/%s: volume refresh failed: %s", run.ns, run.name, e)
                changed = []
            if changed:
                log.info("pod %s/%s: volumes %s updated", run.ns, run.name, changed)
        for c in run.all():
            self._poll(run, c)
            pulling = c.fatal and c.waiting and c.waiting[0] == podplan.ERR_IMAGE_PULL
            if pulling and time.monotonic() >= c.next_start:  # kubelet backs off a failed pull
                c.waiting = (podplan.IMAGE_PULL_BACKOFF, f'Back-off pulling image "{c.image}"')
        if run.netns is not None and podstate.pod_phase(run) in ("Succeeded", "Failed"):
            self._teardown_net(run)  # as kubelet stops a finished pod's sandbox
            return
        if not run.init_done:
            for c in run.init:
                if c.done and c.terminated and c.terminated["exitCode"] == 0:
                    continue
                if not c.running and not c.done:
                    self._maybe_start(run, c)
                break
            return
        for c in run.main:
            if not c.running and not c.done:
                self._maybe_start(run, c)

    def _poll(self, run: PodRun, c: Ctr) -> None:
        if c.popen is None or (c.popen.returncode is not None and c.terminated is not None):
            return
        rc = c.popen.poll()
        if rc is None:
            return
        self._forget_pid(c.popen.pid)
        code, reason = podstate.exit_info(rc)
        c.terminated = {
            "exitCode": code,
            "reason": reason,
            "startedAt": c.started_at,
            "finishedAt": now(),
            "containerID": f"local://{c.popen.pid}",
        }
        if c.message_file is not None:
            with contextlib.suppress(OSError):
                message = c.message_file.read_bytes()[:4096].decode(errors="replace")
                if message:
                    c.terminated["message"] = message
        policy = run.restart_policy
        is_init = c in run.init
        restart = not run.deleting and (
            policy == "Always"
            or (policy == "OnFailure" and code != 0)
            or (is_init and policy != "Never" and code != 0)
        )
        if restart:
            delay = min(MAX_BACKOFF, 1.0 * 2 ** min(c.restart_count, 6))
            c.next_start = time.monotonic() + delay
            c.waiting = (
                "CrashLoopBackOff" if code != 0 else "Restarting",
                f"back-off {delay:.0f}s restarting container {c.name}",
            )
        else:
            c.done = True
        log.info(
            "pod %s/%s container %s exited %d (%s)",
            run.ns,
            run.name,
            c.name,
            code,
            "restart" if restart else "done",
        )

    def _maybe_start(self, run: PodRun, c: Ctr) -> None:
        if c.plan is None or c.fatal or time.monotonic() < c.next_start:
            return
        if c.terminated is not None:
            c.last_state = {"terminated": c.terminated}
            c.terminated = None
            c.restart_count += 1
        netns = None if run.netns is None else str(podnet.netns_path(run.netns))
        argv = podplan.launcher_argv(c.plan, str(run.dir / "hosts"), netns)
        head = argv.index("/bin/sh")  # the tools before the container's shell: full paths
        argv[:head] = [self.tools.get(a, a) for a in argv[:head]]
        with c.log.open("ab") as fh:
            try:
                c.popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    env=c.plan.env,
                    cwd="/",
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as e:
                c.waiting, c.fatal = ("RunContainerError", str(e)), True
                return
        (self.pid_dir / str(c.popen.pid)).touch()
        c.started_at = now()
        c.waiting = None

    def _signal(self, c: Ctr, sig: int) -> None:
        if c.popen is not None and c.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.popen.pid, sig)

    def _teardown_net(self, run: PodRun) -> None:
        """Kill whatever still runs in the pod's network namespace and remove it."""
        if run.netns is None:
            return
        try:
            podnet.delete_pod_net(run.netns)
        except podnet.NetError:
            log.exception("pod %s/%s: removing netns %s", run.ns, run.name, run.netns)
        run.netns = None

    def _forget_pid(self, pid: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.pid_dir / str(pid)).unlink()

    def _terminate(self, pod: Obj, run: PodRun | None) -> None:
        """Graceful deletion: SIGTERM, SIGKILL after the grace period, then remove the pod."""
        if run is not None:
            run.deleting = True
            live = [c for c in run.all() if c.popen is not None and c.popen.poll() is None]
            if live:
                if run.kill_deadline is None:
                    grace = pod["metadata"].get("deletionGracePeriodSeconds")
                    if grace is None:
                        grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
                    run.kill_deadline = time.monotonic() + float(grace)
                    for c in live:
                        self._signal(c, signal.SIGTERM)
                if time.monotonic() < run.kill_deadline:
                    return
                for c in live:
                    self._signal(c, signal.SIGKILL)
                    if c.popen:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            c.popen.wait(2)
            for c in run.all():
                self._poll(run, c)
            # Like kubelet: the sandbox (what still runs in the pod's network namespace, the
            # namespace, its veth) goes before the pod object, so a deleted pod has no network.
            self._teardown_net(run)
        meta = pod["metadata"]
        try:
            self.kube.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                body={
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": meta["uid"]},
                },
            )
        except KubeError as e:
            if e.status != 409:
                raise
        if run is not None:
            self._drop(run)

    def _drop(self, run: PodRun) -> None:
        self.runs.pop(run.uid, None)
        for c in run.all():
            if c.popen is not None:
                self._forget_pid(c.popen.pid)
        self._teardown_net(run)
        if not run.host_network:
            self.addresses.release(run.ip)
        # Keep the pod directory (logs) until the plane goes down; volumes may be large, though.
        shutil.rmtree(run.dir / "volumes", ignore_errors=True)

    # --- status ------------------------------------------------------------------------------

    def _report(self, pod: Obj, run: PodRun) -> None:
        status = podstate.pod_status(run)
        if status == run.last_status:
            return
        meta = pod["metadata"]
        try:
            self.kube.patch(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                {"status": status},
            )
            run.last_status = status
        except KubeError as e:
            if e.status != 404:
                log.warning("status %s/%s: %s", meta["namespace"], meta["name"], e)

    # --- Services: forwarding and LoadBalancer status -----------------------------------------
    def _reconcile_services(self, services: list[Obj], pods: list[Obj]) -> None:
        routes: dict[tuple[str, int], tuple[str, int]] = {}
        for svc in services:
            spec = svc.get("spec", {})
            cip = spec.get("clusterIP")
            meta = svc["metadata"]
            if (meta["namespace"], meta["name"]) == ("default", "kubernetes") and cip:
                # The apiserver's own Service (no endpoints here: --endpoint-reconciler=none).
                for p in spec.get("ports") or []:
                    routes[(cip, int(p["port"]))] = ("127.0.0.1", self.port)
                continue
            got = self._ready_ip(svc, pods)
            if got is not None and cip and cip != "None":
                ip, pod = got
                targets = podplan.target_ports(svc, pod)
                for p in spec.get("ports") or []:
                    if p.get("protocol", "TCP") != "TCP" or str(p["port"]) not in targets:
                        continue
                    routes[(cip, int(p["port"]))] = (ip, targets[str(p["port"])])
            if spec.get("type") == "LoadBalancer":
                # Like a cloud or MetalLB load balancer: the address exists as soon as the
                # Service does (here its ClusterIP, which every pod of every cluster and the
                # host reach), whether or not a backend is ready yet; connections reach a
                # ready pod through the forwarder routes above.
                self._set_lb(svc, cip if cip and cip != "None" else None)
        if self.forwarder is not None:
            self.forwarder.sync(routes)

    def _set_lb(self, svc: Obj, ip: str | None) -> None:
        want: Obj = {"ingress": [{"ip": ip, "ipMode": "VIP"}]} if ip else {}
        have = svc.get("status", {}).get("loadBalancer") or {}
        if have == want:
            return
        meta = svc["metadata"]
        try:
            self.kube.patch(
                f"/api/v1/namespaces/{meta['namespace']}/services/{meta['name']}/status",
                {"status": {"loadBalancer": want or {"ingress": None}}},
            )
        except KubeError as e:
            log.warning("lb %s/%s: %s", meta["namespace"], meta["name"], e)
