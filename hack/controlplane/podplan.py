"""Pure part of the local node (TEST INFRASTRUCTURE): pod spec -> what to run, with which env.

No kubelet or container runtime exists here. The local node maps a few known images to local
programs, materialises volumes into per-pod directories and runs each container as a process in
a private mount namespace so that every volumeMount appears at its real mountPath.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ocmfl.constants import ADDON_IMAGE, APPS_DIR, WORKLOAD_IMAGE

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = REPO_ROOT / ".venv" / "bin"
# The project's images carry examples/apps at APPS_DIR; so do the local pods (a bind mount).
PROJECT_APPS = REPO_ROOT / "examples" / "apps"
# Test-only images, in the plane's state dir: {"image ref": {"apps": "/host/dir"}}, each a
# project image whose APPS_DIR holds the given directory (a user's image with their app).
LOCAL_IMAGES_FILE = "local-images.json"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

Obj = dict[str, Any]
# (kind "configmap" | "secret", namespace, name) -> data (secret values already decoded) or None
Lookup = Callable[[str, str, str], dict[str, str] | None]


# Kubelet's container waiting reasons for an image it cannot get: the first failed pull, then
# the back-off between pulls. The local node's "registry" is the mapping in resolve_image.
ERR_IMAGE_PULL = "ErrImagePull"
IMAGE_PULL_BACKOFF = "ImagePullBackOff"


class NotRunnable(Exception):
    """The container can never run here (unknown image, no command): a terminal waiting state."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class NotYet(Exception):
    """A dependency (ConfigMap, Secret, token) is missing; retry later, like ContainerCreating."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Mount:
    """A bind mount inside the container's private mount namespace."""

    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class Runtime:
    """How an image runs locally: PATH to use, the default command when none is given, and
    read-only bind mounts standing in for the image's own files."""

    path: str
    default_command: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()


