#!/usr/bin/env bash
# Fill docker/wheels/ with every wheel the image needs (CPU torch, the project's
# dependencies, setuptools to build the project), using THIS host's pip config.
# Then build with no network at all inside the build:
#   docker/fetch-wheels.sh
#   docker build -f docker/Dockerfile --build-arg TORCH_INDEX_URL= --build-arg INDEX_URL= ...
# Run from the repository root, with a Python 3.11 (same as the image's) pip.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTHON="${PYTHON:-python3}"
OUT=docker/wheels
# The project's own dependencies, read from pyproject.toml (the project itself is built
# from source inside the image, so nothing is built in this work tree).
"$PYTHON" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
    > "$OUT/requirements.txt"
"$PYTHON" -m pip wheel --wheel-dir "$OUT" "torch==${TORCH_VERSION}" "setuptools>=69" wheel -r "$OUT/requirements.txt"
# Never ship a CUDA torch: the wheelhouse must hold the CPU build.
ls "$OUT"/torch-*.whl
ls "$OUT" | grep -E '^nvidia_' && { echo "CUDA wheels found in $OUT; use a CPU torch source" >&2; exit 1; } || true
