"""The long-lived ClientApp worker: a real worker process on a Unix socket, forking a child
per message; the thin ClientApp forwards to it, or runs the app itself without one."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from flower_local import stamp_task_identity
from flwr.app import ConfigRecord, Context, Message, RecordDict

from workloads.sdk import forwarding_client_app, to_numpy, to_record
from workloads.sdk.worker import SOCKET_ENV, write_exec_shim

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture(autouse=True)
def _task(monkeypatch: pytest.MonkeyPatch) -> None:
    stamp_task_identity(monkeypatch)


@contextlib.contextmanager
def _worker(tmp_path: Path, preload: str) -> Iterator[Path]:
    directory = tmp_path / "w"
    directory.mkdir(mode=0o700)
    path = directory / "worker.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "workloads.clientapp_worker", "--socket", str(path),
         "--preload", preload],
        cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not path.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "worker did not start"
            time.sleep(0.05)
        yield path
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Path]:
    with _worker(tmp_path, "numpy") as path:
        yield path


def _message(fail: bool = False, optimizer: bool = False) -> Message:
    content = RecordDict(
        {
            "arrays": to_record({"w": np.arange(4, dtype=np.float32)}),
            "config": ConfigRecord({"server-round": 1, "fail": fail, "optimizer": optimizer}),
        }
    )
    msg = Message(content, dst_node_id=7, message_type="train")
    msg.metadata.__dict__["_message_id"] = "abc"
    return msg


def _context() -> Context:
    return Context(1, 7, {"cluster-name": "cluster1"}, RecordDict(), {})


def test_the_worker_runs_each_message_in_a_fresh_child_and_keeps_state(
    worker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert stat.S_IMODE(worker.stat().st_mode) == 0o600
    monkeypatch.setenv(SOCKET_ENV, str(worker))
    app = forwarding_client_app("worker_app:app")
    app.app_dir = HERE
    context = _context()
    first = app(_message(), context)
    second = app(_message(), context)
    assert np.array_equal(to_numpy(first.content.array_records["arrays"])["w"], [0, 2, 4, 6])
    assert first.metadata.reply_to_message_id == "abc"
    metrics = [r.content.metric_records["metrics"] for r in (first, second)]
    assert metrics[0]["pid"] != metrics[1]["pid"] != os.getpid()  # one child per message
    assert [m["calls"] for m in metrics] == [1, 2]  # context.state came back each time


def test_a_child_of_a_torch_worker_builds_its_optimizer_without_importing_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch imports its compiler stack (about 900 modules, over a second of CPU) at the first
    # optimizer a process builds; the worker does that once, so no per-message child pays it.
    with _worker(tmp_path, "numpy,torch") as path:
        monkeypatch.setenv(SOCKET_ENV, str(path))
        app = forwarding_client_app("worker_app:app")
        app.app_dir = HERE
        reply = app(_message(optimizer=True), _context())
    assert reply.content.metric_records["metrics"]["new-modules"] == 0


def test_an_app_error_comes_back_under_its_own_class_name(
    worker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SOCKET_ENV, str(worker))
    app = forwarding_client_app("worker_app:app")
    app.app_dir = HERE
    with pytest.raises(RuntimeError, match="asked to fail on cluster1") as info:
        app(_message(fail=True), _context())
    assert type(info.value).__name__ == "ValueError"


def test_without_a_worker_the_app_runs_in_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = forwarding_client_app("worker_app:app")
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    reply = app(_message(), _context())
    assert reply.content.metric_records["metrics"]["pid"] == os.getpid()
    monkeypatch.setenv(SOCKET_ENV, str(tmp_path / "gone.sock"))  # worker gone: still runs
    reply = app(_message(), _context())
    assert reply.content.metric_records["metrics"]["pid"] == os.getpid()


def test_the_thin_example_clientapps_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "for app, mod in (('digits', 'digits_app'), ('digits-cnn', 'cnn_app'),"
        " ('tabular', 'tabular_app')):\n"
        "    sys.path.insert(0, f'examples/apps/{app}')\n"
        "    __import__(f'{mod}.client')\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "False", out.stderr


def test_the_exec_shim_runs_flowers_clientapp_in_the_worker(worker: Path, tmp_path: Path) -> None:
    # What Flower's SuperExec does per message: start `flwr-clientapp ARGS` from PATH. The
    # shim's output and exit code are those of Flower's entry point run in a child of the
    # worker (its fallback, used only without a worker, is made to fail here).
    shim_dir = write_exec_shim(worker.parent / "bin", worker, fallback=Path("/bin/false"))
    shim = shim_dir / "flwr-clientapp"
    assert stat.S_IMODE(shim.stat().st_mode) == 0o700
    env = {**os.environ, "PATH": f"{shim_dir}{os.pathsep}{os.environ['PATH']}"}
    ok = subprocess.run(["flwr-clientapp", "--help"], env=env, capture_output=True, text=True,
                        timeout=60)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "--runtime-api-address" in ok.stdout
    bad = subprocess.run(["flwr-clientapp", "--no-such-flag"], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2  # argparse's usage error, from Flower's own parser
    assert "flwr-clientapp: error:" in bad.stderr


def test_the_exec_shim_runs_flowers_own_clientapp_without_a_worker(tmp_path: Path) -> None:
    shim_dir = write_exec_shim(tmp_path / "bin", tmp_path / "gone.sock")
    done = subprocess.run([str(shim_dir / "flwr-clientapp"), "--help"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--runtime-api-address" in done.stdout