def _repository(image: str) -> str:
    """Image reference without tag or digest."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    return name


PROJECT_REPOS = {_repository(WORKLOAD_IMAGE), _repository(ADDON_IMAGE)}


def resolve_image(
    image: str, local_images: Mapping[str, Mapping[str, str]] | None = None
) -> Runtime:
    """Map an image to a local runtime; raise NotRunnable for anything else.

    `local_images` are the test-only images (LOCAL_IMAGES_FILE).
    """
    repo = _repository(image)
    local = (local_images or {}).get(image)
    if repo in PROJECT_REPOS or local is not None:
        if not (VENV_BIN / "python").exists():
            raise NotRunnable(
                "ImageNotRunnableLocally", f"{image}: project venv {VENV_BIN} is missing"
            )
        apps = Path(local["apps"]) if local is not None else PROJECT_APPS
        return Runtime(f"{VENV_BIN}:{SYSTEM_PATH}", mounts=(Mount(str(apps), APPS_DIR, True),))
    if repo.rsplit("/", 1)[-1] == "busybox":
        return Runtime(SYSTEM_PATH, ("sh",))
    raise NotRunnable(
        ERR_IMAGE_PULL,
        f"image {image!r} not found: the local node runs only {sorted(PROJECT_REPOS)}, "
        f"busybox and the test images in {LOCAL_IMAGES_FILE}",
    )


def register_local_image(state_dir: Path, image: str, apps: Path) -> None:
    """Make `image` runnable on the plane's local nodes: the project image with `apps` at
    APPS_DIR (what a user's image built FROM the workload image with their app looks like)."""
    path = Path(state_dir) / LOCAL_IMAGES_FILE
    images = json.loads(path.read_text()) if path.exists() else {}
    images[image] = {"apps": str(Path(apps).resolve())}
    path.write_text(json.dumps(images, indent=2) + "\n")


def read_local_images(state_dir: Path) -> dict[str, dict[str, str]]:
    """The test-only images registered for a plane (empty when none)."""
    path = Path(state_dir) / LOCAL_IMAGES_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: known names replaced, `$$` -> `$`, unknown left as is."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(sub, text)


def service_env(
    services: list[Obj], resolve: Callable[[Obj], tuple[str, dict[str, int]] | None]
) -> dict[str, str]:
    """Kubelet-style `<SVC>_SERVICE_HOST/_PORT` (+ docker link) variables.

    `resolve(service)` returns (address of a ready selected pod, service port name/number ->
    target port) or None when no pod is ready; such services are left out.
    """
    env: dict[str, str] = {}
    for svc in sorted(services, key=lambda s: s["metadata"]["name"]):
        got = resolve(svc)
        if got is None:
            continue
        host, ports = got
        prefix = svc["metadata"]["name"].upper().replace("-", "_")
        env[f"{prefix}_SERVICE_HOST"] = host
        svc_ports = svc.get("spec", {}).get("ports") or []
        for i, p in enumerate(svc_ports):
            target = ports.get(str(p.get("port")), int(p.get("port", 0)))
            proto = str(p.get("protocol", "TCP"))
            if i == 0:
                env[f"{prefix}_SERVICE_PORT"] = str(target)
                env[f"{prefix}_PORT"] = f"{proto.lower()}://{host}:{target}"
            if p.get("name"):
                env[f"{prefix}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}"] = str(target)
            link = f"{prefix}_PORT_{p.get('port')}_{proto.upper()}"
            env[link] = f"{proto.lower()}://{host}:{target}"
            env[f"{link}_PROTO"] = proto.lower()
            env[f"{link}_PORT"] = str(target)
            env[f"{link}_ADDR"] = host
    return env


def target_ports(svc: Obj, pod: Obj) -> dict[str, int]:
    """Service port -> the pod's port (targetPort number or named container port)."""
    named: dict[str, int] = {}
    for c in pod.get("spec", {}).get("containers", []):
        for cp in c.get("ports") or []:
            if cp.get("name"):
                named[cp["name"]] = int(cp["containerPort"])
    out: dict[str, int] = {}
    for p in svc.get("spec", {}).get("ports") or []:
        tp = p.get("targetPort", p.get("port"))
        if isinstance(tp, str) and not tp.isdigit():
            if tp not in named:
                continue
            out[str(p["port"])] = named[tp]
        else:
            out[str(p["port"])] = int(tp)
    return out


def selects(selector: Mapping[str, str] | None, labels: Mapping[str, str] | None) -> bool:
    """Service-style equality selector; an empty/missing selector selects nothing."""
    if not selector:
        return False
    labels = labels or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _field_ref(pod: Obj, path: str, pod_ip: str, host_ip: str) -> str:
    meta = pod.get("metadata", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod.get("spec", {}).get("nodeName", ""),
        "spec.serviceAccountName": pod.get("spec", {}).get("serviceAccountName", "default"),
        "status.podIP": pod_ip,
        "status.hostIP": host_ip,
    }
    if path in simple:
        return str(simple[path])
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise NotRunnable("CreateContainerConfigError", f"unsupported fieldRef {path!r}")


def _lookup_key(lookup: Lookup, kind: str, ns: str, ref: Obj) -> str | None:
    data = lookup(kind, ns, ref["name"])
    optional = bool(ref.get("optional"))
    if data is None:
        if optional:
            return None
        raise NotYet("CreateContainerConfigError", f"{kind} {ns}/{ref['name']} not found")
    if ref["key"] not in data:
        if optional:
            return None
        raise NotYet(
            "CreateContainerConfigError",
            f"key {ref['key']!r} not found in {kind} {ns}/{ref['name']}",
        )
    return data[ref["key"]]


def container_env(
    pod: Obj, container: Obj, base: Mapping[str, str], lookup: Lookup, pod_ip: str, host_ip: str
) -> dict[str, str]:
    """The process environment: base (PATH, service vars, POD_IP...) then envFrom then env."""
    ns = pod["metadata"]["namespace"]
    env = dict(base)
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        for kind, key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            if key in src:
                data = lookup(kind, ns, src[key]["name"])
                if data is None:
                    if src[key].get("optional"):
                        continue
                    raise NotYet(
                        "CreateContainerConfigError", f"{kind} {ns}/{src[key]['name']} not found"
                    )
                env.update({prefix + k: v for k, v in data.items()})
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
        elif "valueFrom" in item:
            vf = item["valueFrom"]
            val: str | None
            if "fieldRef" in vf:
                val = _field_ref(pod, vf["fieldRef"]["fieldPath"], pod_ip, host_ip)
            elif "configMapKeyRef" in vf:
                val = _lookup_key(lookup, "configmap", ns, vf["configMapKeyRef"])
            elif "secretKeyRef" in vf:
                val = _lookup_key(lookup, "secret", ns, vf["secretKeyRef"])
            elif "resourceFieldRef" in vf:
                val = "0"
            else:
                raise NotRunnable("CreateContainerConfigError", f"unsupported valueFrom in {name}")
            if val is not None:
                env[name] = val
        else:
            env[name] = ""
    return env


def argv_for(container: Obj, runtime: Runtime, env: Mapping[str, str]) -> list[str]:
    """command+args with $(VAR) expansion; the image default command when none is given."""
    command = [expand(str(c), env) for c in container.get("command") or []]
    args = [expand(str(a), env) for a in container.get("args") or []]
    if not command:
        if not runtime.default_command:
            raise NotRunnable(
                "ImageNotRunnableLocally",
                f"container {container['name']!r}: image {container.get('image')} has no local "
                "entrypoint; set `command`",
            )
        command = list(runtime.default_command)
    return command + args


def _payload(
    data: Mapping[str, str | bytes], items: list[Obj] | None, what: str
) -> dict[str, tuple[bytes, int]]:
    """relative path -> (content, mode) of one ConfigMap/Secret source, as kubelet lays it out."""
    if items:
        pairs = []
        for it in items:
            if it["key"] not in data:
                raise NotYet("FailedMount", f"key {it['key']!r} not in {what}")
            pairs.append((it["path"], data[it["key"]], it.get("mode")))
    else:
        pairs = [(k, v, None) for k, v in data.items()]
    return {
        rel: (value.encode() if isinstance(value, str) else value, int(mode or 0o644))
        for rel, value, mode in pairs
    }


DATA_LINK = "..data"


def atomic_write(directory: Path, payload: Mapping[str, tuple[bytes, int]]) -> bool:
    """Write a volume as kubelet's AtomicWriter does: the files in a new `..<timestamp>`
    directory, `..data` switched to it by one rename, each top-level name a symlink through
    `..data`, the old directory removed. A reader of `<dir>/<key>` sees the old set or the new
    one, never a mix; a process holding a resolved path keeps the old (then deleted) files.
    False when the content is already that."""
    directory.mkdir(parents=True, exist_ok=True)
    link = directory / DATA_LINK
    old = os.readlink(link) if link.is_symlink() else None
    if old is not None and _read_payload(directory / old) == payload:
        return False
    stamp = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    for rel, (value, mode) in payload.items():
        dst = stamp / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(value)
        dst.chmod(mode)
    tmp = directory / "..data_tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(stamp.name)
    tmp.rename(link)
    tops = {Path(rel).parts[0] for rel in payload}
    for top in tops:
        entry = directory / top
        if not entry.is_symlink():
            if entry.is_dir():
                shutil.rmtree(entry)
            elif entry.exists():
                entry.unlink()
            entry.symlink_to(f"{DATA_LINK}/{top}")
    for entry in directory.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.is_symlink() and entry.name not in tops:
            entry.unlink()  # a key the source no longer has
    if old is not None:
        shutil.rmtree(directory / old, ignore_errors=True)
    return True


def _read_payload(root: Path) -> dict[str, tuple[bytes, int]] | None:
    if not root.is_dir():
        return None
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode & 0o777)
        for p in root.rglob("*")
        if p.is_file()
    }


