"""The supervisor process: local nodes (one per apiserver), or the host side of kubelet nodes,
and the hub's csrcleaner on a short clock.

Started detached by `up` (``python -m hack.controlplane supervise``); reads the state file,
writes ``supervisor.ready`` once every node has synced, runs until SIGTERM, then kills its pods.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType

from hack.controlplane import kubelet_host, kubelet_spec, podnet
from hack.controlplane.csrcleaner import CSRCleaner
from hack.controlplane.localnode import LocalNode
from hack.controlplane.processes import State
from ocmfl.kube import Kube

READY_FILE = "supervisor.ready"


def run(state_dir: Path) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s"
    )
    state = State.load(state_dir)
    if state is None:
        logging.error("no state file in %s", state_dir)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    names = ["hub", *state.clusters]
    kubes = {n: Kube(state.kubeconfigs[n]) for n in names}
    if not state.kubelet:  # local nodes: the plane's host-terminated addresses
        podnet.ensure_plane(state.slot)
    nodes: list[LocalNode | kubelet_host.HostSide] = []
    for i, n in enumerate(names):
        port = int(state.apiservers[n].rsplit(":", 1)[1])
        if state.kubelet:  # real kubelets run the pods; this side serves them the apiserver
            nodes.append(kubelet_host.HostSide(kubelet_spec.specs(state)[i], kubes[n], stop))
        else:
            nodes.append(LocalNode(n, state.slot, i, kubes[n], port, state_dir, stop))
    for node in nodes:
        node.start()
    if state.ocm:  # the hub's csrcleaner, on a short clock (csrcleaner.py)
        CSRCleaner(Kube(state.kubeconfigs["hub"]), stop).start()
    for node in nodes:
        while not node.ready.wait(0.5):
            if stop.is_set():
                return 1
    (state_dir / READY_FILE).write_text("ok\n")
    logging.info("supervisor ready: %d nodes", len(nodes))
    stop.wait()
    logging.info("stopping: terminating pods")
    for node in nodes:
        node.thread.join(timeout=10)
    return 0
