#!/usr/bin/env bash
# The GPU acceptance run: about 6 minutes on one GPU (BUDGET_S), reports under results/gpu/.
#   1. attnlab bench gpu: every mechanism trains 50 steps in the GPU's default precision, eager
#      and compiled, decodes with the KV cache; SDPA kernels; tokens/s and MFU vs nanoGPT
#   2. with several GPUs: DDP and FSDP2 over all of them against one process (multi_gpu.txt)
#   3. the time left: `attnlab study kv-bias --preset paper`, seeds in parallel, resumable
#      (run the script again to continue it)
# --smoke: steps 1-3 at toy size on whatever device is here (the test suite runs it on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=""
[ "${1:-}" = "--smoke" ] && smoke="--smoke"
bin=${ATTNLAB:-attnlab}
python=${PYTHON:-python3}
out=${OUT:-results/gpu}
budget=${BUDGET_S:-360}
start=$(date +%s)

device=auto
[ -n "$smoke" ] && device=cpu
"$bin" bench gpu $smoke --device "$device" --out "$out"

gpus=$("$python" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$gpus" -gt 1 ]; then
  runs="$out/multi_gpu_runs"
  recipe=(--preset kv-bias-shakespeare-char max_iters=200 eval_interval=100 log_interval=10 tensorboard=false)
  rm -rf "$runs"
  "$bin" train --out "$runs/one" "${recipe[@]}" > /dev/null
  "$python" -m torch.distributed.run --standalone --nproc_per_node="$gpus" -m attnlab train --out "$runs/ddp" "${recipe[@]}" > /dev/null
  "$python" -m torch.distributed.run --standalone --nproc_per_node="$gpus" -m attnlab train --out "$runs/fsdp" "${recipe[@]}" fsdp=true > /dev/null
  for run in one ddp fsdp; do
    echo "$run: $(tail -n 1 "$runs/$run/metrics.csv")"
  done > "$out/multi_gpu.txt"
  cat "$out/multi_gpu.txt"
fi

left=$(( budget - ($(date +%s) - start) ))
if [ -n "$smoke" ]; then
  "$bin" study kv-bias-4l --preset ci --seeds 1 --out "$out/study-smoke" > /dev/null
elif [ "$left" -gt 60 ]; then
  # several small runs share a GPU well; SIGINT lets each stop at a checkpoint
  timeout --signal=INT "$left" "$bin" study kv-bias --preset paper --jobs "${JOBS:-$(( gpus * 4 ))}" \
    --out "$out/kv-bias-paper" || echo "study stopped after ${left} s: run this script again to resume it"
fi