def _source_data(kind: str, ns: str, ref: Obj, lookup: Lookup) -> dict[str, str] | None:
    name = ref.get("name") or ref.get("secretName") or ""
    data = lookup(kind, ns, name)
    if data is None and not ref.get("optional"):
        raise NotYet("FailedMount", f"{kind} {ns}/{name} not found")
    return data


# serviceAccountToken source: (namespace, serviceaccount, audience, seconds) -> token or None
TokenSource = Callable[[str, str, str | None, int], str | None]
# persistentVolumeClaim source: (namespace, claim name) -> (the claim, the PV it is bound to),
# each None when absent
ClaimSource = Callable[[str, str], tuple[Obj | None, Obj | None]]


def claim_host_path(ns: str, name: str, pvc: Obj | None, pv: Obj | None) -> tuple[str, str]:
    """(path, hostPath type) of the volume a claim is bound to; NotYet until the claim exists
    and is Bound (the PV controller binds it), NotRunnable for PVs that are not hostPath (no
    volume plugins here: a claim is mounted like the hostPath of its PersistentVolume)."""
    if pvc is None:
        raise NotYet("FailedMount", f"persistentvolumeclaim {ns}/{name} not found")
    phase = (pvc.get("status") or {}).get("phase", "Pending")
    volume = (pvc.get("spec") or {}).get("volumeName")
    if phase != "Bound" or not volume:
        raise NotYet("FailedMount", f"persistentvolumeclaim {ns}/{name} is {phase}, not Bound")
    if pv is None:
        raise NotYet("FailedMount", f"persistentvolume {volume} (of {ns}/{name}) not found")
    host = (pv.get("spec") or {}).get("hostPath")
    if not host or not host.get("path"):
        raise NotRunnable(
            "FailedMount", f"persistentvolume {volume}: the local node mounts only hostPath volumes"
        )
    return str(host["path"]), str(host.get("type", ""))


