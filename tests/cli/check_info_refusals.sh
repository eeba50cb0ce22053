#!/usr/bin/env bash
# `encore info` on a file whose projections are F32 (the tiny file widened by gguf-py): it must fail
# and name every refused projection, the head included.   check_info_refusals.sh ENCORE MODEL OUT WIDEN
set -u
encore=$1 model=$2 out=$3 widen=$4
if ! python3 "$widen" "$model" "$out" > /dev/null 2>&1; then
  echo "gguf-py not importable (pip install gguf): skipped"; exit 0
fi
log=$("$encore" info --model "$out" 2>&1)
rc=$?
rm -f "$out"
refused=$(grep -c -E 'tensor [^ ]+ is F32' <<< "$log")
if [ $rc -eq 0 ] || [ "$refused" -lt 40 ] || ! grep -q 'tensor output.weight is F32' <<< "$log"; then
  echo "encore info should refuse every F32 projection (rc $rc, $refused named):"; echo "$log"; exit 1
fi
echo "refused $refused projections"
