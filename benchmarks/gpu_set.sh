#!/usr/bin/env bash
# The GPU test set on one GPU, in three pytest processes (tests/kernels, tests/kv, the rest) so that a
# CUDA error that breaks one process's context cannot fail the parts after it. pytest-xdist spreads each
# part over WORKERS processes on the same GPU (they share one Triton cache, empty when the part starts: the builds
# are the slow part); without xdist the parts run serially.
#
#   bash benchmarks/gpu_set.sh            # the default set: -m "gpu and not slow" (257 s on an H100, 16 workers)
#   bash benchmarks/gpu_set.sh slow 14    # the slow set: -m "gpu and slow" (about 7 min; run it in its own call)
#   bash benchmarks/gpu_set.sh hash       # the "files" hash of this tree (its log's first line names the one it ran)
#
# Logs go to $OUT (or ./gpu-set-logs). Exit status: non-zero when any part failed or hit its limit.
set -u
kind=${1:-default}
workers=${2:-8}
case $kind in
  default) marks="gpu and not slow"; limits=(400 140 100) ;;  # kernels: 528 tests, 175 s on an H100 with one cache (2026-12-06)
  slow) marks="gpu and slow"; limits=(420 120 150) ;;
  hash) ;;
  *) echo "usage: gpu_set.sh [default|slow|hash] [workers]" >&2; exit 2 ;;
esac
# The device's copy of .git can be older than the tree sent (it then names an old commit "with local changes"):
# "files" hashes the Python and JSON files under src/ and tests/ themselves (the kernel tables choose what runs; JSON
# since 2026-12-06); `bash benchmarks/gpu_set.sh hash` prints the same hash here, to match a log with the commit sent.
files_hash() { find src tests -type f \( -name '*.py' -o -name '*.json' \) | LC_ALL=C sort | xargs cat | sha1sum | cut -c1-12; }
if [ "$kind" = hash ]; then files_hash; exit 0; fi
out=${OUT:-gpu-set-logs}
mkdir -p "$out"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
xdist=()
# worksteal: a worker that runs out takes half of a busy one's queue (xdist's default hands out fixed chunks, and one
# worker ran three long dense11 tests in a row while the others sat idle, 2026-12-06)
python3 -c "import xdist" 2>/dev/null && xdist=(-n "$workers" --dist worksteal)
echo "code $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)'); files $(files_hash)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
status=0
part() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  # -v: each test's outcome by name, so a part cut off at its limit shows which tests had not finished
  timeout "$limit" python3 -m pytest -v -p no:cacheprovider -m "$marks" "${xdist[@]}" --durations=10 "$@" > "$out/$name.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== $name: rc $rc, $((SECONDS - t0)) s (limit $limit s): $(grep -E '^(FAILED|ERROR) ' "$out/$name.log" | head -5 | tr '\n' ' ')$(grep -E ' in [0-9.]+s' "$out/$name.log" | tail -1)"
}
part kernels "${limits[0]}" tests/kernels
part kv "${limits[1]}" tests/kv
part rest "${limits[2]}" tests --ignore=tests/kernels --ignore=tests/kv --ignore=tests/filecodec
exit $status
