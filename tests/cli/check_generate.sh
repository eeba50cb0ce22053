#!/usr/bin/env bash
# `encore generate` on the tiny file: with a GPU it must generate and write every step's logits;
# without one it must say so and exit non-zero.   check_generate.sh ENCORE MODEL PATH_KIND OUT VOCAB
set -u
encore=$1 model=$2 kind=$3 out=$4 vocab=$5
steps=5
log=$("$encore" generate --model "$model" --prompt-ids 3,1,4 --steps $steps --batch 2 --path "$kind" --logits-out "$out" 2>&1)
rc=$?
if [ $rc -eq 0 ]; then
  if ! grep -q 'tokens/s' <<< "$log" || ! grep -q 'row 1:' <<< "$log"; then
    echo "generate succeeded but printed no tokens:"; echo "$log"; exit 1
  fi
  bytes=$(stat -c %s "$out")
  want=$(( (3 + steps - 1) * 2 * vocab * 4 ))
  [ "$bytes" -eq "$want" ] || { echo "--logits-out wrote $bytes bytes, want $want"; exit 1; }
  echo "$log"
elif grep -q 'no CUDA device' <<< "$log"; then
  echo "no GPU: $log"
else
  echo "generate failed ($rc):"; echo "$log"; exit 1
fi
