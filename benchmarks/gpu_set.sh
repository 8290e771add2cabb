#!/usr/bin/env bash
# The GPU test set on one GPU, in three pytest processes (tests/kernels, tests/kv, the rest) so that a
# CUDA error that breaks one process's context cannot fail the parts after it. pytest-xdist spreads each
# part over WORKERS processes on the same GPU (each compiles its own kernels: an empty Triton cache is
# the slow part); without xdist the parts run serially.
#
#   bash benchmarks/gpu_set.sh            # the default set: -m "gpu and not slow" (about 2.5 min on the H200)
#   bash benchmarks/gpu_set.sh slow 14    # the slow set: -m "gpu and slow" (about 7 min; run it in its own call)
#
# Logs go to $OUT (or ./gpu-set-logs). Exit status: non-zero when any part failed or hit its limit.
set -u
kind=${1:-default}
workers=${2:-8}
case $kind in
  default) marks="gpu and not slow"; limits=(330 140 100) ;;
  slow) marks="gpu and slow"; limits=(420 120 150) ;;
  *) echo "usage: gpu_set.sh [default|slow] [workers]" >&2; exit 2 ;;
esac
out=${OUT:-gpu-set-logs}
mkdir -p "$out"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
xdist=()
python3 -c "import xdist" 2>/dev/null && xdist=(-n "$workers")
echo "code $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
status=0
part() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -m "$marks" "${xdist[@]}" --durations=10 "$@" > "$out/$name.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== $name: rc $rc, $((SECONDS - t0)) s (limit $limit s): $(grep -E '^(FAILED|ERROR) ' "$out/$name.log" | head -5 | tr '\n' ' ')$(grep -E ' in [0-9.]+s' "$out/$name.log" | tail -1)"
}
part kernels "${limits[0]}" tests/kernels
part kv "${limits[1]}" tests/kv
part rest "${limits[2]}" tests --ignore=tests/kernels --ignore=tests/kv --ignore=tests/filecodec
exit $status
