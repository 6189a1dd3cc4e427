#!/usr/bin/env bash
# The GPU check (issues 10 and 25): the exactness tests, the native model path's included, and
# benchmarks/bench_engine.py on CUDA: the shared-prefix workload in fp32 (outputs must equal HF generate's),
# then the context sweep and prefill in the numerics the server picks there (bf16 on CUDA).
#
#   bash scripts/gpu_check.sh            # full bench_engine workload
#   QUICK=1 bash scripts/gpu_check.sh    # bench_engine --quick
#
# Without a CUDA device it says so and runs the same on the CPU (only to prove the script works;
# those figures are not GPU figures). Exits non-zero if a test or the benchmark's checks fail.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
DEV=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
if [ "$DEV" != cuda ]; then
  echo "gpu_check: no CUDA device on this machine; running on the CPU only to prove the script runs" >&2
fi
"$PY" - <<'PYEOF'
import torch
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
print(f"gpu_check: torch {torch.__version__}, device {name}")
PYEOF
# tests/tiny_models.py and tests/conftest.py put the engine's model on $RADIX_TEST_DEVICE
export RADIX_TEST_DEVICE=$DEV
"$PY" -m pytest -q -x -p no:cacheprovider \
  tests/engine/test_engine.py tests/engine/test_scheduler.py tests/engine/test_engine_smollm2.py \
  -k "greedy or cache_off or paged or fully_cached or retraction or eight or twelve or 118 or walkthrough"
"$PY" -m pytest -q -x -p no:cacheprovider tests/engine/model/test_native_llama.py -k "engine_native_equals_generate"
"$PY" benchmarks/bench_engine.py --device "$DEV" --dtype fp32 --sections workload ${QUICK:+--quick}
"$PY" benchmarks/bench_engine.py --device "$DEV" --sections sweep,prefill ${QUICK:+--rounds 1}
echo "gpu_check: done on $DEV"
