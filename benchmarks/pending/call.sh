#!/usr/bin/env bash
# The pending work's device call (README.md here), one step after another, each under its own time limit, so a
# slow or hanging step cannot take the rest of the call with it; a summary table last. Run on the device, in the
# stacked tree. Steps: gpu_set (first: nothing merges without it), scale_d11 (h112: the 7B with dense11 beside
# bf16, its step in a CUDA graph), long (h115: unpack + cuBLAS in chunks, each chunk's unpack overlapped with the
# GEMM before it on a second stream, at M = 65-4608 on the merged 7B matrices), sweep_long (sweep round 40: those
# configs on every 7B shape class at M 65-2048, with a table of the fastest: its own call), ttft7b (issue 38: the 7B's
# compiled first token with bf16, fixed12 and dense11); and the A/B tools of the 2026-12-05 stack, which need .carry with kv_pool.pt
# (benchmarks/kv.py pool) and main/ (main's src and benchmarks): bits (pool_bits.py main against the branch), kv
# (kv.py speed, the branch's and main's), d11 (dense11_step.py, four MMA variants).
#
#   OUT=$OUT bash benchmarks/pending/call.sh                # gpu_set (5-8 minutes on an H100: its own call)
#   OUT=$OUT bash benchmarks/pending/call.sh long           # the next call (about 4 minutes)
#   OUT=$OUT bash benchmarks/pending/call.sh gpu_set kv     # only these
#   OUT=$OUT bash benchmarks/pending/call.sh d11 kv sweep05 # an H200's call: dense11 depth 2, the pool by batch, the 0.5B
#   OUT=$OUT bash benchmarks/pending/call.sh ttft7b dit     # first tokens; FLUX's step (carry .carry/whl: diffusers 0.42.1
#                                                           # and importlib_metadata wheels, `pip download` in README.md)
set -u
out=${OUT:?set OUT to the folder that comes back}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(gpu_set)
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
    gpu_set) step gpu_set 590 env OUT="$out/gpu_set" bash benchmarks/gpu_set.sh default 16  # 16 workers: 16 cores
             tar czf "$out/gpu_set_logs.tgz" -C "$out" gpu_set && rm -rf "$out/gpu_set" ;;  # one file: a call brings back 8
    stage) # the first part of SmolLM2's GGUF (98 MB: over a call's 64 MiB) kept on the warm machine for `quality`
           # (.carry/q/gguf_a here; .carry/stage is in no later call's carry, so it stays)
           mkdir -p .carry/stage && cp .carry/q/gguf_a .carry/stage/gguf_a && ls -l .carry/stage > "$out/stage.txt" ;;
    quality) # issue 35's quality target through the fused decode kernels: SmolLM2-135M, perplexity over 65,536 tokens
             # and 5,700 MMLU questions scored 32 tokens a forward (--score-chunk), bf16 beside fixed12, dense11 and
             # exact-dense11 (QUALITY_MODES=... for others); the GGUF from .carry/stage/gguf_a (`stage`, the call before) and .carry/q2/gguf_b, the
             # gguf package in .carry/q2/py, the text and MMLU in .carry/q2/data
             cat .carry/stage/gguf_a .carry/q2/gguf_b > /tmp/smol.gguf
             echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/smol.gguf" | sha256sum -c \
               > "$out/gguf_check.txt" 2>&1 || { summary+=("| quality | gguf parts do not match | 0 |"); continue; }
             step quality 560 env PYTHONPATH=src:.carry/q2/py GLYD_SMOLLM2_GGUF=/tmp/smol.gguf GLYD_CACHE=/tmp/gc \
               python3 -c 'import os, sys; from glyd.apps.smollm2 import bf16_folder; from glyd.cli import main
