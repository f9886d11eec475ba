#!/usr/bin/env bash
# The distillation example, end to end, on a cluster that is up (`trainyard up --workers 2` in
# another terminal, or TRAINYARD_COORDINATOR set): writes the glyph images and an untrained
# TorchScript CNN under WORK (default /tmp/trainyard-distill), trains the CNN as the teacher
# (teacher.yaml), then the MLP student of student.yaml twice, with the teacher's exported model as
# its distill.teacher and without its distill line, and prints the validation accuracy of each.
#
#   examples/distill/run.sh [WORK]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${1:-/tmp/trainyard-distill}
case "$work" in /*) ;; *) work="$PWD/$work" ;; esac
trainyard=$(command -v trainyard || echo "$root/build/bin/trainyard")
[ -x "$trainyard" ] || { echo "run.sh: no trainyard binary; build it or put it on PATH" >&2; exit 1; }
python=/usr/bin/python3  # Debian's, with NumPy and PyTorch

mkdir -p "$work"
echo "==> Data and the untrained teacher in $work"
[ -d "$work/teacher-data" ] || "$python" "$here/write_glyphs.py" --out-dir "$work/teacher-data" \
  --train 12000 --validation 3000 --seed 1 --trainyard "$trainyard" >/dev/null
[ -d "$work/student-data" ] || "$python" "$here/write_glyphs.py" --out-dir "$work/student-data" \
  --train 2000 --validation 3000 --seed 2 --trainyard "$trainyard" >/dev/null
"$python" "$root/examples/write_torchscript_model.py" --out "$work/cnn-init.pt" --inputs 100 \
  --image 1 10 10 --conv 16 32 --hidden --classes 10 --seed 1 >/dev/null

# The spec's /tmp/trainyard-distill/ becomes WORK; `describe -o json` says where a job's model is.
spec() { sed "s|/tmp/trainyard-distill|$work|g" "$here/$1"; }
field() { "$trainyard" describe "$1" -o json | "$python" -c "import json, sys; print(json.load(sys.stdin)$2)"; }
run() {  # submits a spec file and waits for the job (its exit code is the outcome); prints its id
  local out="$1.out"
  if ! "$trainyard" submit "$1" --wait >"$out" 2>&1; then
    echo "run.sh: $1 did not succeed:" >&2
    cat "$out" >&2
    exit 1
  fi
  head -1 "$out"
}

echo "==> Training the teacher"
spec teacher.yaml >"$work/teacher.yaml"
teacher_job=$(run "$work/teacher.yaml")
echo "    $teacher_job"
teacher_model=$(field "$teacher_job" "['modelUri']")

echo "==> Training the student with the teacher ($teacher_model) and without it"
spec student.yaml | sed "s|teacher: [^,]*,|teacher: $teacher_model,|" >"$work/student.yaml"
spec student.yaml | grep -v '^distill:' | sed 's/^name: glyphs-student/name: glyphs-student-alone/' \
  >"$work/student-alone.yaml"
student_job=$(run "$work/student.yaml")
alone_job=$(run "$work/student-alone.yaml")
echo "    $student_job, $alone_job"

echo "==> Validation accuracy on the same 3,000 held-out images"
for job in "$teacher_job" "$student_job" "$alone_job"; do
  printf '    %-24s %s\n' "$job" \
    "$(field "$job" "['progress']['valAccuracy']" | awk '{printf "%.1f%%", 100 * $1}')"
done
