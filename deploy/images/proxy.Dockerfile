# nginx for the mTLS Fleet API gateway (hub) and tunnel (clusters). The nginx.conf comes from a
# ConfigMap rendered by workloads/fleet_proxy.py; every writable path it uses is under its
# run dir (a volume), so the root FS can be read-only.
# Build from the repository root:
#   docker build -f deploy/images/proxy.Dockerfile -t quay.io/ocm-fl/proxy:0.1.0 .
# Debian's nginx-light: the same nginx the local test node runs (hack/install-system-deps.sh).
ARG DEBIAN_IMAGE=debian:bookworm-slim

FROM ${DEBIAN_IMAGE}
LABEL org.opencontainers.image.title="ocm-fl proxy" \
      org.opencontainers.image.description="OCM federated learning: nginx mTLS gateway for Flower's Fleet API" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx-light ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && ln -sf /dev/stdout /var/log/nginx/access.log \
 && ln -sf /dev/stderr /var/log/nginx/error.log
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["nginx", "-g", "daemon off;"]
CMD ["-c", "/etc/ocm-fl/proxy/nginx.conf"]