def _host_path(hp: Path, kind: str) -> Path:
    """A hostPath volume as kubelet prepares it: create it for the *OrCreate types, else it
    must exist."""
    if kind == "DirectoryOrCreate":
        hp.mkdir(parents=True, exist_ok=True)
    elif kind == "FileOrCreate" and not hp.exists():
        hp.parent.mkdir(parents=True, exist_ok=True)
        hp.touch()
    elif not hp.exists():
        raise NotYet("FailedMount", f"hostPath {hp} does not exist")
    return hp


def materialise_volumes(
    pod: Obj,
    pod_dir: Path,
    lookup: Lookup,
    pod_ip: str,
    host_ip: str,
    token: TokenSource | None = None,
    claims: ClaimSource | None = None,
) -> dict[str, Path]:
    """Write every pod volume under `pod_dir/volumes/`; return volume name -> host path.

    A persistentVolumeClaim resolves through `claims` to its bound PV's hostPath."""
    ns = pod["metadata"]["namespace"]
    out: dict[str, Path] = {}
    for vol in pod.get("spec", {}).get("volumes") or []:
        name = vol["name"]
        vdir = pod_dir / "volumes" / name
        if "emptyDir" in vol:
            vdir.mkdir(parents=True, exist_ok=True)
            out[name] = vdir
        elif "hostPath" in vol:
            out[name] = _host_path(Path(vol["hostPath"]["path"]), vol["hostPath"].get("type", ""))
        elif "persistentVolumeClaim" in vol:
            claim = vol["persistentVolumeClaim"]["claimName"]
            if claims is None:
                raise NotRunnable("FailedMount", f"volume {name}: no claim source on this node")
            path, kind = claim_host_path(ns, claim, *claims(ns, claim))
            out[name] = _host_path(Path(path), kind)
        elif {"configMap", "secret", "projected", "downwardAPI"} & set(vol):
            payload = volume_payload(vol, pod, lookup, pod_ip, host_ip, token)
            assert payload is not None
            atomic_write(vdir, payload)
            out[name] = vdir
        else:
            kinds = sorted(k for k in vol if k != "name")
            raise NotRunnable("FailedMount", f"volume {name}: unsupported type {kinds}")
    return out


