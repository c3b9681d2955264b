#!/usr/bin/env bash
# Measure the Llama-3-8B-like model's per-layer F, B (torch's I), W and activation memory on one GPU with
# zbsearch's profiler at tensor-parallel shares t = 1, 2, 4, 8 (one rank's share of each block, computed
# alone: no collectives), estimate the same shares for the H200 (FLOPs / (peak x MFU)), and compare them
# (bench/predicted_vs_measured.py).
#
#   OUT=/some/folder bash bench/gpu_llama_profiles.sh            on the GPU machine, from the repository root
#   OUT=/tmp/smoke bash bench/gpu_llama_profiles.sh --cpu-smoke  the same path on a CPU with a tiny llama (4 blocks)
#
# The machine lacks some pure dependencies of zbsearch (jsonschema and its own); their wheels lie in
# .wheels/ (WHEELS=...), and those that python3 cannot import already are installed into /tmp/pydeps.
# Writes into $OUT: gpu_llama_profiles.log (everything printed), profiles.tgz (the 8 profiles), and
# h200_llama3_8b.md and .csv (the comparison) when every profile was written. Each t runs in its own
# process under its own time limit, so one failure loses only its own profile. On an H200 about 3 minutes:
# a block's F at t = 1 is about 7 ms; the profiler runs each block's F, I, W and fused backward plus its
# full-recompute I on each of 13 rounds (3 warm-up, 10 timed), about 1 s per block, so t = 1 takes about
# 35 s of GPU work and t = 8 about a fifth of that, plus 10-20 s to start each process; the limits below
# keep a stuck share from taking the others' time (at most about 7.5 minutes in all).
set -euo pipefail

OUT=${OUT:?set OUT to the folder the results go to}
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.wheels}
PYDEPS=${PYDEPS:-/tmp/pydeps}
PROFILES=${PROFILES:-$(mktemp -d /tmp/zb-llama-profiles.XXXX)}  # fresh: no profile of an earlier run mixes in
SHARES=(1 2 4 8)
if [[ ${1:-} == --cpu-smoke ]]; then
    NAME=smoke-llama
    MODEL=(--model llama --layers 4 --hidden 256 --heads 8 --seq 128)
    MEASURE=(--device cpu --warmup 0 --repeats 1)
    ESTIMATE=(--estimate --gpu h200 --dtype fp32)  # the CPU measures fp32: bytes then compare
    LIMITS=(120 120 120 120)
else
    NAME=llama3-8b
    MODEL=(--model llama3-8b)
    MEASURE=(--device cuda --warmup 3 --repeats 10)
    ESTIMATE=(--estimate --gpu h200)  # bf16, as measured
    LIMITS=(150 110 90 90)  # seconds for t = 1, 2, 4, 8: about three times what each should take
fi
export PYTHONUNBUFFERED=1

install_deps() {
    local need=() whl mod
    for whl in "$WHEELS"/*.whl; do
        [[ -e $whl ]] || { echo "no wheels in $WHEELS"; return 0; }
        mod=$(basename "$whl")
        mod=${mod%%-*}
        [[ $mod == rpds_py ]] && mod=rpds
        if "$PY" -c "import $mod" 2>/dev/null; then
            echo "have $mod: $("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" \
                "${mod/rpds/rpds-py}" 2>/dev/null || echo '?')"
        else
            need+=("$whl")
        fi
    done
    ((${#need[@]})) || return 0
    echo "installing into $PYDEPS: ${need[*]##*/}"
    if ! "$PY" -m pip install --quiet --no-deps --no-index --target "$PYDEPS" "${need[@]}"; then
        echo "pip failed; unpacking the wheels instead"
        for whl in "${need[@]}"; do "$PY" -m zipfile -e "$whl" "$PYDEPS"; done
    fi
}

environment() {
    nvidia-smi 2>/dev/null || echo "(no nvidia-smi)"
    "$PY" - <<'EOF'
import platform, sys
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version(), "gpus", torch.cuda.device_count())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
import jsonschema, zbsearch.cli.app  # what `python3 -m zbsearch profile` imports
assert "ortools" not in sys.modules, "the profile path imported ortools"
print("zbsearch imports fine; jsonschema", jsonschema.__file__)
EOF
}

measure_and_estimate() {
    local i t
    mkdir -p "$PROFILES"
    for i in "${!SHARES[@]}"; do
        t=${SHARES[$i]}
        echo "== t=$t: measure (limit ${LIMITS[$i]} s) $(date -u +%T)"
        if ! timeout "${LIMITS[$i]}" "$PY" -m zbsearch profile "${MODEL[@]}" --tp "$t" -p 4 "${MEASURE[@]}" \
                -o "$PROFILES/$NAME-tp$t-measured.json"; then
            echo "!! t=$t: the measurement failed or ran out of time (see above)"
        fi
    done
    for t in "${SHARES[@]}"; do
        echo "== t=$t: estimate $(date -u +%T)"
        "$PY" -m zbsearch profile "${MODEL[@]}" --tp "$t" -p 4 "${ESTIMATE[@]}" \
            -o "$PROFILES/$NAME-tp$t-estimated.json" >/dev/null || echo "!! t=$t: the estimate failed"
    done
}

main() {
    echo "== $(date -u +%FT%TZ) ${HOSTNAME:-?} in $PWD ($NAME)"
    install_deps
    export PYTHONPATH=$PWD:$PYDEPS${PYTHONPATH:+:$PYTHONPATH}
    environment || echo "!! the environment check failed (see above); measuring all the same"
    measure_and_estimate
    if [[ $NAME == llama3-8b ]]; then  # one 70B block's share at t = 8 (torchtitan's 70B run), 4 blocks only
        echo "== llama3-70b t=8: measure 4 blocks (limit 90 s) $(date -u +%T)"
        timeout 90 "$PY" -m zbsearch profile --model llama3-70b --layers 4 --tp 8 -p 2 "${MEASURE[@]}" \
            -o "$PROFILES/llama3-70b-4l-tp8-measured.json" || echo "!! the 70B share failed or ran out of time"
        "$PY" -m zbsearch profile --model llama3-70b --layers 4 --tp 8 -p 2 "${ESTIMATE[@]}" \
            -o "$PROFILES/llama3-70b-4l-tp8-estimated.json" >/dev/null || echo "!! the 70B estimate failed"
    fi
    "$PY" bench/predicted_vs_measured.py --profiles "$PROFILES" --name "$NAME" --out "$OUT/h200_llama3_8b" ||
        echo "!! the comparison was not written"
    tar -czf "$OUT/profiles.tgz" -C "$PROFILES" . && ls -l "$PROFILES" "$OUT"
    echo "== done $(date -u +%T)"
}

mkdir -p "$OUT"
main 2>&1 | tee "$OUT/gpu_llama_profiles.log"
