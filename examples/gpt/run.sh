#!/usr/bin/env bash
# The GPT example, end to end, on a cluster that is up (`trainyard up --workers 2` in another
# terminal, or TRAINYARD_COORDINATOR set): writes the King James Bible as windows of bytes and the
# untrained model (examples/gpt/gpt.py, plain PyTorch 2) under WORK (default
# /tmp/trainyard-examples/gpt), trains it with gpt-kjv.yaml, then loads the exported weights into
# the plain PyTorch model: its held-out loss and perplexity against the untrained model's, and
# text it writes. Needs PyTorch 2 (Debian 13's python3-torch) to script the model, and workers
# whose LibTorch has scaled_dot_product_attention (2.0 or newer); exit code 77 when this machine's
# PyTorch is older.
#
#   examples/gpt/run.sh [WORK]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${1:-/tmp/trainyard-examples/gpt}
case "$work" in /*) ;; *) work="$PWD/$work" ;; esac
trainyard=$(command -v trainyard || echo "$root/build/bin/trainyard")
[ -x "$trainyard" ] || { echo "run.sh: no trainyard binary; build it or put it on PATH" >&2; exit 1; }
python=/usr/bin/python3  # Debian's, with NumPy and PyTorch

mkdir -p "$work"
echo "==> The untrained model and the text in $work"
"$python" "$here/gpt.py" model --out "$work/gpt-init.pt"
[ -n "$(ls "$work"/windows-*.safetensors 2>/dev/null)" ] || "$python" "$here/gpt.py" data \
  --out-dir "$work"

echo "==> Training it (gpt-kjv.yaml)"
sed "s|/tmp/trainyard-examples/gpt|$work|g" "$here/gpt-kjv.yaml" >"$work/gpt-kjv.yaml"
if ! "$trainyard" submit "$work/gpt-kjv.yaml" --wait >"$work/submit.out" 2>&1; then
  echo "run.sh: gpt-kjv.yaml did not succeed:" >&2
  cat "$work/submit.out" >&2
  exit 1
fi
id=$(head -1 "$work/submit.out")
model=$("$trainyard" describe "$id" -o json |
  "$python" -c "import json, sys; print(json.load(sys.stdin)['modelUri'])")
"$trainyard" logs "$id" | grep -E '^(\[[^]]*\] )?step=' | sed -n '1p;$p'

echo "==> The exported weights ($model) in the plain PyTorch model"
"$python" "$here/gpt.py" sample --model "${model#file://}" --data "$work" --prompt "And God said"
