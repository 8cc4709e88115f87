# A stand-in for prom/prometheus on hosts with no container registry (see docker/README.md):
# Debian's prometheus package on the debootstrap base image, same entrypoint and paths.
#   docker build --build-arg BASE_IMAGE=splitrl-base:bookworm -t splitrl-prometheus:local - \
#       < docker/prometheus-local.Dockerfile       # no build context needed
#   PROMETHEUS_IMAGE=splitrl-prometheus:local docker compose up -d
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus wget \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus && chown nobody:nogroup /prometheus
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
