#!/usr/bin/env bash
# The device check of GPU decode (issue 38), one script of at most ~7 minutes for a lent GPU machine
# (16 cores, torch with CUDA, no network). Wheels the machine lacks travel in WHEELS (default
# ../.whl): nvidia-nvimgcodec-cu13, nvidia-nvjpeg (13.0.x for a CUDA 13.0 driver) and lmdb, for
# its Python. It installs them and fastload (the native decoder built there), runs the CUDA tests,
# then bench/gpu_bench.py on generated photos: data alone, a ResNet-18-shaped step and ResNet-50,
# each loader beside the step's own headspace. Everything it writes goes to $OUT (default /tmp/out).
#
#     WHEELS=../.whl OUT=/tmp/out bash bench/gpu_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
WHEELS=${WHEELS:-../.whl}
PHOTOS=${PHOTOS:-6000}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-4}
STEPS=${STEPS:-"tests bench"}  # any of: tests bench profile
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
log() { echo "== $(date +%T) $*"; }

log "machine"
nvidia-smi -L; nproc; python3 --version
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 1
export PYTHONPATH=/tmp/site
# nvImageCodec dlopens nvJPEG and the CUDA runtime: the wheels' lib folders, and torch's own.
for lib in /tmp/site/nvidia/*/lib $(python3 -c 'import nvidia, os; [print(os.path.join(p, d, "lib")) for p in nvidia.__path__ for d in os.listdir(p)]' 2>/dev/null); do
    [ -d "$lib" ] && LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH

log "install fastload (native decoder built here)"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
python3 -c 'import fastload, torch; from fastload.decode.crops import jpeg_decoder; print(fastload.__version__, torch.__version__, torch.version.cuda, jpeg_decoder())'
python3 - <<'EOF'
import torch
from fastload.backends.nvimgcodec_decoder import RegionDecoder, load
codec, said = load()
print("nvImageCodec", codec.__version__, "| while loading:", " ".join(said.split())[:300])
RegionDecoder(torch.device("cuda", 0), 16)
print("GPU decoder made")
EOF

if [[ " $STEPS " == *" tests "* ]]; then
log "CUDA tests"
timeout 90 python3 -m pytest -q -p no:cacheprovider -x -m gpu tests/backends/test_nvimgcodec.py tests/loading/test_gpu.py \
    2>&1 | tee "$OUT/gpu-tests.log" | tail -15
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/backends/test_crop_resample.py 2>&1 | tail -2
fi

log "photos and pack"
python3 bench/make_example.py /tmp/photos --count "$PHOTOS" --classes 100 --overwrite | tail -1
fastload pack /tmp/photos -o /tmp/photos.fl --overwrite --quiet 2>&1 | tail -2 || python3 -m fastload.cli pack /tmp/photos -o /tmp/photos.fl --overwrite 2>&1 | tail -2

stamp="$(date +%F)-$(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo tree)"
if [[ " $STEPS " == *" profile "* ]]; then
log "profile: where a GPU-decoded batch's time goes"
timeout 60 python3 bench/nvimgcodec_profile.py /tmp/photos.fl --batches 8 --variants "default, whole images" "hardware engines only, whole images" --json "$OUT/nvimgcodec-profile-$stamp.json" 2>&1 | grep -v "WARNING\|ROI decode with" | tail -12
fi
if [[ " $STEPS " == *" bench "* ]]; then
log "bench: data and a ResNet-18-shaped step"
timeout 180 python3 bench/gpu_bench.py /tmp/photos --packed /tmp/photos.fl --seconds "$SECONDS_PER_RUN" --repeats 1 \
    --rows torch processes nvimgcodec nvimgcodec-split pixel-cache --model small --json "$OUT/gpu-$stamp-small.json" 2>&1 \
    | grep -v "^  fastload {" | tail -19
log "bench: ResNet-50"
timeout 80 python3 bench/gpu_bench.py /tmp/photos --packed /tmp/photos.fl --seconds "$SECONDS_PER_RUN" --repeats 1 \
    --rows processes nvimgcodec nvimgcodec-split --steps model --model resnet50 --json "$OUT/gpu-$stamp-resnet50.json" 2>&1 \
    | grep -v "^  fastload {" | tail -6
log "bench: ResNet-50, the training process on 4 cores"
timeout 70 taskset -c 0-3 python3 bench/gpu_bench.py /tmp/photos --packed /tmp/photos.fl --seconds "$SECONDS_PER_RUN" \
    --repeats 1 --workers 4 --rows nvimgcodec nvimgcodec-split --steps model --model resnet50 \
    --json "$OUT/gpu-$stamp-resnet50-4cores.json" 2>&1 | grep -v "^  fastload {" | tail -5
fi
log "done"
