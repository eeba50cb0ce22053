#!/usr/bin/env bash
# Agreement with llama.cpp on the same file (CPU on both sides, docs/gguf.md §6): encore writes a
# random kimi-linear model with save_gguf and its fp64 reference logits; llama.cpp (a CPU build of
# the copy vendored in PyPI's llama-cpp-python sdist, fetched into peers/, never committed) runs the
# file; the logits are compared step by step, three ways:
#   1. conventions: the file widened to F32 (widen.py) and an fp32 cache, so llama.cpp multiplies in
#      fp32: encore's reference against llama.cpp, held to rel L2 <= 2e-2 per step and the same
#      argmax on >= 95% of steps (the exit status);
#   2. llama.cpp's own rounding: llama.cpp on the Q4_K file (8-bit activations, f16 cache) against
#      llama.cpp on the F32 file;
#   3. encore's reference against llama.cpp on the Q4_K file, each routing itself, then with
#      llama.cpp's routing replayed into encore's reference.
#   bash bench/agree/run.sh [STEPS] [SEEDS...]   (after building encore: cmake --build build)
#   LAYERS=KdKeMe bash bench/agree/run.sh ...    (full width, those layers: encore_agree_model's layers=)
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
TAG=${LAYERS:-tiny}
MODEL_ARGS=()
[ -n "${LAYERS:-}" ] && MODEL_ARGS=("layers=$LAYERS")
CONVENTIONS=()
ROUNDING=()
OWN=()
REPLAYED=()
for SEED in $SEEDS; do
  F="$OUT/${TAG}_$SEED"
  build/bench/encore_agree_model "$F.gguf" "$F.encore.bin" "$STEPS" "$SEED" "${MODEL_ARGS[@]}"
  python3 bench/agree/widen.py "$F.gguf" "$F.f32.gguf"
  "$PEERS/llama_logits" "$F.f32.gguf" "$F.llama_f32.bin" "$STEPS" "$SEED" kv=f32 2>"$F.llama_f32.log"
  rm -f "$F.f32.gguf"
  "$PEERS/llama_logits" "$F.gguf" "$F.llama.bin" "$STEPS" "$SEED" "routing=$F.routing.bin" 2>"$F.llama.log"
  build/bench/encore_agree_model "$F.gguf" "$F.encore_replayed.bin" "$STEPS" "$SEED" "routing=$F.routing.bin" "${MODEL_ARGS[@]}"
  CONVENTIONS+=("$F.encore.bin" "$F.llama_f32.bin")
  ROUNDING+=("$F.llama_f32.bin" "$F.llama.bin")
  OWN+=("$F.encore.bin" "$F.llama.bin")
  REPLAYED+=("$F.encore_replayed.bin" "$F.llama.bin")
done
VOCAB=$(python3 -c "import sys; print(163840 if sys.argv[1] != 'tiny' else 512)" "$TAG")
echo "== 1. conventions: encore's reference vs llama.cpp in fp32 (F32 weights, fp32 cache)"
python3 bench/agree/compare.py "$VOCAB" "${CONVENTIONS[@]}" --min-argmax 0.95 --max-rel 0.02 --quiet && STATUS=0 || STATUS=1
echo "== 2. llama.cpp's own rounding: llama.cpp in fp32 vs llama.cpp on the Q4_K file"
python3 bench/agree/compare.py "$VOCAB" "${ROUNDING[@]}" --quiet || true
echo "== 3a. encore's reference vs llama.cpp on the Q4_K file, each routing itself"
python3 bench/agree/compare.py "$VOCAB" "${OWN[@]}" --quiet || true
echo "== 3b. the same with llama.cpp's routing replayed into encore's reference"
python3 bench/agree/compare.py "$VOCAB" "${REPLAYED[@]}" --quiet || true
exit $STATUS
