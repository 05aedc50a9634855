# Hub controller + aggregator (`ocm-fl-hub`), the CA init hook and the addon agent
# (`ocm-fl-agent`): one small image, no torch.
# Build from the repository root:
#   docker build -f deploy/images/addon.Dockerfile -t quay.io/ocm-fl/addon:0.1.0 .
# Runs as uid 65532 with a read-only root FS: /tmp (and the agent's /var/lib/ocm-fl) are
# volumes in the chart and the AddOnTemplate.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ocmfl ocmfl
COPY hub_controller hub_controller
COPY agent_addon agent_addon
COPY workloads workloads
RUN /opt/venv/bin/pip install --no-compile ".[hub,agent]" \
 && /opt/venv/bin/python -m compileall -q /opt/venv

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="ocm-fl addon" \
      org.opencontainers.image.description="OCM federated learning: hub controller, aggregator and agent" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT []
CMD ["ocm-fl-hub"]
