# The FL workload: Flower (SuperLink/SuperNode) + torch, server launcher and client apps.
# Build from the repository root:
#   docker build -f deploy/images/workload.Dockerfile -t quay.io/ocm-fl/workload:0.1.0 .
# torch comes from PyTorch's CPU wheel index, so the image carries no CUDA libraries, unless the
# base image already has a torch >= 2.3 (the venv sees the base's site-packages): hack/images
# builds on Debian's CPU torch, since that index is not reachable from its CI machines.
# Runs as uid 65532 with a read-only root FS: data, model storage and /tmp are volumes.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The dependency list alone (pyproject.toml also holds tool settings): the install below is
# rebuilt only when this list changes.
FROM ${PYTHON_IMAGE} AS requirements
WORKDIR /src
COPY pyproject.toml deploy/images/pyproject_deps.py ./
RUN python pyproject_deps.py workloads >requirements.txt

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN python -m venv --system-site-packages /opt/venv \
 && /opt/venv/bin/pip install --index-url "${TORCH_INDEX}" "torch>=2.3"
WORKDIR /src
# Dependencies first, in their own layer: a code change rebuilds only the layer below them.
# Third-party packages' own tests are not needed at run time.
COPY --from=requirements /src/requirements.txt ./
RUN /opt/venv/bin/pip install --no-compile -r requirements.txt \
 && find /opt/venv/lib -depth -type d -path '*/site-packages/*/tests' -exec rm -rf {} + \
 && /opt/venv/bin/python -m compileall -q /opt/venv
# A stand-in for the readme pyproject.toml names: the real one is only package metadata
# here, and copying it would rebuild both images for every documentation edit.
COPY pyproject.toml ./
RUN echo 'OCM federated learning addon: see the project README.' > README.md
COPY ocmfl ocmfl
COPY hub_controller hub_controller
COPY agent_addon agent_addon
COPY workloads workloads
RUN /opt/venv/bin/pip install --no-compile --no-deps . \
 && /opt/venv/bin/python -m pip uninstall -y -q pip \
 && /opt/venv/bin/python -m compileall -q /opt/venv

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="ocm-fl workload" \
      org.opencontainers.image.description="OCM federated learning: Flower + torch (CPU) server and client" \
      org.opencontainers.image.licenses="Apache-2.0"
# nginx: the launchers run the Fleet gateway (server) and tunnel (client) as child processes
# (workloads/fleet_proxy.py); its config keeps every writable path under the state volume.
RUN apt-get update \
 && apt-get install -y --no-install-recommends nginx-light \
 && rm -rf /var/lib/apt/lists/*
# The uid below gets a name (nonroot, as in distroless images): getpass.getuser() (torch's
# caches, for one) fails for a uid without a passwd entry or USER/LOGNAME.
RUN groupadd --system --gid 65532 nonroot \
 && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin nonroot
COPY --from=build /opt/venv /opt/venv
# The example Flower apps (ocmfl.constants.APPS_DIR): spec.server.app.path names one. A user's
# image adds its own app the same way: FROM this image, COPY my-app /opt/ocm-fl/apps/my-app.
COPY examples/apps /opt/ocm-fl/apps
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    FLWR_HOME=/tmp/.flwr
USER 65532:65532
WORKDIR /tmp
CMD ["ocm-fl-client"]