sys.exit(main(["eval", str(bf16_folder()), "--modes", os.environ.get("QUALITY_MODES", "fixed12,dense11,exact-dense11"),
               "--score-chunk", "32",
               "--no-decode", "--text", ".carry/q2/data/text/tinyshakespeare.txt", "--mmlu-dir", ".carry/q2/data/mmlu",
               "--mmlu-per-subject", "100", "--mmlu-batch", "32", "--ppl-tokens", "65536", "--json-out",
               sys.argv[1]]))' "$out/quality.json" ;;
    gpu_set_par) # the three parts at once (304 s on an H100, 2026-12-06)
                 step gpu_set 590 env OUT="$out/gpu_set" bash benchmarks/gpu_set.sh default 16 parallel
                 tar czf "$out/gpu_set_logs.tgz" -C "$out" gpu_set && rm -rf "$out/gpu_set" ;;
    bits) step bits_main 120 env PYTHONPATH=.carry/main/src python3 benchmarks/probes/pool_bits.py --save "$out/main_bits.pt"
          step bits 120 env PYTHONPATH=src python3 benchmarks/probes/pool_bits.py --against "$out/main_bits.pt" ;;
    kv) # the pool at 2-16 programs an SM, and with programmatic dependent launch (h118: 1 the combine, 2 the split
        # kernel too) at 4 and 16; main's copy (.carry/main, when carried) times main's kernels at the same launches
        for r in . .carry/main; do
          [ -d "$r/src" ] || continue
          pv="4,32,4,96,1,2 4,32,16,96,1,2 4,32,2,96,1,2 4,32,8,96,1,2"
          [ "$r" = . ] && pv="$pv 4,32,4,96,1,2,1 4,32,16,96,1,2,1 4,32,4,96,1,2,2 4,32,16,96,1,2,2"
          step "kv_$( [ "$r" = . ] && echo branch || echo main )" 150 env PYTHONPATH="$r/src" python3 "$r/benchmarks/kv.py" speed \
            --pool .carry/kv_pool.pt --tokens 16384 4096 --batches 1 4 16 64 --mixed 64 --pool-variants $pv
        done ;;
    d11) # depth 1 against 2 (the H200 table's rows), and bn 32 with 2 warps: twice the programs (qkv and o fill 0.3-0.4
         # of a wave at bn 64 and M 16; x_prefetch, slower on the H100, left out)
         step d11 150 env PYTHONPATH=src python3 benchmarks/dense11_step.py --no-v1 --layers 8 --ms 2,8,16 \
           --gemv bn=64,bk=128,dot=mma,prefetch=1,mb=16 --gemv bn=64,bk=128,dot=mma,prefetch=2,mb=16 \
           --gemv bn=32,bk=128,dot=mma,prefetch=1,mb=16,warps=2 \
           --gemv bn=32,bk=128,dot=mma,prefetch=2,mb=16,warps=2 ;;
    d11_exc) # dense11 (issue 35) with 0.1% of weights 1e-30, all dense11 exceptions (h128's chunked rounds): an
             # upper bound only, 200x real weights' dense11 exceptions (~0.0005%: its escapes take the rest)
             step d11_exc 200 env PYTHONPATH=src python3 benchmarks/dense11_step.py --no-v1 --layers 8 --ms 1,16,32,64 \
               --exc 0.001 ;;
    scale_d11) step scale_d11 240 env PYTHONPATH=src python3 benchmarks/scale.py --sizes qwen2.5-7b \
                 --variants bf16,dense11 --batches 1,16,64 --no-capacity --out "$out/scale_d11" ;;
    long) step long 260 env PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 benchmarks/probes/probe_ws_long.py \
            --budget-s 200 --ms 65,128,256,512,2048,4608 --out "$out/long" --variants \
            long.c512.o,long.c1024,long.c1024.o,long.c2048,long.c2048.o,long.c4096.o ;;
    sweep_long) step sweep_long 560 env SWEEP_ROUND=40 PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 \
                  benchmarks/sweep_shapes.py --shapes k/v,q/o,gate/up,down,lm_head,qkv,gate_up --ms 65,128,256,2048 \
                  --out "$out/sweep_long" --table "$out/sweep_long/table.json" ;;
    sweep_kv) step sweep_kv 300 env PYTHONPATH=src python3 benchmarks/sweep_kv.py --pool .carry/kv_pool.pt \
                --out "$out/sweep_kv" --table "$out/sweep_kv/table.json" ;;  # the pool's configs by batch -> table rows
    sweep05) # the 0.5B's linears (issue 38: its decode <= 1.00x bf16 at 1-8 sequences) with real weights' 0.1% of
             # exceptions (before 2026-12-06 this step ran normal weights' 0.008%), every candidate the table lists
             step sweep05 270 env SWEEP_ROUND=table PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 \
               benchmarks/sweep_shapes.py --shapes 0.5b.down,0.5b.qkv,0.5b.o,0.5b.gate_up,0.5b.lm_head --ms 1,2,4,8 \
               --exc 0.001 --out /tmp/sweep05 --table "$out/sweep05_table.json" ;;
    sweep41) # the small matrices' GEMV without partials (issue 38: the 0.5B's qkv and o ~1 us over bf16), in the
             # time the call has left (saved after each shape)
             step sweep41 $(( 585 - SECONDS > 60 ? 585 - SECONDS : 60 )) env SWEEP_ROUND=41 PYTHONPATH=src \
               TRITON_CACHE_DIR="$(mktemp -d)" python3 benchmarks/sweep_shapes.py --shapes 0.5b.qkv,0.5b.o,k/v \
               --ms 1,2,4,8 --out "$out/sweep41" ;;
    sweep42) # the ws tile past M = 64 against unpack + cuBLAS (issue 38: the 65-255 bucket) on the 7B's and 32B's gate_up
             # and down, 0.1% of weights exceptions (real weights: 0.02-0.13%), in the time the call has left (saved after each shape)
             step sweep42 $(( 585 - SECONDS > 60 ? 585 - SECONDS : 60 )) env SWEEP_ROUND=42 PYTHONPATH=src \
               TRITON_CACHE_DIR="$(mktemp -d)" python3 benchmarks/sweep_shapes.py --shapes gate_up,down,32b.gate_up,32b.down \
               --ms 65,128,192 --exc 0.001 --out "$out/sweep42" ;;
    exc_decode) # the table's choice at decode sizes with real weights' share of exceptions (0.1%) and with almost none
                # (normal weights): every decode number so far was measured on the latter
                # (round 43 adds the ws tile's long-M exception steps where the table runs it)
                for e in 0 0.001; do
                  step "exc_decode_$e" 200 env SWEEP_ROUND=$( [ $e = 0 ] && echo default || echo 43 ) PYTHONPATH=src \
                    python3 benchmarks/sweep_shapes.py --shapes gate_up,qkv,q/o,down,lm_head --ms 1,2,8,16,32,64 \
                    --exc $e --out "$out/exc_decode_$e"
                done
                # an output projection tied to its embedding, as SmolLM2's (1.03% of its embedding's weights are exceptions)
                step exc_decode_lm 120 env SWEEP_ROUND=43 PYTHONPATH=src python3 benchmarks/sweep_shapes.py --shapes lm_head \
                  --ms 1,8,64 --exc 0.01 --out "$out/exc_decode_lm" ;;
    exc_ab) # the table's choice at decode sizes with real weights' 0.1% of exceptions (and an lm_head at 1%, a tied
            # embedding's), this tree against main's (.carry/main: git archive main src benchmarks): the exception
            # rounds shared among a tile's split programs (one file a tree: a call brings back 8 files); AB_TREES
            # names other trees (AB_TREES=". .carry/mask": h136's first commit, its loop without the index read ahead)
            for r in ${AB_TREES:-. .carry/main}; do
              [ -d "$r/src" ] || continue
              n=$( [ "$r" = . ] && echo branch || basename "$r" )
              step "exc_ab_$n" 180 env SWEEP_ROUND=default PYTHONPATH="$r/src" bash -c "python3 $r/benchmarks/sweep_shapes.py \
                --shapes gate_up,qkv,q/o,down,lm_head --ms 1,2,8,16,32,64,65,128 --exc 0.001 --out /tmp/exc_ab_$n && \
                python3 $r/benchmarks/sweep_shapes.py --shapes lm_head --ms 1,8,64 --exc 0.01 --out /tmp/exc_ab_lm_$n"
            done ;;
    sweep45) # 0.1% of exceptions: at M = 65-128 the ws tile's rounds of 128 against 64, values prepared (h131), its
             # exceptions by the accumulator's threads (exc_rows, h133); at M = 8-64 exc_rows where the table runs the
             # ws or wgmma tile; 7B and 32B shapes (19 s for M = 65-128 alone on an H100)
             step sweep45 300 env SWEEP_ROUND=45 PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 \
               benchmarks/sweep_shapes.py --shapes gate_up,qkv,q/o,down,32b.gate_up,lm_head --ms 8,16,32,64,65,128 \
               --exc 0.001 \
               --out /tmp/sweep45 --table "$out/sweep45_table.json" ;;  # merge its 65-128 cells (merge_table.py --buckets)
    sweep46) # decode sizes at 0.1% of exceptions: exc_rows with x itself (no transposed copy) and explicit splits (the
             # waves' choice left qkv at M = 64 with a tail wave); writes sweep46_table.json for merge_table.py
             step sweep46 240 env SWEEP_ROUND=46 PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 \
               benchmarks/sweep_shapes.py --shapes qkv,q/o,down,gate_up,lm_head --ms 2,8,16,32,64 --exc 0.001 \
               --out /tmp/sweep46 --table "$out/sweep46_table.json" ;;
    sweep47) # prompts at M = 192-512 with 0.1% of exceptions: the ws tile with exc_rows (bm 128, 256) against unpack +
             # cuBLAS (issue 38: the 7B's first token at 512 tokens 1.6x bf16 on an H100)
             step sweep47 240 env SWEEP_ROUND=47 PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 \
               benchmarks/sweep_shapes.py --shapes gate_up,down,32b.gate_up,lm_head,qkv --ms 192,256,512 --exc 0.001 \
               --out /tmp/sweep47
             # ... and with normal weights' 0.008% (what the tile costs without exceptions; bm 256 with exc_rows spills
             # 664-792 bytes on sm_90a, without exceptions none)
             step sweep47_normal 120 env SWEEP_ROUND=47 PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 \
               benchmarks/sweep_shapes.py --shapes gate_up,down --ms 256,512 --out /tmp/sweep47n ;;
    next) # the pending README's next call, whichever GPU came: on an H200 round 50 at M = 192-512 (a table for its
          # 129-255 and 256-511 cells, still unpack + cuBLAS) and the 7B's and 32B's first token beside bf16 (issue 38);
          # on an H100 (round 53, the wgmma probe and the pool attention's launches done there on 2026-12-07) the
          # dense11_wgmma step's configs and its profile again (d11ea)
          if python3 -c "import torch,sys;sys.exit('H200' not in torch.cuda.get_device_name())"; then
            OUT="$out" bash "$0" sweep53t ttft
          else
            OUT="$out" bash "$0" d11ea
          fi ;;
    ttft) # issue 38's whole-model targets: first token at 512 and 2048 tokens (eager prefill, as 2026-12-03's) and the
          # step at one sequence, 7B then 32B, bf16 and fixed12 in the same run; the JSON is rewritten after each variant
          step ttft $(( 585 - SECONDS > 30 ? 585 - SECONDS : 30 )) env PYTHONPATH=src python3 benchmarks/scale.py \
            --sizes qwen2.5-7b,qwen2.5-32b --variants bf16,fixed12 --batches 1 --no-capacity --out "$out/ttft" ;;
    d11wg) # issue 35: dense11's decode as wgmma's register A operand (benchmarks/probes/dense11_wgmma.py, escape-free
           # weights, 4096 x 4096, M = 16-64): bits against float64, then its time beside bf16
           step d11wg 120 env PYTHONPATH=src python3 benchmarks/probes/dense11_wgmma.py --gpu ;;
    d11wgk) # issue 35: the dense11_wgmma kernel's GPU tests (escapes, exceptions, splits, fixup, bits with and without
            # prefetch), then the 7B step (4 layers, dense11_step.py): its configs (a cap of 168 registers: 3 programs
            # an SM, no spill on sm_90) beside the table's dense11 (on an H100 with d11-wgmma: the wgmma rows), the
            # H200 table's GEMV rows as gemv columns, and fixed12; dense11_table.py then writes the winners
            step d11wgk_tests 240 env PYTHONPATH=src python3 -m pytest -q -p no:cacheprovider -m gpu \
              tests/kernels/test_dense11_wgmma.py
            step d11wgk_step 330 env PYTHONPATH=src python3 benchmarks/dense11_step.py --layers 4 --ms 1,8,16,32,64 \
              --no-v1 --wg bm=64 --wg bm=64,pipe=1 --wg bm=64,maxnreg=168 --wg bm=32,pipe=1,maxnreg=168 \
              --gemv bn=64,bk=128,mb=16,dot=mma,prefetch=1 --gemv bn=32,bk=128,prefetch=1 --out "$out/d11wgk" ;;
    d11ea) # issue 35: dense11_wgmma with its escape windows a step ahead (ahead=1: no global load inside a step's
           # decode) beside the d11-wgmma configs, the 7B step (2 layers + lm_head, dense11_step.py), then Nsight Compute on
           # gate_up at M = 16 and 64 (bf16, the table's choice, pipe, pipe + ahead): stalls by reason, issue, bandwidth.
           # Each step gets what the call has left (CALL_LIMIT, default 590 s; after gpu_set_par in the same call: about 270 s)
           left=$(( ${CALL_LIMIT:-590} - SECONDS ))
           step d11ea_step $(( left < 240 ? left : 240 )) env PYTHONPATH=src python3 benchmarks/dense11_step.py --layers 2 \
             --ms 64,16,32,8,1 --no-v1 --wg bm=64 --wg bm=64,ahead=1 --wg bm=64,pipe=1 --wg bm=64,pipe=1,ahead=1 \
             --out "$out/d11ea"
           left=$(( ${CALL_LIMIT:-590} - SECONDS ))
           [ "$left" -gt 30 ] && step ncu_d11 "$left" env PYTHONPATH=src ncu --clock-control none --profile-from-start off \
             --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
             --section MemoryWorkloadAnalysis --section SourceCounters python3 benchmarks/profile_ncu.py --shape gate_up \
             --ms 16,64 --dense11 --wg11 bm=64,pipe=1 --wg11 bm=64,ahead=1 --wg11 bm=64,stages=3 ;;
    d11ring) # issue 35: dense11_wgmma's ring (stages: each step's words and x copied by cp.async 2-4 steps ahead into
             # shared memory, 96 registers at 16 x rows: 4 programs an SM by its 46 KB at 3 stages, so gate_up's 592
             # tiles are 1.12 waves unless wave_split splits K): the 7B step (2 layers + lm_head) beside the table's
             # dense11 column (on an H100: ahead at M = 5-32, pipe at 33-64); the GPU set runs its same-bits tests
           left=$(( ${CALL_LIMIT:-590} - SECONDS ))
           step d11ring_step $(( left < 240 ? left : 240 )) env PYTHONPATH=src python3 benchmarks/dense11_step.py \
             --layers 2 --ms 16,8,32,64 --no-v1 --wg bm=64,stages=3 --wg bm=64,stages=4 \
             --wg bm=64,stages=3,wave_split=1,waves=4 --wg bm=64,stages=3,pipe=1 --wg bm=64,stages=3,xperm=1 \
             --out "$out/d11ring" ;;
    d11long) # issue 35's prompts (M = 128-4608 <= 1.15x bf16): dense11_wgmma with 256 / 128 x rows a tile and xperm
             # (each weight decoded once a tile) against the table's choice (since 2026-12-07 on the H100 the same tile
             # at M = 65-128 and 256-511, unpack + cuBLAS elsewhere) at M = 192 (not yet measured), 512, 1024, 2 layers;
             # and unpack + cuBLAS with unpack_wg (long unpack=wg, and wg_direct: stores from the decode's layout)
           left=$(( ${CALL_LIMIT:-590} - SECONDS ))
           [ "$left" -gt 40 ] && step d11long $(( left < 240 ? left : 240 )) env PYTHONPATH=src python3 \
             benchmarks/dense11_step.py --layers 2 --ms 192,512,1024 --no-v1 --wg bm=256,stages=2,xperm=1 \
             --wg bm=128,stages=2,xperm=1 --long unpack=wg --long unpack=wg_direct --out "$out/d11long" ;;
    d11unpack) # issue 35's prompts: dense11's unpack on the wgmma tile's decode (unpack_wg) against unpack_v2 (about
               # 0.7 TB/s on an H100) and a bf16 copy, the merged 7B matrices, 0.1% exceptions, bits checked first
           left=$(( ${CALL_LIMIT:-590} - SECONDS ))
           [ "$left" -gt 30 ] && step d11unpack $(( left < 150 ? left : 150 )) env PYTHONPATH=src python3 \
             benchmarks/probes/dense11_unpack_wg.py --out "$out/d11unpack" ;;
    ncu_unpack) # Nsight Compute on dense11's unpacks (gate_up 37888x3584, 0.1% exceptions; each kernel's first,
                # untimed launch of the probe's bit check: unpack_v2, unpack_wg, its direct stores): achieved DRAM
                # bandwidth, warp stalls, the source counters
           step ncu_unpack 200 env PYTHONPATH=src ncu --clock-control none -k regex:"_unpack_v2_kernel|_d11_unpack_wg_kernel" \
             -c 3 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
             --section MemoryWorkloadAnalysis --section SourceCounters \
             python3 benchmarks/probes/dense11_unpack_wg.py --shapes gate_up ;;
    d11ws) # issue 35: dense11_wgmma's K split by waves (wave_split: the split that finishes first with `waves` programs
           # an SM resident: 3 at 168 registers, 2 with pipe) against the split rule's, and the windows loaded after the
           # step before's MMA (after_mma: 128-168 registers), the 7B step (2 layers + lm_head)
           left=$(( ${CALL_LIMIT:-590} - SECONDS ))
           step d11ws_step $(( left < 240 ? left : 240 )) env PYTHONPATH=src python3 benchmarks/dense11_step.py --layers 2 \
             --ms 64,16,32,8 --no-v1 --wg bm=64,ahead=1 --wg bm=64,ahead=1,wave_split=1,waves=3 --wg bm=64,pipe=1 \
             --wg bm=64,pipe=1,wave_split=1 --wg bm=64,after_mma=1 --wg bm=64,after_mma=1,wave_split=1,waves=3 \
             --wg bm=64,pipe=1,after_mma=1 --out "$out/d11ws" ;;
    d11wgt) # the dense11_wgmma kernel's GPU tests alone
            step d11wgt 240 env PYTHONPATH=src python3 -m pytest -q -p no:cacheprovider -m gpu \
              tests/kernels/test_dense11_wgmma.py ;;
    d11wgq) # d11wgk's step alone, short (2 layers + lm_head): what a call has left after the GPU set
            step d11wgq 200 env PYTHONPATH=src python3 benchmarks/dense11_step.py --layers 2 --ms 1,8,16,32,64 \
              --no-v1 --wg bm=64 --wg bm=64,pipe=1 --out "$out/d11wgq" ;;
    kvw) # the pool attention's launches past 2026-12-07's (2 warps, 8 programs an SM, 128 registers from 4 sequences on
         # the H100): 2 warps at 4 an SM (one sequence) or 16 asked (8 fit), 6 at 168 registers, 1-warp programs at
         # 255 (1 warp at 128-224 and 2 at sub-tiles of 64 below 255 spill, static sm_90), the 4-warp launches before
         # it; uniform lengths and 64 sequences of T/2..T (carry .carry/kv_pool.pt)
         step kvw 200 env PYTHONPATH=src python3 benchmarks/kv.py speed --pool .carry/kv_pool.pt --tokens 16384 4096 \
           --batches 1 2 4 16 64 --mixed 64 --gluon --variants --fixed --pool-variants 2,32,8,128,1,2,1 2,32,4,128,1,2,1 \
           2,32,16,128,1,2,1 2,32,6,168,1,2,1 1,32,8,255,1,2,1 4,32,4,96,1,2,1 4,32,16,96,1,2,1 ;;
    sweep53t) # round 53 (rounds 50's and 52's winners on the H100: x tiles inner and outer, wg_parts or not) at
              # M = 192-512 on the 7B's long-M shapes, 0.1% exceptions: the table for `merge_table.py --buckets
              # 129-255,256-511` (then ALL CPU tests and the GPU set on the merged tree)
              step sweep53t 200 env SWEEP_ROUND=53 PYTHONPATH=src TRITON_CACHE_DIR="${TRITON_CACHE_DIR:=$(mktemp -d)}" \
                python3 benchmarks/sweep_shapes.py --shapes gate_up,lm_head,down,qkv --ms 192,256,384,512 --exc 0.001 \
                --out /tmp/sweep53t --table "$out/sweep53t_table.json"
              cp /tmp/sweep53t/sweep.json "$out/sweep53t.json" 2>/dev/null ;;
    sweep50t) # round 50 (x tiles inner and outer, bm 128 and 256) at M = 192-512 on the 7B's long-M shapes, 0.1% exceptions:
              # the table for `merge_table.py --buckets 129-255,256-511` (then the GPU set on the merged tree)
              step sweep50t 150 env SWEEP_ROUND=50 PYTHONPATH=src TRITON_CACHE_DIR="${TRITON_CACHE_DIR:=$(mktemp -d)}" \
                python3 benchmarks/sweep_shapes.py --shapes gate_up,lm_head,down,qkv --ms 192,256,384,512 --exc 0.001 \
                --out /tmp/sweep50t --table "$out/sweep50t_table.json"
              cp /tmp/sweep50t/sweep.json "$out/sweep50t.json" 2>/dev/null ;;
    sweep52) # round 52 on the shapes of the 256-511 cells (gate_up, lm_head; down's crossing between 256 and 512)
             step sweep52 $(( 585 - SECONDS > 30 ? 585 - SECONDS : 30 )) env SWEEP_ROUND=52 PYTHONPATH=src \
               TRITON_CACHE_DIR="${TRITON_CACHE_DIR:=$(mktemp -d)}" python3 benchmarks/sweep_shapes.py \
               --shapes gate_up,lm_head,down --ms 384,256,512 --exc 0.001 --out /tmp/sweep52 --table "$out/sweep52_table.json"
             cp /tmp/sweep52/sweep.json "$out/sweep52.json" 2>/dev/null ;;
    sweep51s) # round 51's bm 256 rows at gate_up M = 512 (with and without wg_parts and pipe), 0.1% then normal weights
              for a in "--exc 0.001 --out /tmp/s51a" "--out /tmp/s51b"; do
                [ $(( 585 - SECONDS )) -gt 20 ] || break
                step "sweep51s_${a##*/}" $(( 585 - SECONDS )) env SWEEP_ROUND=51 SWEEP_ONLY="ws bm256 s2( pipe)?( wg parts)?" \
                  PYTHONPATH=src TRITON_CACHE_DIR=/tmp/tc51 python3 benchmarks/sweep_shapes.py --shapes gate_up --ms 512 $a
              done ;;
    ab129) # the table's choice at M = 129-255 (round 48's cells, the pending t48) against main's (.carry/main), 0.1%
           for r in . .carry/main; do
             [ -d "$r/src" ] || continue
             n=$( [ "$r" = . ] && echo branch || basename "$r" )
             step "ab129_$n" 120 env SWEEP_ROUND=default PYTHONPATH="$r/src" python3 "$r/benchmarks/sweep_shapes.py" \
               --shapes gate_up,lm_head,down,qkv --ms 129,192,255 --exc 0.001 --out "/tmp/ab129_$n"
           done ;;
    tables) # rounds 45 (M = 65-128), 44 (what the call leaves it of 150 s) and 46, each merged into this GPU's table
            # before the next (46's candidates start from the merged choice), then the default GPU set on the merged
            # tree: one call, no idle gap for a merge here; the merged table comes back (copy it, then gpu_set.sh hash)
            tb=src/glyd/kernels/tables/$(python3 -c "import torch,re;print(re.sub('[^0-9A-Za-z]','_',torch.cuda.get_device_name()))").json
            note="round %s at 0.1%% exceptions, merged on the device (${TABLES_NOTE:-benchmarks/history})"
            step sweep45 120 env SWEEP_ROUND=45 PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 \
              benchmarks/sweep_shapes.py --shapes gate_up,qkv,q/o,down,32b.gate_up,lm_head --ms 65,128 --exc 0.001 \
              --out /tmp/sweep45 --table /tmp/sweep45_table.json
            PYTHONPATH=src python3 benchmarks/merge_table.py /tmp/sweep45_table.json "$tb" \
              --note "$(printf "$note" 45)" --buckets 65-128 >> "$out/merges.txt" 2>&1
            step sweep44 150 env SWEEP_ROUND=44 PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 \
              benchmarks/sweep_shapes.py --shapes down,qkv,q/o,gate_up,lm_head --ms 1,2,8,16,32,64 --exc 0.001 \
              --out /tmp/sweep44 --table /tmp/sweep44_table.json
            PYTHONPATH=src python3 benchmarks/merge_table.py /tmp/sweep44_table.json "$tb" \
              --note "$(printf "$note" 44)" >> "$out/merges.txt" 2>&1
            step sweep46 150 env SWEEP_ROUND=46 PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 \
              benchmarks/sweep_shapes.py --shapes qkv,q/o,down,gate_up,lm_head --ms 2,8,16,32,64 --exc 0.001 \
              --out /tmp/sweep46 --table /tmp/sweep46_table.json
            PYTHONPATH=src python3 benchmarks/merge_table.py /tmp/sweep46_table.json "$tb" \
              --note "$(printf "$note" 46)" >> "$out/merges.txt" 2>&1
            cp "$tb" "$out/"  # with the step texts, the merges' and the GPU set's: 7 files (a call brings back 8)
            step gpu_set 590 env OUT="$out/gpu_set" bash benchmarks/gpu_set.sh default 16 parallel
            tar czf "$out/gpu_set_logs.tgz" -C "$out" gpu_set && rm -rf "$out/gpu_set" ;;
    sweep48) # prompts at M = 192-512 (issue 38): the ws tile with pipe (its decode beside the MMAs before it) and 3
             # stages against round 47's and unpack + cuBLAS, at real weights' 0.1% of exceptions and normal weights'
             step sweep48 200 env SWEEP_ROUND=48 PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 \
               benchmarks/sweep_shapes.py --shapes gate_up,down,qkv,lm_head --ms 192,512 --exc 0.001 --out /tmp/sweep48 \
               --table "$out/sweep48_table.json"  # merge_table.py --buckets 129-255,256+ where the ws tile wins
             step sweep48_normal 120 env SWEEP_ROUND=48 PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 \
               benchmarks/sweep_shapes.py --shapes gate_up,down --ms 256,512 --out /tmp/sweep48n ;;
    sweep50) # the ws tile with x tiles outer (x_outer, h142) at M = 192-2048, real weights' 0.1% of exceptions and
             # normal weights (no exceptions): whether the words read from DRAM once make it beat unpack + cuBLAS
             # (and bn 64 at two programs an SM); the time the call has left, each shape's rows printed as it ends
             step sweep50 $(( 585 - SECONDS > 60 ? 585 - SECONDS : 60 )) env SWEEP_ROUND=50 PYTHONPATH=src \
               TRITON_CACHE_DIR="$(mktemp -d)" python3 benchmarks/sweep_shapes.py --shapes gate_up,lm_head,down,qkv \
               --ms 192,512,2048 --exc 0.001 --out /tmp/sweep50 --table "$out/sweep50_table.json" ;;
    h143) # a short call (little device time left): h142's and h143's GPU tests, then round 50 with normal weights and
          # at 0.1% in what the call has left (CALL_S: the call's limit), each shape's rows as it ends
          lim=${CALL_S:-585}
          step tests_h143 150 env PYTHONPATH=src:. python3 -m pytest -q -m gpu -p no:cacheprovider \
            tests/kernels/test_ws.py -k "halves or x_outer"
          step sweep50_normal $(( lim - SECONDS > 150 ? 150 : lim - SECONDS )) env SWEEP_ROUND=50 PYTHONPATH=src \
            TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$(mktemp -d)}" python3 benchmarks/sweep_shapes.py --shapes gate_up,down \
            --ms 512,2048 --out /tmp/sweep50n
          step sweep50 $(( lim - SECONDS > 30 ? lim - SECONDS : 30 )) env SWEEP_ROUND=50 PYTHONPATH=src \
            TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$(mktemp -d)}" python3 benchmarks/sweep_shapes.py \
            --shapes gate_up,lm_head,down,qkv --ms 512,192,2048 --exc 0.001 --out /tmp/sweep50 ;;
    h144) # WsConfig.wg_parts: its GPU tests (bits equal to one consumer's), then round 51 (with and without pipe and
          # halves) at 0.1% of exceptions and with normal weights, in what the call has left (CALL_S: its limit)
          lim=${CALL_S:-585}
          step tests_h144 200 env PYTHONPATH=src:. python3 -m pytest -q -m gpu -p no:cacheprovider \
            tests/kernels/test_ws.py -k wg_parts
          step sweep51 $(( lim - SECONDS > 200 ? (lim - SECONDS) * 2 / 3 : lim - SECONDS )) env SWEEP_ROUND=51 \
            PYTHONPATH=src TRITON_CACHE_DIR="${TRITON_CACHE_DIR:=$(mktemp -d)}" python3 benchmarks/sweep_shapes.py \
            --shapes gate_up,lm_head,down --ms 512,192 --exc 0.001 --out /tmp/sweep51 --table "$out/sweep51_table.json"
          step sweep51_normal $(( lim - SECONDS > 30 ? lim - SECONDS : 30 )) env SWEEP_ROUND=51 PYTHONPATH=src \
            TRITON_CACHE_DIR="$TRITON_CACHE_DIR" python3 benchmarks/sweep_shapes.py --shapes gate_up,down --ms 512,2048 \
            --out /tmp/sweep51n ;;
    sweep50n) # round 50 with normal weights (no exceptions)
             step sweep50_normal 240 env SWEEP_ROUND=50 PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 \
               benchmarks/sweep_shapes.py --shapes gate_up,down --ms 512,2048 --out /tmp/sweep50n ;;
    sweep49) # exc_rows' rounds a round ahead (exc_pre, h141): the table's choice with and without it at decode sizes
             # and round 48's ws rows past M = 128, at real weights' 0.1% of exceptions
             step sweep49 240 env SWEEP_ROUND=49 PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 \
               benchmarks/sweep_shapes.py --shapes gate_up,down,qkv,lm_head --ms 8,64,128,192,512 --exc 0.001 \
               --out /tmp/sweep49 --table "$out/sweep49_table.json" ;;
    sweep44) # decode sizes at 0.1% of exceptions: bigger rounds, more split programs, the GEMV in-tile or beside,
             # the GEMV at M = 1-2 where a tile runs (saved after each shape; the time the call has left)
             step sweep44 $(( 585 - SECONDS > 60 ? 585 - SECONDS : 60 )) env SWEEP_ROUND=44 PYTHONPATH=src \
               TRITON_CACHE_DIR="$(mktemp -d)" python3 benchmarks/sweep_shapes.py --shapes down,qkv,q/o,gate_up,lm_head \
               --ms 1,2,8,16,32,64 --exc 0.001 --out /tmp/sweep44 --table "$out/sweep44_table.json" ;;  # the GPU's table
                                                                                    # with the measured cells
    ncu_long1) # ncu_long's first step alone (normal weights; what a call has left after sweep53t)
               step ncu_long 240 env PYTHONPATH=src ncu --clock-control none --profile-from-start off \
                 --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
                 --section WarpStateStats --section MemoryWorkloadAnalysis --section SourceCounters \
                 python3 benchmarks/profile_ncu.py --shape gate_up --ms 512 --long ;;
    ncu_long) # Nsight Compute on prompts' sizes (issue 38): gate_up at M = 512 with normal weights, bf16 (cuBLAS), the
              # table's choice (unpack + cuBLAS) and the ws tile at bm 128 and 256 (round 47: 2.18x bf16): what limits
              # the fused tile there (tensor pipe, issue, stalls by reason, the source counters' top stalls)
              step ncu_long 240 env PYTHONPATH=src ncu --clock-control none --profile-from-start off \
                --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
                --section WarpStateStats --section MemoryWorkloadAnalysis --section SourceCounters \
                python3 benchmarks/profile_ncu.py --shape gate_up --ms 512 --long
              # ... with real weights' 0.1% of exceptions (they cost the ws tile 24% at M = 512, round 48): the
              # finish's rounds against the step loop (SourceCounters), with h141 applied its rounds a round ahead
              step ncu_long_exc 240 env PYTHONPATH=src ncu --clock-control none --profile-from-start off \
                --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
                --section MemoryWorkloadAnalysis --section SourceCounters \
                python3 benchmarks/profile_ncu.py --shape gate_up --ms 512 --long --exc 0.001
              # ... and qkv at M = 128 (36 tiles of 128 rows for 132 SMs: the ws tile 2.78x against unpack + cuBLAS's
              # 2.04x in round 45; gate_up, 8.2 times the weights, took only 3.6 times as long: what is fixed there)
              step ncu_qkv128 180 env PYTHONPATH=src ncu --clock-control none --profile-from-start off \
                --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
                --section SourceCounters python3 benchmarks/profile_ncu.py --shape qkv --ms 128 --long --exc 0.001 ;;
    ncu_down) # down (3584x18944) at M = 512, normal weights: the ws tile at bm 256 took 222 us (2.47x bf16, round 48)
              # where gate_up, twice the multiply-adds, took 325 us: about 7,000 cycles a K step against gate_up's 5,100 in
              # the same run, the same 88 KB a step (x here is 19.4 MB, all of it live at once across the programs' K ranges)
              step ncu_down 240 env PYTHONPATH=src ncu --clock-control none --profile-from-start off \
                --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
                python3 benchmarks/profile_ncu.py --shape down --ms 512 --long ;;
    ncu_exc) # Nsight Compute on the decode and long-M products that lose most with real weights' 0.1% of exceptions
             # (history/2026-12-06-h100-20.md): the table's choice against bf16 on gate_up at M = 32, 64, 128 and qkv at
             # 64, the speed of light, occupancy, warp states and the source counters' summary, as text
             # (and gate_up at 128 with normal weights: what the ws tile's finish adds), the source counters' top stalls
             for sme in gate_up:32,64,128:0.001 qkv:64:0.001 gate_up:128:0; do
               IFS=: read -r sh ms ex <<< "$sme"
               step "ncu_${sh}$( [ "$ex" = 0 ] && echo _normal )" 200 env PYTHONPATH=src ncu --clock-control none \
                 --profile-from-start off --section SpeedOfLight --section Occupancy --section LaunchStats \
                 --section WarpStateStats --section MemoryWorkloadAnalysis --section SourceCounters \
                 python3 benchmarks/profile_ncu.py --shape "$sh" --ms "$ms" --exc "$ex"
             done ;;
    exc_step) # the 7B's decode step and first token with real weights' share of exceptions (scale.py --exc 0.001), bf16
              # and fixed12 with the same weights, then with normal weights' (--exc 0: the issues' numbers were taken
              # so); the tables are in the step's text (a call brings back 8 files)
              for e in 0.001 0; do
                step "exc_step_$e" 200 env PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 benchmarks/scale.py \
                  --sizes qwen2.5-7b --variants bf16,fixed12 --batches 1,16,64 --exc $e --no-capacity --out "/tmp/exc_step_$e"
              done ;;
    prefill) # the 0.5B's eager prefill: warm (one length repeated) and of new lengths (a user's prompts), host time by
             # module; the branch's tree and main's (.carry/main, when carried: git archive main src benchmarks)
             for r in . .carry/main; do
               [ -d "$r/src" ] || continue
               step "prefill_$( [ "$r" = . ] && echo branch || echo main )" 200 env PYTHONPATH="$r/src" python3 \
                 "$r/benchmarks/probes/probe_prefill_profile.py" --model qwen2.5-0.5b --prompt 512 --top 15 --fresh 9
             done ;;
    dit) # FLUX.1-dev-shaped step (issue 38: <= 1.05x bf16); diffusers is not on the device: wheels in .carry/whl
         python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
           .carry/whl/*.whl > "$out/dit_pip.txt" 2>&1
         step dit 400 env PYTHONPATH=src:/tmp/site python3 benchmarks/dit_step.py --out "$out/dit.json" ;;
    ttft7b) step ttft7b 330 env PYTHONPATH=src TRITON_CACHE_DIR="$(mktemp -d)" python3 benchmarks/scale.py \
              --sizes qwen2.5-7b --variants bf16,fixed12,dense11 --batches 1 --compile-prefill --no-capacity \
              --out "$out/ttft7b" ;;
    *) echo "unknown step $s (gpu_set, gpu_set_par, ncu_exc, ncu_long, d11_exc, scale_d11, long, sweep_long, sweep05, sweep41, sweep42, exc_decode, exc_ab, sweep44, sweep45, exc_step, sweep_kv, dit, ttft7b, bits, kv, d11, prefill)" >&2; exit 2 ;;
  esac
done
for f in gpu_set d11unpack d11ea_step ncu_d11 d11ws_step d11wgk_tests d11wgk_step ttft sweep53t sweep50t scale_d11 long sweep_long sweep05 sweep41 sweep42 exc_decode_0 exc_decode_0.001 exc_decode_lm exc_ab_branch exc_ab_main exc_ab_mask sweep45 sweep44 ncu_gate_up ncu_qkv ncu_gate_up_normal ncu_long ncu_qkv128 exc_step_0.001 exc_step_0 sweep_kv dit ttft7b bits kv_branch kv_main d11 d11_exc prefill_branch prefill_main; do
  [ -f "$out/$f.txt" ] && { echo "=== $f (last lines)"; tail -n 14 "$out/$f.txt"; }
done
echo "| step | exit status | seconds |"
echo "|---|---|---|"
printf '%s\n' "${summary[@]}"
