#!/usr/bin/env bash
# The pending stack's device call (README.md here), one step after another, each under its own time limit, so a
# slow or hanging step cannot take the rest of the call with it; a summary table last. Run on the device, in the
# stacked tree, with .carry holding kv_pool.pt (benchmarks/kv.py pool) and main/ (main's src and benchmarks: the
# A/B's other side). Steps: gpu_set, bits, kv, d11 (default: all, in that order; the GPU set first because nothing
# merges without it).
#
#   OUT=$OUT bash benchmarks/pending/call.sh                # all four steps (about 9 minutes on an H100)
#   OUT=$OUT bash benchmarks/pending/call.sh gpu_set bits   # only these
set -u
out=${OUT:?set OUT to the folder that comes back}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(gpu_set bits kv d11)
summary=()
step() {  # name, time limit (s), command...
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  rc=$?
  summary+=("| $name | $rc | $((SECONDS - t0)) |")
}
for s in "${steps[@]}"; do
  case $s in
    gpu_set) step gpu_set 560 env OUT="$out/gpu_set" bash benchmarks/gpu_set.sh ;;
    bits) step bits_main 120 env PYTHONPATH=.carry/main/src python3 benchmarks/probes/pool_bits.py --save "$out/main_bits.pt"
          step bits 120 env PYTHONPATH=src python3 benchmarks/probes/pool_bits.py --against "$out/main_bits.pt" ;;
    kv) for r in . .carry/main; do  # kv.py puts its own tree's src first: main's copy times main's kernels
          step "kv_$( [ "$r" = . ] && echo branch || echo main )" 150 python3 "$r/benchmarks/kv.py" speed \
            --pool .carry/kv_pool.pt --tokens 16384 4096 --batches 1 4 16 64 --mixed 64 \
            --pool-variants 4,32,4,96,1,2 4,32,16,96,1,2
        done ;;
    d11) step d11 150 env PYTHONPATH=src python3 benchmarks/dense11_step.py --no-v1 --layers 8 --ms 2,8,16 \
           --gemv bn=64,bk=128,dot=mma,prefetch=1,mb=16 --gemv bn=64,bk=128,dot=mma,prefetch=2,mb=16 \
           --gemv bn=64,bk=128,dot=mma,prefetch=1,x_prefetch=1,mb=16 \
           --gemv bn=64,bk=128,dot=mma,prefetch=2,x_prefetch=1,mb=16 ;;
    *) echo "unknown step $s (gpu_set, bits, kv, d11)" >&2; exit 2 ;;
  esac
done
for f in gpu_set bits kv_branch kv_main d11; do
  [ -f "$out/$f.txt" ] && { echo "=== $f (last lines)"; tail -n 14 "$out/$f.txt"; }
done
echo "| step | exit status | seconds |"
echo "|---|---|---|"
printf '%s\n' "${summary[@]}"
