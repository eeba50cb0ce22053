#!/usr/bin/env bash
# Agreement with llama.cpp on the same file (CPU on both sides): encore writes a small random
# kimi-linear model with save_gguf and its fp64 reference logits; llama.cpp (a CPU build of the
# copy vendored in PyPI's llama-cpp-python sdist, fetched into peers/, never committed) runs the
# file; the logits are compared step by step.
#   bash bench/agree/run.sh [STEPS] [SEEDS...]   (after building encore: cmake --build build)
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${1:-16}
shift || true
SEEDS=${*:-1 2 3 4}
PEERS=peers
VERSION=0.3.36
if [ ! -d "$PEERS/llama_cpp_python-$VERSION" ]; then
  mkdir -p "$PEERS"
  python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$PEERS"
  tar -xzf "$PEERS/llama_cpp_python-$VERSION.tar.gz" -C "$PEERS"
fi
LLAMA="$PEERS/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -f "$PEERS/llama-build/src/libllama.a" ]; then
  cmake -S "$LLAMA" -B "$PEERS/llama-build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF >/dev/null
  cmake --build "$PEERS/llama-build" --target llama
fi
g++ -std=c++17 -O2 bench/agree/llama_logits.cpp -Ibench/agree -I"$LLAMA/include" -I"$LLAMA/ggml/include" \
  "$PEERS/llama-build/src/libllama.a" "$PEERS/llama-build/ggml/src/libggml.a" "$PEERS/llama-build/ggml/src/libggml-cpu.a" \
  "$PEERS/llama-build/ggml/src/libggml-base.a" -lpthread -fopenmp -o "$PEERS/llama_logits"
OUT=out/agree
mkdir -p "$OUT"
OWN=()
REPLAYED=()
for SEED in $SEEDS; do
  build/bench/encore_agree_model "$OUT/tiny_$SEED.gguf" "$OUT/encore_$SEED.bin" "$STEPS" "$SEED"
  "$PEERS/llama_logits" "$OUT/tiny_$SEED.gguf" "$OUT/llama_$SEED.bin" "$STEPS" "$SEED" "$OUT/routing_$SEED.bin" 2>"$OUT/llama_$SEED.log"
  build/bench/encore_agree_model "$OUT/tiny_$SEED.gguf" "$OUT/encore_replayed_$SEED.bin" "$STEPS" "$SEED" "routing=$OUT/routing_$SEED.bin"
  OWN+=("$OUT/encore_$SEED.bin" "$OUT/llama_$SEED.bin")
  REPLAYED+=("$OUT/encore_replayed_$SEED.bin" "$OUT/llama_$SEED.bin")
done
echo "== each side routes itself"
python3 bench/agree/compare.py 512 "${OWN[@]}" | tail -1 || true  # informational: near-ties move single steps
echo "== encore replays llama.cpp's routing"
python3 bench/agree/compare.py 512 "${REPLAYED[@]}"
