"""The SDK's model store on S3-compatible object storage: a real server, not a mock library.

versitygw (built from the Go module registry by hack/tools/build-versitygw.sh, as setup does)
serves a directory over the S3 API on 127.0.0.1; boto3 talks to it with the credentials and
endpoint in the standard AWS environment, as the server pod gets them from the resource's
Secret. No control plane is needed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from hack.testing import free_port
from workloads.sdk import ModelStore, ModelStoreError, ServerPlatform, load_model, to_numpy
from workloads.sdk.storage import s3_client
from workloads.sdk.store import StoreOwnedError

pytestmark = [pytest.mark.byo_app, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
KEY, SECRET = "ocmfl-test-key", "ocmfl-test-secret-0123456789"


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = subprocess.run(
        ["bash", str(ROOT / "hack" / "tools" / "build-versitygw.sh")],
        check=True, capture_output=True, text=True, timeout=900,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    data = tmp_path_factory.mktemp("s3")
    port = free_port()
    env = {**os.environ, "ROOT_ACCESS_KEY": KEY, "ROOT_SECRET_KEY": SECRET}
    log = (data.parent / "versitygw.log").open("wb")
    proc = subprocess.Popen(
        [binary, "--port", f"127.0.0.1:{port}", "posix", "--nometa", str(data)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert proc.poll() is None, f"versitygw exited {proc.returncode}"
            assert time.monotonic() < deadline, "versitygw did not listen"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture
def bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket, with the server pod's environment pointing at it."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    name = f"models-{time.monotonic_ns() % 10**9}"
    s3_client().create_bucket(Bucket=name)
    return name


def _arrays(v: float) -> dict[str, np.ndarray]:
    return {"w": np.full((64, 32), v, dtype=np.float32), "b": np.arange(32, dtype=np.float32)}


def test_checkpoints_final_model_and_resume_live_in_the_bucket(bucket: str) -> None:
    store = ModelStore.from_platform(
        ServerPlatform(storage=f"s3://{bucket}/team-a/digits", resource_uid="uid-1")
    )
    assert store is not None and store.location == f"s3://{bucket}/team-a/digits"
    store.save_checkpoint(1, _arrays(1.0), {"server": {"acc": 0.5}})
    entry = store.save_checkpoint(2, _arrays(2.0), {"server": {"acc": 0.7}})
    final = store.save_final(2, _arrays(2.0), entry["metrics"])
    assert store.url(final) == f"s3://{bucket}/team-a/digits/final/model.npz"
    keys = {
        o["Key"] for o in s3_client().list_objects_v2(Bucket=bucket)["Contents"]
    }  # what a user sees in the bucket
    assert keys == {
        "team-a/digits/manifest.json",
        "team-a/digits/checkpoints/uid-1/round-0001.npz",
        "team-a/digits/checkpoints/uid-1/round-0002.npz",
        "team-a/digits/final/model.npz",
    }
    again = ModelStore(f"s3://{bucket}/team-a/digits", "uid-1")  # a restarted server
    latest = again.latest()
    assert latest is not None and latest.round == 2
    np.testing.assert_array_equal(to_numpy(latest.arrays)["w"], _arrays(2.0)["w"])
    assert again.final() is not None
    # Another resource (uid) is refused this store, never given or set onto its checkpoints.
    with pytest.raises(StoreOwnedError, match="belongs to resource uid 'uid-1'"):
        ModelStore(f"s3://{bucket}/team-a/digits", "uid-2").latest()
    # A tampered object is skipped for resume, like a corrupt file on a PVC.
    s3_client().put_object(
        Bucket=bucket, Key="team-a/digits/checkpoints/uid-1/round-0002.npz", Body=b"x"
    )
    latest = again.latest()
    assert latest is not None and latest.round == 1


def test_a_pth_init_model_is_read_from_the_bucket(bucket: str, tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    torch.save(model.state_dict(), tmp_path / "base.pth")
    s3_client().upload_file(str(tmp_path / "base.pth"), bucket, "fl/base.pth")
    store = ModelStore(f"s3://{bucket}/fl", "u")
    record = store.read_model("base.pth")  # initModel: a path inside the storage
    assert list(record) == ["weight", "bias"]
    same = load_model(f"s3://{bucket}/fl/base.pth")  # or a full s3:// URL
    np.testing.assert_array_equal(to_numpy(same)["weight"], model.weight.detach().numpy())
    with pytest.raises(ModelStoreError, match=rf"s3://{bucket}/fl/missing\.pth does not exist"):
        store.read_model("missing.pth")


def test_wrong_credentials_fail_naming_the_location(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    store = ModelStore(f"s3://{bucket}/x", "u")
    with pytest.raises(ModelStoreError, match=rf"cannot write s3://{bucket}/x/checkpoints"):
        store.save_checkpoint(1, _arrays(0.0), {})
