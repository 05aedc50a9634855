"""hack.controlplane.build: cache hits are instant; failures name the component and the log."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hack.controlplane import build


def _fake_go(bin_dir: Path, script: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    go = bin_dir / "go"
    go.write_text("#!/bin/sh\n" + script)
    go.chmod(go.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OCMFL_BIN_DIR", str(tmp_path / "bin"))
    return tmp_path / "bin"


def test_binaries_are_cached_by_version(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    etcd = build.COMPONENTS[0]
    assert etcd.out_dir == cache / f"etcd-{build.ETCD_VERSION}"
    etcd.out_dir.mkdir(parents=True)
    (etcd.out_dir / "etcd").write_text("")
    (etcd.out_dir / "etcd").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no go needed for a cache hit
    assert build.build_component(etcd) == 0.0
    assert build.binary("etcd") == etcd.out_dir / "etcd"
    assert "kube-apiserver" in build.missing_binaries()


def test_missing_go_toolchain_is_named(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(build.BuildError, match="Go toolchain not found"):
        build.build_component(build.COMPONENTS[1])


def test_registry_refusal_names_component_and_log(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_go(
        tmp_path / "gobin",
        "echo 'reading https://proxy.golang.org/x/@v/v1.zip: 403 Forbidden' >&2; exit 1\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'gobin'}{os.pathsep}/usr/bin:/bin")
    with pytest.raises(build.BuildError) as e:
        build.build_component(build.COMPONENTS[2])
    assert "ocm v1.2.0" in str(e.value) and "refused" in str(e.value)
    assert "build-ocm-v1.2.0.log" in str(e.value)


def test_compile_failure_names_component_and_log(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_go(tmp_path / "gobin", "echo 'x.go:1: undefined: foo' >&2; exit 2\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'gobin'}{os.pathsep}/usr/bin:/bin")
    with pytest.raises(build.BuildError, match=r"kubernetes v1\.35\.4: go build failed"):
        build.build_component(build.COMPONENTS[1])


def test_build_commands_match_the_pinned_ldflags() -> None:
    k8s = build.COMPONENTS[1].build_command()
    assert "-X k8s.io/component-base/version.gitVersion=v1.35.4" in k8s[k8s.index("-ldflags") + 1]
    assert "-X k8s.io/component-base/version.gitMinor=35" in k8s[k8s.index("-ldflags") + 1]
    assert k8s[-2:] == [
        "k8s.io/kubernetes/cmd/kube-apiserver",
        "k8s.io/kubernetes/cmd/kube-controller-manager",
    ]
    assert len(build.HUB_CRDS) == 14
