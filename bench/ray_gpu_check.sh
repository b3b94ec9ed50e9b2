#!/usr/bin/env bash
# The device check of decoding on Ray (issue 40's second target), one script of at most ~6 minutes
# for a lent GPU machine (16 cores, torch with CUDA, no network): the training process limited to
# 2 cores (taskset) and a Ray node on the other 14 against the processes mode on all 16, data
# alone and under a ResNet-18-shaped step (bench/gpu_bench.py's rows, one run each).
#
# Ray is not on that machine and its wheel (79 MB) is over what a call carries (64 MiB), so it
# travels slimmed (bench/slim_wheel.py drops its Java jars), beside jsonschema and its needs and
# lmdb, for the machine's Python (3.12):
#
#     w='--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .whl-ray'
#     python3 -m pip download $w ray==2.60.0 jsonschema jsonschema-specifications referencing rpds-py lmdb==3.0.0
#     python bench/slim_wheel.py .whl-ray/ray-2.60.0-*.whl --drop 'ray/jars/*' '*.js.map'
#
# and the call runs, with carry [".devtree", ".whl-ray"] (.devtree: `git archive HEAD`):
#
#     cd .devtree && WHEELS=../.whl-ray OUT=$OUT bash bench/ray_gpu_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
WHEELS=${WHEELS:-../.whl-ray}
PHOTOS=${PHOTOS:-6000}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-6}
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
mkdir -p "$OUT"
log() { echo "== $(date +%T) $*"; }

log "machine"
nvidia-smi -L; nproc; python3 --version
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH

log "install fastload (native decoder built here)"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
python3 -c 'import fastload, ray, torch; print(fastload.__version__, ray.__version__, torch.__version__)' || exit 1

log "photos and pack"
python3 bench/make_example.py /tmp/photos --count "$PHOTOS" --classes 100 --overwrite | tail -1
python3 -m fastload.cli pack /tmp/photos -o /tmp/photos.fl --overwrite --quiet 2>&1 | tail -2

stamp="$(date +%F)-$(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo tree)"
log "processes mode on all 16 cores"
timeout 120 python3 bench/gpu_bench.py /tmp/photos --packed /tmp/photos.fl --seconds "$SECONDS_PER_RUN" --repeats 1 \
    --rows processes --model small --json "$OUT/gpu-$stamp-ray-baseline.json" 2>&1 | grep -v "^  fastload {" | tail -5

log "a Ray node on cores 2-15, the training process on cores 0-1"
taskset -c 2-15 ray start --head --num-cpus=14 --include-dashboard=false --disable-usage-stats > "$OUT/ray-start.log" 2>&1 \
    || { tail -20 "$OUT/ray-start.log"; exit 1; }
timeout 180 taskset -c 0-1 python3 bench/gpu_bench.py /tmp/photos --packed /tmp/photos.fl --seconds "$SECONDS_PER_RUN" \
    --repeats 1 --workers 2 --rows ray --ray-workers 14 --ray-address auto --model small \
    --json "$OUT/gpu-$stamp-ray-2cores.json" 2>&1 | grep -v "^  fastload {" | tail -5
ray stop --force > /dev/null 2>&1
log "done"
