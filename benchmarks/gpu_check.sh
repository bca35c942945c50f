#!/usr/bin/env bash
# The GPU checks in one call: the CuPy tests, then benchmarks/gpu.py; logs go to $1 (default: gpu-logs/).
# Wheels in .whl/ (simpy and multiprocessing-logging, which a GPU image may lack) are installed first, offline.
# Usage: bash benchmarks/gpu_check.sh [LOG_DIR] [gpu.py arguments...]
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-gpu-logs}
shift || true
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/simlib-site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/simlib-site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi -L 2>&1 | tee "$logs/device.txt"
python3 -c "import cupy, numba, numpy; print('cupy', cupy.__version__, 'numba', numba.__version__, 'numpy', numpy.__version__)" \
  | tee -a "$logs/device.txt"
python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_hogwild_gpu.py tests/test_glove_gpu.py tests/test_lda_gpu.py \
  tests/test_backend.py 2>&1 | tee "$logs/tests.log" | tail -15
python3 benchmarks/gpu.py "$@" 2>&1 | tee "$logs/gpu.log"
