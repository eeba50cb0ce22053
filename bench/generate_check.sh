#!/usr/bin/env bash
# Generation from GGUF files written on the GPU machine (model files do not travel to it), in one
# call: 1. a full-width model of three layers (KDA dense, KDA MoE, MLA MoE) fed the fp64
# reference's 16 tokens as a prompt, its logits on both paths against the reference; 2. the whole
# Kimi-Linear preset (28 GB): load time and tokens/s on both paths. The files go to /tmp and are
# deleted. Usage, from the repository root with `build/` built:
#   bash bench/generate_check.sh [OUT_DIR]
set -uo pipefail
out=${1:-${OUT:-out}}
mkdir -p "$out"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "generate_check: no NVIDIA GPU here" >&2
  exit 1
fi
gen=/tmp/encore_gen
mkdir -p "$gen"
build/bench/encore_agree_model "$gen/fw.gguf" "$gen/fw_ref.bin" 16 1 layers=KdKeMe > "$out/gen_ref.log" 2>&1
ids=$(grep '^prompt-ids ' "$out/gen_ref.log" | cut -d' ' -f2)
# Free-running steps of this random model sit at the 8-bit activations' floor, not at fp64: a
# wiring error moves the logits by O(1), rounding by a few percent, and a routing near-tie decided
# the other way by up to 20% (llama.cpp's Q4_K run against its own fp32 run does the same; docs/gguf.md §6).
for path in graph megakernel; do
  build/bin/encore generate --model "$gen/fw.gguf" --prompt-ids "$ids" --steps 1 --path "$path" \
    --logits-out "$gen/fw_$path.bin" > "$out/gen_fw_$path.log" 2>&1
  echo "generate full-width $path rc=$? $(tail -1 "$out/gen_fw_$path.log")"
  python3 bench/agree/compare.py 163840 "$gen/fw_ref.bin" "$gen/fw_$path.bin" --min-argmax 0.5 --max-rel 0.3 --max-median 0.06 --quiet
done
cmp -s "$gen/fw_graph.bin" "$gen/fw_megakernel.bin" && echo "full-width logits: graph and megakernel same bits" \
  || echo "full-width logits: graph and megakernel DIFFER"
rm -f "$gen/fw.gguf"
build/tests/encore_write_gguf "$gen/kimi.gguf" kimi 1 > "$out/gen_write.log" 2>&1
echo "write kimi rc=$? $(tail -1 "$out/gen_write.log")"
for path in graph megakernel; do
  build/bin/encore generate --model "$gen/kimi.gguf" --prompt-ids 1,2,3 --steps 64 --path "$path" > "$out/gen_kimi_$path.log" 2>&1
  echo "generate kimi $path rc=$? $(grep -a -o 'loaded .*GB/s)' "$out/gen_kimi_$path.log"); $(tail -1 "$out/gen_kimi_$path.log")"
done
rm -rf "$gen"
