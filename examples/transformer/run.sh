#!/usr/bin/env bash
# The transformer example, end to end, on a cluster that is up (`trainyard up --workers 2` in
# another terminal, or TRAINYARD_COORDINATOR set): writes the King James Bible (Debian's
# bible-kjv) as byte-token shards under WORK (default /tmp/trainyard-examples/transformer) with
# `trainyard data pack --text`, trains kjv.yaml on them, then loads the exported
# model.safetensors into the same model written in plain PyTorch (transformer.py): its held-out
# loss and perplexity against the untrained model's, and text it writes.
#
#   examples/transformer/run.sh [WORK]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${1:-/tmp/trainyard-examples/transformer}
case "$work" in /*) ;; *) work="$PWD/$work" ;; esac
trainyard=$(command -v trainyard || echo "$root/build/bin/trainyard")
[ -x "$trainyard" ] || { echo "run.sh: no trainyard binary; build it or put it on PATH" >&2; exit 1; }
python=/usr/bin/python3  # Debian's, with NumPy and PyTorch

mkdir -p "$work"
if [ -z "$(ls "$work"/kjv-*.safetensors 2>/dev/null)" ]; then
  echo "==> The King James Bible as byte tokens in $work"
  command -v bible >/dev/null || { echo "run.sh: no 'bible' program: install bible-kjv" >&2; exit 1; }
  # "Ge1:1 In the beginning ..." -> "In the beginning ...", one verse a line.
  bible -f gen1:1-rev22:21 | sed -n 's/^[^ ]* //p' >"$work/kjv.txt"
  "$trainyard" data pack --text "$work/kjv.txt" --shard-size 1MB "$work/kjv"
fi

echo "==> Training it (kjv.yaml)"
sed "s|/tmp/trainyard-examples/transformer|$work|g" "$here/kjv.yaml" >"$work/kjv.yaml"
if ! "$trainyard" submit "$work/kjv.yaml" --wait >"$work/submit.out" 2>&1; then
  echo "run.sh: kjv.yaml did not succeed:" >&2
  cat "$work/submit.out" >&2
  exit 1
fi
id=$(head -1 "$work/submit.out")
model=$("$trainyard" describe "$id" -o json |
  "$python" -c "import json, sys; print(json.load(sys.stdin)['modelUri'])")
"$trainyard" logs "$id" | grep -E 'val_loss=' || true

echo "==> The exported weights ($model) in the plain PyTorch model"
"$python" "$here/transformer.py" sample --model "${model#file://}" \
  --tokens "$work/kjv-*.safetensors" --prompt "And God said"