def volume_payload(
    vol: Obj,
    pod: Obj,
    lookup: Lookup,
    pod_ip: str,
    host_ip: str,
    token: TokenSource | None = None,
    refresh: bool = False,
) -> dict[str, tuple[bytes, int]] | None:
    """The files of a configMap, secret, projected or downwardAPI volume. With `refresh`
    (kubelet's periodic resync of a running pod): None for volumes that are not refreshed
    here (downwardAPI, and projected ones with a serviceAccountToken source)."""
    ns = pod["metadata"]["namespace"]
    name = vol["name"]
    payload: dict[str, tuple[bytes, int]] = {}
    if "configMap" in vol or "secret" in vol:
        kind = "configmap" if "configMap" in vol else "secret"
        ref = vol.get("configMap") or vol.get("secret") or {}
        data = _source_data(kind, ns, ref, lookup) or {}
        return _payload(data, ref.get("items"), f"{kind} {ns}")
    if "projected" in vol:
        for src in vol["projected"].get("sources") or []:
            if "configMap" in src or "secret" in src:
                kind = "configmap" if "configMap" in src else "secret"
                ref = src.get("configMap") or src.get("secret") or {}
                data = _source_data(kind, ns, ref, lookup) or {}
                payload.update(_payload(data, ref.get("items"), f"{kind} {ns}"))
            elif "downwardAPI" in src:
                items = src["downwardAPI"].get("items") or []
                payload.update(_downward(pod, items, pod_ip, host_ip))
            elif "serviceAccountToken" in src:
                if refresh:
                    return None
                sat = src["serviceAccountToken"]
                sa = pod.get("spec", {}).get("serviceAccountName") or "default"
                tok = (
                    token(ns, sa, sat.get("audience"), int(sat.get("expirationSeconds", 3600)))
                    if token
                    else None
                )
                if tok is None:
                    raise NotYet("FailedMount", f"no token for serviceaccount {ns}/{sa}")
                payload.update(_payload({sat["path"]: tok}, None, "token"))
            else:
                raise NotRunnable("FailedMount", f"unsupported projected source in {name}")
        return payload
    if "downwardAPI" in vol and not refresh:
        return _downward(pod, vol["downwardAPI"].get("items") or [], pod_ip, host_ip)
    return None


def refresh_volumes(
    pod: Obj, pod_dir: Path, lookup: Lookup, pod_ip: str, host_ip: str
) -> list[str]:
    """Rewrite the running pod's ConfigMap, Secret and projected volumes whose sources
    changed (kubelet's resync; a source gone or mid-change keeps the old files, as kubelet
    does). Returns the names of the volumes rewritten."""
    changed = []
    for vol in pod.get("spec", {}).get("volumes") or []:
        if not {"configMap", "secret", "projected"} & set(vol):
            continue
        try:
            payload = volume_payload(vol, pod, lookup, pod_ip, host_ip, refresh=True)
        except (NotYet, NotRunnable):
            continue
        if payload is not None and atomic_write(pod_dir / "volumes" / vol["name"], payload):
            changed.append(vol["name"])
    return changed


def _downward(
    pod: Obj, items: list[Obj], pod_ip: str, host_ip: str
) -> dict[str, tuple[bytes, int]]:
    data: dict[str, str] = {}
    for it in items:
        if "fieldRef" in it:
            path = it["fieldRef"]["fieldPath"]
            meta = pod.get("metadata", {})
            if path in ("metadata.labels", "metadata.annotations"):
                kv = meta.get(path.split(".")[1]) or {}
                data[it["path"]] = "\n".join(f'{k}="{v}"' for k, v in sorted(kv.items()))
            else:
                data[it["path"]] = _field_ref(pod, path, pod_ip, host_ip)
    return _payload(data, None, "downwardAPI")


