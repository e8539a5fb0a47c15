#!/usr/bin/env bash
# The PyTorch virtual environment of the `torch` benchmark suite (bench/torch_bench.py).
#
#   bench/torch/setup.sh            # creates $BENCH_DIR/torch-venv, pip install torch numpy
#
# The venv lives in $BENCH_DIR (default: ../bench-data next to this checkout),
# never inside the repository. torch comes from PyPI: on x86_64 Linux that is the
# CUDA build with its nvidia-* wheels, about 5.5 GB installed (the benchmark uses
# the CPU only; PyPI has no CPU-only wheel). Nothing here runs in CI.
# Idempotent: an existing venv that imports torch is kept.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$(dirname "$here")")
export BENCH_DIR=${BENCH_DIR:-$(dirname "$repo")/bench-data}
venv=$BENCH_DIR/torch-venv
python=${PYTHON:-python3}

if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c 'import torch, numpy' 2>/dev/null; then
    echo "[torch-setup] $venv already has torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')" >&2
    exit 0
fi
mkdir -p "$BENCH_DIR"
if ! "$python" -m venv --help >/dev/null 2>&1; then
    echo "[torch-setup] apt-get install python3-venv" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
fi
echo "[torch-setup] creating $venv (pip install torch numpy: ~5.5 GB, several minutes)" >&2
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install torch numpy
"$venv/bin/python" -c 'import torch, numpy; print("[torch-setup] torch", torch.__version__, "numpy", numpy.__version__)'
