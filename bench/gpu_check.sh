#!/usr/bin/env bash
# Device check for a CUDA machine (about 2-4 minutes): the planner tests with *compiled* Triton
# kernels, then TritonPlanner vs VectorizedPlanner(GPU) vs ReferencePlanner on a medium synthetic
# dump (agreement, then median times as ratios). Usage, from anywhere:
#
#     bash bench/gpu_check.sh [--size medium] [--repeat 5]     # extra args go to gpu_check.py
#
# Writes logs to $OUT (or bench/out) when set. Exit status: non-zero if any step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET   # compiled kernels: the point of running here
LOGS="${OUT:-bench/out}"
mkdir -p "$LOGS"

python - <<'EOF'
import torch
assert torch.cuda.is_available(), "no CUDA device: this check is for GPU machines"
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
EOF

if ! python -c "import kvcanary_cli.cli, triton, safetensors, hypothesis, pytest" 2>/dev/null; then
    echo "installing kvcanary and its test dependencies (torch is kept as installed)"
    python -m pip install -q -e '.[test]' || python -m pip install -q --no-deps -e .
fi
python -c "import triton; print('triton', triton.__version__)"

echo "== pytest tests/planners (compiled kernels)"
timeout 200 python -m pytest tests/planners -q -x -p no:cacheprovider 2>&1 \
    | tee "$LOGS/gpu_pytest.log"

echo "== timings"
timeout 90 python bench/gpu_check.py --json "$LOGS/gpu_timings.json" "$@" 2>&1 \
    | tee "$LOGS/gpu_timings.log"
