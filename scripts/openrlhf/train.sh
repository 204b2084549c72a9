#!/usr/bin/env bash
# Train with OpenRLHF 0.11.2 on one GPU node: the papers' settings (trainer/openrlhf/presets.py).
#
#   scripts/openrlhf/train.sh FAMILY MODEL METHOD [-- extra OpenRLHF flags]
#
#   FAMILY  alfworld | webshop | searchqa
#   MODEL   qwen2.5-3b (Qwen2.5-3B-Instruct) | qwen3-1.7b (Qwen3-1.7B)
#   METHOD  grpo | gigpo | stepopsd | agentopsd
#
# Environment (all optional):
#   MODEL_PATH   local weights (default: the model's hub id, downloaded by OpenRLHF)
#   GPUS         GPUs of the node (default 8)
#   OUT          output folder (default runs/openrlhf/FAMILY-MODEL-METHOD)
#   TRAIN_SEEDS, EVAL_SEEDS   task seeds of the prompt datasets (seed s plays task s % N)
#   ENV_OPTIONS  extra --option KEY=VALUE for the env, e.g. "--option source=alfworld --option data_dir=/data/alfworld"
#                (Search-QA needs its retrieval server: "--option server_url=http://HOST:8000", reachable from
#                every node; start it with `agentgym-opsd serve-retrieval --index DIR`)
#   DRY_RUN=1    check the command with OpenRLHF's parser and stop (no GPU needed)
#
# Installing on a GPU machine: see trainer/openrlhf/README.md.
set -euo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,20p' "$0"
    exit 2
fi
FAMILY=$1 MODEL=$2 METHOD=$3
shift 3
[ "${1:-}" = "--" ] && shift

OUT=${OUT:-runs/openrlhf/$FAMILY-$MODEL-$METHOD}
GPUS=${GPUS:-8}
ENV_OPTIONS=${ENV_OPTIONS:-}
case "$FAMILY" in
    alfworld)
        ENV_ID=agentgym/ALFWorld-All-v0
        TRAIN_OPTS="--option split=train" EVAL_OPTS="--option split=valid_unseen"
        TRAIN_SEEDS=${TRAIN_SEEDS:-0:120} EVAL_SEEDS=${EVAL_SEEDS:-0:60} ;;
    webshop)
        ENV_ID=agentgym/WebShop-v0
        TRAIN_OPTS="--option split=train" EVAL_OPTS="--option split=test"
        TRAIN_SEEDS=${TRAIN_SEEDS:-0:512} EVAL_SEEDS=${EVAL_SEEDS:-0:100} ;;
    searchqa)
        ENV_ID=agentgym/SearchQA-NQ-v0
        TRAIN_OPTS="--option split=train" EVAL_OPTS="--option split=test"
        TRAIN_SEEDS=${TRAIN_SEEDS:-0:4096} EVAL_SEEDS=${EVAL_SEEDS:-0:256} ;;
    *)
        echo "FAMILY must be alfworld, webshop or searchqa, got $FAMILY" >&2
        exit 2 ;;
esac

mkdir -p "$OUT"
if [ -z "${DRY_RUN:-}" ] || [ ! -f "$OUT/train.jsonl" ]; then
    # shellcheck disable=SC2086  # the option lists are word lists on purpose
    agentgym-opsd openrlhf-prompts --env "$ENV_ID" $TRAIN_OPTS $ENV_OPTIONS --seeds "$TRAIN_SEEDS" --out "$OUT/train.jsonl"
    # shellcheck disable=SC2086
    agentgym-opsd openrlhf-prompts --env "$ENV_ID" $EVAL_OPTS $ENV_OPTIONS --seeds "$EVAL_SEEDS" --out "$OUT/eval.jsonl"
fi

exec agentgym-opsd train-openrlhf --preset "$FAMILY" --model-preset "$MODEL" --method "$METHOD" \
    ${MODEL_PATH:+--model "$MODEL_PATH"} --prompts "$OUT/train.jsonl" --eval-prompts "$OUT/eval.jsonl" \
    --gpus "$GPUS" --out "$OUT" ${DRY_RUN:+--dry-run} -- "$@"
