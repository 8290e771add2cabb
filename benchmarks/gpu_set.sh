#!/usr/bin/env bash
# The GPU test set on one GPU, in three pytest processes (tests/kernels, tests/kv, the rest) so that a
# CUDA error that breaks one process's context cannot fail the parts after it. pytest-xdist spreads each
# part over WORKERS processes on the same GPU (they share one Triton cache, empty when the part starts: the builds
# are the slow part); without xdist the parts run serially.
#
#   bash benchmarks/gpu_set.sh            # the default set: -m "gpu and not slow" (380-399 s on an H100, 16 workers)
#   bash benchmarks/gpu_set.sh default 16 parallel  # the three parts at once (kv and the rest with a quarter of the
#                                         # workers each) in the kernels part's tail, where its long tests hold few cores
#   bash benchmarks/gpu_set.sh slow 14    # the slow set: -m "gpu and slow" (about 7 min; run it in its own call)
#   bash benchmarks/gpu_set.sh hash       # the "files" hash of this tree (its log's first line names the one it ran)
#
# Logs go to $OUT (or ./gpu-set-logs). Exit status: non-zero when any part failed or hit its limit.
set -u
kind=${1:-default}
workers=${2:-8}
together=${3:-}  # "parallel": the three parts at once
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
python3 -c "import xdist" 2>/dev/null && xdist=(yes)
echo "code $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)'); files $(files_hash)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
part() {  # name, limit, workers, pytest args...: the part's log and exit status in $out
  local name=$1 limit=$2 n=$3; shift 3
  local t0=$SECONDS xd=()
  [ ${#xdist[@]} -gt 0 ] && xd=(-n "$n" --dist worksteal)
  # -v: each test's outcome by name, so a part cut off at its limit shows which tests had not finished; every test of
  # 5 s or more with its time (the set ran 346-388 s on an H100 on 2026-12-06, over its 6 minutes: what to cut)
  timeout "$limit" python3 -m pytest -v -p no:cacheprovider -m "$marks" "${xd[@]}" --durations=0 --durations-min=5 "$@" > "$out/$name.log" 2>&1
  echo "$? $((SECONDS - t0))" > "$out/$name.rc"
}
report() {  # name, limit: one line a part; non-zero when it failed or hit its limit
  local name=$1 limit=$2 rc secs
  read -r rc secs < "$out/$name.rc"
  rm -f "$out/$name.rc"
  echo "== $name: rc $rc, $secs s (limit $limit s): $(grep -E '^(FAILED|ERROR) ' "$out/$name.log" | head -5 | tr '\n' ' ')$(grep -E ' in [0-9.]+s' "$out/$name.log" | tail -1)"
  return $(( rc != 0 ))
}
names=(kernels kv rest)
args=("tests/kernels" "tests/kv" "tests --ignore=tests/kernels --ignore=tests/kv --ignore=tests/filecodec")
if [ "$together" = parallel ]; then
  # separate processes still: a CUDA error that breaks one part's context cannot fail the others; kv and the rest
  # with fewer workers and more time (they share the cores with the kernels part's builds)
  side=$(( workers / 4 > 1 ? workers / 4 : 1 ))
  limits=("${limits[0]}" $(( limits[1] * 2 )) $(( limits[2] * 3 )))
  part kernels "${limits[0]}" "$workers" ${args[0]} &
  part kv "${limits[1]}" "$side" ${args[1]} &
  part rest "${limits[2]}" "$side" ${args[2]} &
  wait
else
  for i in 0 1 2; do part "${names[$i]}" "${limits[$i]}" "$workers" ${args[$i]}; done
fi
status=0
for i in 0 1 2; do report "${names[$i]}" "${limits[$i]}" || status=1; done
exit $status