@dataclass
class ContainerPlan:
    """Everything needed to start one container process."""

    name: str
    image: str
    argv: list[str]
    env: dict[str, str]
    mounts: list[Mount] = field(default_factory=list)
    workdir: str = "/"


def container_mounts(container: Obj, volumes: Mapping[str, Path]) -> list[Mount]:
    """volumeMounts -> bind mounts (subPath supported)."""
    mounts = []
    for vm in container.get("volumeMounts") or []:
        if vm["name"] not in volumes:
            raise NotRunnable("CreateContainerConfigError", f"volume {vm['name']!r} not defined")
        src = volumes[vm["name"]]
        if vm.get("subPath"):
            src = src / vm["subPath"]
            if not src.exists():
                src.mkdir(parents=True, exist_ok=True)
        mounts.append(Mount(str(src), vm["mountPath"], bool(vm.get("readOnly"))))
    return mounts


def launcher_argv(
    plan: ContainerPlan, hosts_file: str | None = None, netns: str | None = None
) -> list[str]:
    """argv that runs `plan` in a private mount namespace with its bind mounts in place.

    With `netns` (the path of the pod's network namespace handle) the container joins the
    pod's network namespace first, and drops the namespace handles it inherited in its mount
    table: held there, they would keep other pods' namespaces (and veths) alive after those
    pods are gone. Parent-death SIGKILL (setpriv) makes the process die with the local node.
    Mount targets must exist beforehand (the local node creates and records them).
    """
    lines = ["set -e"]
    join: list[str] = []
    if netns:
        join = ["nsenter", f"--net={netns}", "--"]
        handles = shlex.quote(str(Path(netns).parent))
        lines.append(f"umount -l {handles} 2>/dev/null || true")
    # A volume mounted over a parent of the repository (an emptyDir at /tmp, with the repo in
    # /tmp/<clone>) would hide the project venv the image maps to: keep a handle on the repo
    # from before the mounts and bind it back in place after them.
    repo = str(REPO_ROOT)
    shadowed = any(repo.startswith(m.target.rstrip("/") + "/") for m in plan.mounts)
    if shadowed:
        lines.append(f"exec 9<{shlex.quote(repo)}")
    for m in plan.mounts:
        src, dst = shlex.quote(m.source), shlex.quote(m.target)
        lines.append(f"mount --bind {src} {dst}")
        if m.read_only:
            lines.append(f"mount -o remount,bind,ro {dst}")
    if shadowed:
        lines.append(f"mkdir -p {shlex.quote(repo)} 2>/dev/null || true")
        # --no-canonicalize: mount(8) would resolve the fd's link by name, now the shadow.
        lines.append(f"mount --no-canonicalize --bind /proc/self/fd/9 {shlex.quote(repo)}")
        lines.append("exec 9<&-")
    if hosts_file:
        lines.append(f"mount --bind {shlex.quote(hosts_file)} /etc/hosts")
    lines.append(f"cd {shlex.quote(plan.workdir)}")
    lines.append('exec "$@"')
    return [
        "setpriv",
        "--pdeathsig",
        "KILL",
        "--",
        *join,
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        "\n".join(lines),
        plan.name,
        *plan.argv,
    ]


def hosts_file_text(pod_name: str, pod_ip: str, names: Mapping[str, str]) -> str:
    """/etc/hosts for a pod: localhost, its own name, and service names -> pod addresses."""
    lines = [
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{pod_ip}\t{pod_name}",
    ]
    lines += [f"{ip}\t{name}" for name, ip in sorted(names.items())]
    return "\n".join(lines) + "\n"


def decode_secret(data: Mapping[str, str] | None) -> dict[str, str]:
    """Secret .data (base64) -> text values (undecodable bytes replaced)."""
    return {k: base64.b64decode(v).decode(errors="replace") for k, v in (data or {}).items()}
