#!/usr/bin/env bash
# learning.py on one CUDA GPU in bf16 at a larger budget than the CPU's, as one prepared command that
# ends within 10 minutes (the device machines' limit per command) and installs nothing from a network.
#
#   MODEL_DIR=/path/to/smollm2-135m bash benchmarks/gpu_learning.sh [extra learning.py flags]
#
# What the machine must have: python3 with torch (CUDA), transformers and peft (the GPU images do), the
# project's other pure-Python dependencies (gymnasium, alfworld, textworld, tatsu, rapidfuzz, orjson, ...)
# installed or carried as wheels in .whl/ (installed here with --no-index into /tmp/site), and the real
# model as a converted folder (trainer/models.py writes it into $AGENTGYM_OPSD_CACHE/models/smollm2-135m:
# 538 MB in float32, 269 MB in bf16). The device tool carries at most 64 MiB of files, so the model cannot
# travel with the checkout today: MODEL_DIR must already be on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python3 - <<'PY' || { echo "gpu_learning.sh: no CUDA GPU, or a package is missing (see the list above)" >&2; exit 2; }
import importlib, sys, torch
missing = [m for m in ("transformers", "peft", "gymnasium", "alfworld", "textworld") if importlib.util.find_spec(m) is None]
if missing or not torch.cuda.is_available():
    print("missing:", missing, "cuda:", torch.cuda.is_available(), file=sys.stderr); sys.exit(1)
print(torch.cuda.get_device_name(0), "torch", torch.__version__)
PY
MODEL="${MODEL_DIR:-smollm2-135m}"
OUT="${OUT:-runs}/learning-gpu"
# A larger budget than the CPU default (4 updates x 4 tasks x 4, 50 held-out games): every weight trained,
# 12 updates of 8 tasks x 8 episodes, 200 held-out games; one run at a time on the one GPU. Not yet run (no GPU
# was lent to this project's sessions), so whether it ends inside 570 s is not known.
timeout 570 python3 -m benchmarks.learning --model "$MODEL" --device cuda --jobs 1 --train-layers 0 \
    --steps 12 --tasks-per-step 8 --group-size 8 --eval-games 200 --sft-episodes 800 --sft-epochs 2 \
    --lr 5e-6 --sft-lr 5e-5 --out "$OUT" --no-progress "$@"
