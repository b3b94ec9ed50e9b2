#!/usr/bin/env bash
# The device check of GPU decode (issues 38 and 46): one call of at most 8 minutes on a lent GPU
# machine (16 cores, torch with CUDA, no network). The first thing a session with a GPU runs.
#
#     WHEELS=.whl OUT=$OUT bash bench/gpu_check.sh     (bench/README.md: the wheels, .whl/COMMIT, the call)
#
# Each step has a budget, its timeout, written here (seconds, 480 in all):
#
#     machine 10 · cuda 20 · install 60 · decoder 25 · tests 130 · photos 40 ·
#     bench-small 70 · bench-resnet50 60 · bench-4cores 45 · profile 20
#
# Every step's exit status is kept (OUT/gpu-check-*-steps.json, rewritten after each step); the
# script goes on after a failed step and exits 1 at the end when any step failed or ran out of
# time, naming them. Without a CUDA GPU it stops at once, exit status 1. Bench rows are written to
# their JSON as each finishes, so a run cut short keeps what it measured. Everything it writes
# goes to OUT (at most 8 files: the device tool brings back no more).
#
#     GPU_CHECK_PLANT=STEP[,STEP]   those steps fail on purpose (the script's own test)
#     STEPS="tests bench"           run only these groups of steps (machine, cuda, install and
#                                   decoder always run): tests, bench, profile
set -uo pipefail

OUT=${OUT:-/tmp/out}
WHEELS=${WHEELS:-.whl}
PHOTOS=${PHOTOS:-6000}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-3}
STEPS=${STEPS:-"tests bench profile"}
export OUT WHEELS PHOTOS SECONDS_PER_RUN PYTHONUNBUFFERED=1
STATUS=$(mktemp)  # name, exit status, seconds, budget, verdict: one line a step

log() { echo "== $(date +%T) $*"; }

# run_step NAME BUDGET COMMAND...: COMMAND under its budget; its verdict kept; its exit status returned.
run_step() {
    local name=$1 budget=$2 started=$SECONDS rc verdict
    shift 2
    log "$name (budget ${budget}s)"
    if [[ ",${GPU_CHECK_PLANT:-}," == *",$name,"* ]]; then
        echo "$name: a failure planted by GPU_CHECK_PLANT"
        rc=3
    else
        timeout --kill-after=5 "$budget" "$@"
        rc=$?
    fi
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        verdict="timed out after ${budget}s"
    elif [[ $rc -ne 0 ]]; then
        verdict="failed (exit status $rc)"
    else
        verdict=ok
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - started))" "$budget" "$verdict" >> "$STATUS"
    log "$name: $verdict in $((SECONDS - started))s"
    write_steps false
    return "$rc"
}

# The steps so far as JSON (complete: whether the script reached its end).
write_steps() {
    [[ -n "${STAMP:-}" ]] || return 0
    python3 - "$STATUS" "$1" > "$OUT/gpu-check-$STAMP-steps.json" <<'EOF'
import json, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
print(json.dumps({"complete": sys.argv[2] == "true", "steps": [
    {"step": n, "exit_status": int(rc), "seconds": int(s), "budget_s": int(b), "verdict": v} for n, rc, s, b, v in rows]},
    indent=1))
EOF
}

# The verdict of every step; exit status 1 when one failed or ran out of time.
finish() {
    local failed
    write_steps true
    failed=$(awk -F'\t' '$2 != 0 {printf "%s%s (%s)", sep, $1, $5; sep=", "}' "$STATUS")
    echo
    awk -F'\t' '{printf "  %-16s %-34s %4ss of %ss\n", $1, $5, $3, $4}' "$STATUS"
    if [[ -n "$failed" ]]; then
        echo "gpu_check.sh: FAILED: $failed"
    else
        echo "gpu_check.sh: every step passed"
    fi
    exec 1>&- 2>&-
    [[ -n "${TEE:-}" ]] && wait "$TEE" 2>/dev/null  # the log written to its end
    [[ -z "$failed" ]]
    exit
}

step_machine() {
    nvidia-smi -L 2>/dev/null || echo "no nvidia-smi here"
    echo "$(nproc) cores; $(python3 --version 2>&1)"
}

step_cuda() {
    command -v nvidia-smi > /dev/null || { echo "no NVIDIA GPU: nvidia-smi is not here"; return 1; }
    python3 -c 'import sys, torch
sys.exit(0 if torch.cuda.is_available() else f"torch {torch.__version__} sees no CUDA GPU")' || return 1
    python3 -c 'import torch; print(torch.cuda.get_device_name(0), "| torch", torch.__version__, "CUDA", torch.version.cuda)'
}

step_install() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl || return 1
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 \
        || { tail -20 /tmp/install.log; return 1; }
    python3 -c 'import fastload, torch
from fastload.decode.crops import jpeg_decoder
from fastload.backends.resample_plan import native_taps
print("fastload", fastload.__version__, "| torch", torch.__version__, torch.version.cuda, "|", jpeg_decoder(),
      "| native taps:", native_taps() is not None)'
}

