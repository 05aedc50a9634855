# Hub controller + aggregator (`ocm-fl-hub`), the CA init hook and the addon agent
# (`ocm-fl-agent`): one small image, no torch.
# Build from the repository root:
#   docker build -f deploy/images/addon.Dockerfile -t quay.io/ocm-fl/addon:0.1.0 .
# Runs as uid 65532 with a read-only root FS: /tmp (and the agent's /var/lib/ocm-fl) are
# volumes in the chart and the AddOnTemplate.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The dependency list alone (pyproject.toml also holds tool settings): the install below is
# rebuilt only when this list changes.
FROM ${PYTHON_IMAGE} AS requirements
WORKDIR /src
COPY pyproject.toml deploy/images/pyproject_deps.py ./
RUN python pyproject_deps.py hub agent >requirements.txt

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Dependencies first, in their own layer: a code change rebuilds only the layer below them.
# Then drop what nothing here runs: kubernetes>=35 also ships an asyncio copy of its whole
# generated client (kubernetes/aio, about 60 MB; the code uses the synchronous client) and the
# third-party packages' own tests.
# Byte-code is compiled ahead (the root FS is read-only), except for the generated Kubernetes
# API and model classes: 20 MB of .pyc that save only about 0.5 s per process start.
COPY --from=requirements /src/requirements.txt ./
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-compile -r requirements.txt \
 && rm -rf /opt/venv/lib/python3*/site-packages/kubernetes/aio \
 && find /opt/venv/lib -depth -type d -path '*/site-packages/*/tests' -exec rm -rf {} + \
 && /opt/venv/bin/python -m compileall -q -x 'kubernetes/client/(api|models)/' /opt/venv
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
 && /opt/venv/bin/python -m compileall -q -x 'kubernetes/client/(api|models)/' /opt/venv

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="ocm-fl addon" \
      org.opencontainers.image.description="OCM federated learning: hub controller, aggregator and agent" \
      org.opencontainers.image.licenses="Apache-2.0"
# The uid below gets a name (nonroot, as in distroless images): getpass.getuser(), which kopf
# calls for its identity, fails for a uid without a passwd entry or USER/LOGNAME.
RUN groupadd --system --gid 65532 nonroot \
 && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin nonroot
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT []
CMD ["ocm-fl-hub"]
