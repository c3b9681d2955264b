#!/usr/bin/env bash
# Regenerate the profiler's shipped profiles:
#   cpu-gpt-small.json  a small GPT measured on this machine's CPU (source: measured; about a minute)
#   h100.json           a 7B-class GPT (32 layers, h 4096, 32 heads, s 4096, b 1) on 8 stages of H100s,
#                       estimated from the Zero Bubble paper's Table 1 FLOPs at MFU 0.4 (source: estimated),
#                       with its per-layer costs (layers) next to the stages
# On a machine with a GPU, MEASURE_GPU=1 also measures that 7B-class GPT there (bf16, flash attention)
# into gpu-<device>-gpt-7b.json.
#
# Usage: bench/make_profiles.sh [OUTDIR]   (OUTDIR defaults to the repository's profiles/)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/profiles}"
zbsearch="${ZBSEARCH:-zbsearch}"

# One torch thread: the steadiest timings on a shared machine. naive attention keeps the s x s
# probabilities for backward, the layout the paper's memory model (34h + 5as) describes.
"$zbsearch" profile --model gpt --layers 8 --hidden 256 --heads 8 --seq 256 --micro-batch 4 --vocab 2048 \
    --attention naive --dtype fp32 --device cpu --threads 1 --warmup 2 --repeats 10 \
    -p 4 -m 16 --name cpu-gpt-small -o "$out/cpu-gpt-small.json"

# Flash-style attention (sdpa): at s = 4096 nobody keeps the 5as attention matrices.
"$zbsearch" profile --estimate --gpu h100 --mfu 0.4 --dtype bf16 \
    --model gpt --layers 32 --hidden 4096 --heads 32 --seq 4096 --micro-batch 1 --vocab 32000 --attention sdpa \
    -p 8 -m 32 --name h100-gpt-7b-estimated -o "$out/h100.json"

if [[ "${MEASURE_GPU:-0}" == 1 ]]; then
    device="$(python -c 'import torch; print(torch.cuda.get_device_name(0).lower().replace(" ", "-"))')"
    "$zbsearch" profile --model gpt --layers 32 --hidden 4096 --heads 32 --seq 4096 --micro-batch 1 --vocab 32000 \
        --attention sdpa --dtype bf16 --device cuda --warmup 3 --repeats 10 \
        -p 8 -m 32 --name "gpu-$device-gpt-7b" -o "$out/gpu-$device-gpt-7b.json"
fi