step_decoder() {  # nvJPEG found, decoders made, pixels in device buffers (the tests check it all again)
    ls /tmp/site/nvidia/*/lib/libnvjpeg* 2>/dev/null || echo "no libnvjpeg in the carried wheels"
    python3 - <<'EOF'
import torch
from fastload.backends.nvimgcodec_decoder import EngineDecoders, load
from tests.backends.test_gpu_device import photo_jpeg
codec, said = load()
print("nvImageCodec", codec.__version__, "| while loading:", " ".join(said.split())[:300])
decoders = EngineDecoders(torch.device("cuda", 0), 16)
print("engines:", ", ".join(decoders.engines))
stream = torch.cuda.Stream()
for engine, decoder in decoders.by_engine.items():
    image = decoder.decoder.decode([decoder.parse(photo_jpeg())], params=decoder.params, cuda_stream=stream.cuda_stream)[0]
    stream.synchronize()
    assert image is not None and image.buffer_kind == codec.ImageBufferKind.STRIDED_DEVICE, (engine, image)
    print(f"  {engine}: decoded into {image.buffer_kind}, {image.shape}")
EOF
}

step_tests() {
    set -o pipefail
    python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/backends tests/loading/test_gpu.py 2>&1 | tail -40
}

step_photos() {
    set -o pipefail
    python3 bench/make_example.py /tmp/photos --count "$PHOTOS" --classes 100 --overwrite | tail -1 &&
        python3 -m fastload.cli pack /tmp/photos -o /tmp/photos.fl --overwrite --quiet 2>&1 | tail -2
}

step_bench() {  # step_bench LABEL ARGS...: gpu_bench.py rows into OUT/gpu-STAMP-LABEL.json
    local label=$1
    set -o pipefail
    shift
    python3 bench/gpu_bench.py /tmp/photos --packed /tmp/photos.fl --seconds "$SECONDS_PER_RUN" --repeats 1 \
        --json "$OUT/gpu-$STAMP-$label.json" "$@" 2>&1 | grep -v "^  fastload {"
}

step_profile() {
    set -o pipefail
    python3 bench/nvimgcodec_profile.py /tmp/photos.fl --batches 6 \
        --variants "hardware engines first, CUDA for the rest" "CUDA alone" \
        --json "$OUT/nvimgcodec-profile-$STAMP.json" 2>&1 | grep -v "WARNING\|ROI decode with"
}

export -f log step_machine step_cuda step_install step_decoder step_tests step_photos step_bench step_profile
if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
    return 0  # sourced (the script's own test): the functions only
fi

cd "$(dirname "$0")/.." || exit 1  # the repository's root: pip install -e ., tests/
mkdir -p "$OUT"
RUN="$(date +%F)-${COMMIT:-$(cat "$WHEELS/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo tree)}"
exec > >(tee -a "$OUT/gpu-check-$RUN.log") 2>&1
TEE=$!
run_step machine 10 bash -c step_machine
if ! run_step cuda 20 bash -c step_cuda; then
    echo "gpu_check.sh: this machine has no CUDA GPU (torch.cuda.is_available() is False or there is no" \
         "nvidia-smi): run it on a lent GPU machine (nvidia-h100-x1 or nvidia-h200)"
    finish
fi
GPU=$(python3 -c 'import torch; n = torch.cuda.get_device_name(0)
print(next((m.lower() for m in ("H200", "H100", "A100", "L40S", "L4") if m in n), "gpu"))')
export STAMP="$RUN-$GPU"
write_steps false

export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
run_step install 60 bash -c step_install
# nvImageCodec dlopens nvJPEG and the CUDA runtime: the carried wheels' lib folders, and torch's own.
for lib in /tmp/site/nvidia/*/lib $(python3 -c 'import nvidia, os; [print(os.path.join(p, d, "lib")) for p in nvidia.__path__ for d in os.listdir(p)]' 2>/dev/null); do
    [[ -d "$lib" ]] && LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH

run_step decoder 25 bash -c step_decoder
[[ " $STEPS " == *" tests "* ]] && run_step tests 130 bash -c step_tests
[[ " $STEPS " == *" bench "* || " $STEPS " == *" profile "* ]] && run_step photos 40 bash -c step_photos
if [[ " $STEPS " == *" bench "* ]]; then
    run_step bench-small 70 bash -c 'step_bench small --rows torch nvimgcodec nvimgcodec-split pixel-cache --model small'
    run_step bench-resnet50 60 bash -c \
        'step_bench resnet50 --rows torch nvimgcodec nvimgcodec-split --steps model --model resnet50'
    run_step bench-4cores 45 taskset -c 0-3 bash -c \
        'step_bench resnet50-4cores --workers 4 --rows nvimgcodec nvimgcodec-split --steps model --model resnet50'
fi
[[ " $STEPS " == *" profile "* ]] && run_step profile 20 bash -c step_profile
finish
