#!/usr/bin/env bash
# The GPU check: run from the repository root on a CUDA machine that has a compiler, CMake and a
# PyTorch install, with the bundle (.gpu/, from `make gpu-bundle`) beside the sources. Builds the
# trainer and its tests against that machine's own LibTorch and NCCL, then runs each item of the
# acceptance on its own (a failure or skip never stops the next) and writes a report.
# Usage: scripts/gpu-check.sh [OUT_DIR]      (default: $OUT, else ./gpu-report)
#   BUNDLE=.gpu  BUILD=build-gpu  PYTHON=python3  JOBS=$(nproc)  ITEMS="build unit ..." (a subset)
#   DEADLINE_S=N: an item not begun N seconds after the start is skipped ("out of time"); the
#   report is rewritten after every item, so a call stopped at its limit still has one.
# Writes into OUT_DIR at most 8 files: report.md, report.json, build.log, items.log,
# cluster-logs.tar.gz, bench.md. A rerun reuses the build folder: only what changed is rebuilt.
# Everything but the benchmarks fits one 10-minute call on 16 cores; the benchmarks take a call of
# their own: ITEMS="machine build benchmarks data_wait" (the build is then already there), and
# with every case of bench/gpu_models.py (each compiled twice by torch.compile) more than one:
# BENCH_ARGS="--only resnet50-fp32,resnet50-bf16", then "--only transformer-fp32,transformer-tf32,
# transformer-bf16,mlp" (each into an OUT_DIR of its own).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
out=${1:-${OUT:-$here/gpu-report}}
build=${BUILD:-$here/build-gpu}
packed=${BUNDLE:-$here/.gpu}/bundle.tar.xz
[ -f "$packed" ] || { echo "gpu-check: no bundle at $packed: run make gpu-bundle where the dependencies are, and carry .gpu" >&2; exit 2; }
# Unpacked into the build folder once per bundle.
bundle=$build/bundle
mkdir -p "$build"
stamp=$(cksum <"$packed")
if [ "$(cat "$bundle/.stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$bundle" && mkdir -p "$bundle"
  if ! tar -C "$bundle" -xJf "$packed" 2>/dev/null; then
    # No xz program (a minimal system): Python's lzma reads it.
    ${PYTHON:-python3} -c '
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    try:
        t.extractall(sys.argv[2], filter="fully_trusted")
    except TypeError:
        t.extractall(sys.argv[2])' \
      "$packed" "$bundle" || { echo "gpu-check: cannot unpack $packed" >&2; exit 2; }
  fi
  echo "$stamp" >"$bundle/.stamp"
fi
# OpenSSL 3 keeps its ABI: where the machine has its own libssl.so.3 and libcrypto.so.3, the
# bundle's point at them, so that a process holds one OpenSSL whoever loads it first (a
# LibTorch from the machine's packages brings libraries that load the machine's).
ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)  # /sbin may be off the PATH
for lib in libssl.so.3 libcrypto.so.3; do
  own=$("$ldconfig" -p 2>/dev/null | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')
  [ -n "$own" ] && [ -e "$own" ] && ln -sf "$own" "$bundle/usr/lib/x86_64-linux-gnu/$lib"
done
python=${PYTHON:-python3}
jobs=${JOBS:-$(nproc)}
all_items="machine build unit gpu_tests cgroups cluster_cpu gpu_job nvml gpu_health precision cuda_graph gpu_metrics benchmarks data_wait program_bench"
items=${ITEMS:-$all_items}
mkdir -p "$out"
state=$(mktemp -d /tmp/gpu-check-XXXXXX)
work=$state/work
mkdir -p "$work"
: >"$out/items.log"
results=$state/results.tsv   # name \t status \t seconds \t detail
figures=$state/figures.tsv   # name \t key \t value
: >"$results"
: >"$figures"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
cluster_pid=""
cleanup() {
  [ -n "$cluster_pid" ] && kill -TERM "$cluster_pid" 2>/dev/null && wait "$cluster_pid" 2>/dev/null
}
trap cleanup EXIT

log() { echo "$*" >>"$out/items.log"; }
figure() { printf '%s\t%s\t%s\n' "$current" "$1" "$2" >>"$figures"; log "  $1 = $2"; }
# An item's function ends with `pass`, `fail REASON` or `skip REASON` (its last word counts).
pass() { echo "pass" >"$state/$current.status"; echo "${1:-}" >"$state/$current.detail"; }
fail() { echo "fail" >"$state/$current.status"; echo "$1" >"$state/$current.detail"; }
skip() { echo "skip" >"$state/$current.status"; echo "$1" >"$state/$current.detail"; }
has_cuda() { [ "$(cat "$state/cuda" 2>/dev/null)" = "True" ]; }
built() { [ -x "$build/bin/trainyard-trainer" ]; }

run_item() {
  current=$1
  echo "fail" >"$state/$current.status"
  echo "ended without a result" >"$state/$current.detail"
  log ""
  log "==== $current ($(date -u +%H:%M:%S))"
  echo "gpu-check: $current ..."
  local t0=$SECONDS
  "item_$current" >>"$out/items.log" 2>&1
  local status detail
  status=$(cat "$state/$current.status")
  detail=$(tr '\n\t' '  ' <"$state/$current.detail")
  printf '%s\t%s\t%s\t%s\n' "$current" "$status" "$((SECONDS - t0))" "$detail" >>"$results"
  echo "gpu-check: $current: $status${detail:+ ($detail)}"
}

# ---- items ----

item_machine() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
  "$python" - "$state" <<'EOF'
import sys, torch
state = sys.argv[1]
cuda = torch.cuda.is_available()
open(f"{state}/cuda", "w").write(str(cuda))
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", cuda)
if cuda:
    print("device", torch.cuda.get_device_name(0))
EOF
  local torch_version gpu
  torch_version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) ||
    { fail "$python cannot import torch"; return; }
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  figure torch "$torch_version"
  figure gpu "${gpu:-none}"
  figure cores "$(nproc)"
  figure compiler "$(c++ --version | head -1)"
  figure cmake "$(cmake --version | head -1)"
  figure glibc "$(ldd --version | head -1 | awk '{print $NF}')"
  # From NCCL 2.30, NCCL_MULTI_RANK_GPU_ENABLE=1 lets two ranks share one GPU (docs/gpu.md).
  local nccl
  nccl=$("$python" -c 'import torch; v = torch.cuda.nccl.version(); print(".".join(map(str, v)) if isinstance(v, tuple) else v)' 2>/dev/null || echo none)
  figure nccl "$nccl"
  figure nccl_multi_rank_gpu "$("$python" -c 'import sys; v = tuple(int(x) for x in sys.argv[1].split(".")[:2]) if sys.argv[1][0].isdigit() else (0, 0); print("yes" if v >= (2, 30) else "no")' "$nccl")"
  if has_cuda; then pass "$gpu, torch $torch_version"; else pass "no CUDA device; torch $torch_version"; fi
}

# NCCL and the CUDA runtime that PyTorch itself loads (its pip packages), else the toolkit's.
find_nccl() {
  "$python" - <<'EOF'
import glob, os, site, sys
roots = [os.path.join(p, "nvidia") for p in site.getsitepackages() + [site.getusersitepackages()]]
def first(pattern):
    for r in roots:
        hits = sorted(glob.glob(os.path.join(r, pattern), recursive=True))
        if hits:
            return hits[0]
    return ""
inc = first("**/include/nccl.h")
lib = first("**/lib/libnccl.so*")
rt_inc = first("**/include/cuda_runtime_api.h")
rt_lib = first("**/lib/libcudart.so*")
for base in ("/usr/local/cuda",):
    inc = inc or (os.path.exists(f"{base}/include/nccl.h") and f"{base}/include/nccl.h") or ""
    lib = lib or next(iter(sorted(glob.glob(f"{base}/lib64/libnccl.so*"))), "")
    rt_inc = rt_inc or (os.path.exists(f"{base}/include/cuda_runtime_api.h") and f"{base}/include/cuda_runtime_api.h") or ""
    rt_lib = rt_lib or next(iter(sorted(glob.glob(f"{base}/lib64/libcudart.so*"))), "")
print("|".join([os.path.dirname(inc) if inc else "", lib,
                os.path.dirname(rt_inc) if rt_inc else "", rt_lib]))
EOF
}

item_build() {
  local torch_dir t0=$SECONDS
  torch_dir=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')/Torch
  [ -f "$torch_dir/TorchConfig.cmake" ] || { fail "no TorchConfig.cmake under $torch_dir"; return; }
  local nccl_args=(-DTRAINYARD_WITH_NCCL=OFF)
  # '|'-separated: a missing one is an empty field, never a shift of the others.
  local nccl_inc nccl_lib rt_inc rt_lib
  IFS='|' read -r nccl_inc nccl_lib rt_inc rt_lib < <(find_nccl)
  # The CUDA runtime alone is enough for the batch feed's copy stream; NCCL needs it too.
  local rt_args=()
  if [ -n "$rt_inc" ] && [ -n "$rt_lib" ]; then
    rt_args=(-DCUDART_INCLUDE_DIR="$rt_inc" -DCUDART_LIBRARY="$rt_lib")
  fi
  if [ -n "$nccl_inc" ] && [ -n "$nccl_lib" ] && [ ${#rt_args[@]} -gt 0 ]; then
    nccl_args=(-DTRAINYARD_WITH_NCCL=ON -DNCCL_INCLUDE_DIR="$nccl_inc" -DNCCL_LIBRARY="$nccl_lib")
    figure nccl "$nccl_lib"
  else
    figure nccl "not found (the NCCL communicator is left out)"
  fi
  # Configured every time (seconds; a failed configure is never taken for a finished one), and
  # then only what changed is rebuilt.
  local generator=()
  if [ -f "$build/build.ninja" ] || { [ ! -f "$build/Makefile" ] && command -v ninja >/dev/null 2>&1; }; then
    generator=(-G Ninja)
  fi
  # CMAKE_POLICY_VERSION_MINIMUM: CMake 4 refuses configs that ask for policies below 3.5.
  cmake -S "$here" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DTRAINYARD_GPU_BUNDLE="$bundle" -DTorch_DIR="$torch_dir" "${nccl_args[@]}" "${rt_args[@]}" \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 >"$out/build.log" 2>&1 ||
    { tail -30 "$out/build.log"; fail "cmake configure failed (build.log)"; return; }
  cmake --build "$build" -j"$jobs" >>"$out/build.log" 2>&1 ||
    { grep -m20 -E 'error|Error' "$out/build.log"; fail "build failed (build.log)"; return; }
  figure build_seconds "$((SECONDS - t0))"
  figure batch_feed "$(grep -m1 -o 'GPU batch feed: .*' "$out/build.log" || echo unknown)"
  ldd "$build/bin/trainyard-trainer" | grep -E 'torch|nccl|cudart|grpc|gloo' || true
  if ldd "$build/bin/trainyard-trainer" | grep -q 'not found'; then
    ldd "$build/bin/trainyard-trainer" | grep 'not found'
    fail "the trainer does not resolve all its libraries"; return
  fi
  # One folder of all four programs either way: the tests look in the build's bin/, and the
  # agent and `trainyard up` look beside themselves (the bundle's bin/).
  ln -sf "$build/bin/trainyard-trainer" "$bundle/bin/trainyard-trainer"
  for b in trainyard trainyard-coordinator trainyard-worker; do
    ln -sf "$bundle/bin/$b" "$build/bin/$b"
  done
  pass "$((SECONDS - t0)) s on $jobs cores"
}

# ctest's own summary gives the counts; a label with no test ran nothing.
run_ctest() {  # LABEL [TIMEOUT_S]
  local label=$1
  (cd "$build" && ctest -L "$label" --output-on-failure --timeout "${2:-600}" \
    -j"$((jobs > 4 ? 4 : jobs))") \
    >"$state/ctest-$label.log" 2>&1
  local rc=$?
  cat "$state/ctest-$label.log"
  grep -E 'tests passed|tests failed' "$state/ctest-$label.log" | tail -1
  return $rc
}

item_unit() {
  built || { skip "no build"; return; }
  if run_ctest unit; then
    pass "$(grep -E 'tests passed' "$state/ctest-unit.log" | tail -1)"
  else
    fail "$(grep -E 'tests passed|tests failed' "$state/ctest-unit.log" | tail -1); failed: $(grep -E '^\s+[0-9]+ - ' "$state/ctest-unit.log" | awk '{print $3}' | tr '\n' ' ')"
  fi
}

item_gpu_tests() {
  built || { skip "no build"; return; }
  # The GPU cases take seconds: a hang must not eat the call.
  if ! run_ctest gpu 120; then fail "$(grep -E '\*\*\*Failed|tests failed' "$state/ctest-gpu.log" | tail -1)"; return; fi
  local ran
  ran=$(grep -hoE '\[  PASSED  \] [0-9]+ test' "$build"/Testing/Temporary/LastTest.log | head -1 | awk '{print $4}')
  if has_cuda; then
    [ "${ran:-0}" -gt 0 ] && pass "$ran cases passed" || fail "no case ran on the GPU"
  else
    skip "no CUDA device: every case skipped ($(grep -m1 -oE 'no CUDA device[^"]*' "$build"/Testing/Temporary/LastTest.log || echo 'see items.log'))"
  fi
}

# The agent's per-task cgroups on this machine's kernel (most GPU machines and containers have
# cgroup v2, which CI's machines mount only beside v1): task_isolation_test, with the python that
# holds PyTorch for its tasks, twice: in the cgroup the machine put us in (whatever it delegates),
# and, as root, in a cgroup made here with the memory and cpu controllers delegated, as a
# container runtime makes one. Records which hierarchy the agent chose and why.
gtest_summary() {  # LOG: "6 passed, 1 skipped (Suite.Case), 1 failed (Suite.Case)"
  awk '/^\[  PASSED  \] [0-9]+ test/ {p = $4}
       /^\[  (SKIPPED|FAILED) +\] [A-Za-z]/ && !/ms\)$/ {k = ($2 == "SKIPPED") ? "skipped" : "failed"; n[k]++; names[k] = names[k] " " $NF}
       END {printf "%d passed", p; for (k in n) printf ", %d %s (%s)", n[k], k, substr(names[k], 2)}' "$1"
}

item_cgroups() {
  local bin=$build/tests/task_isolation_test root=/sys/fs/cgroup py
  [ -x "$bin" ] || { skip "no build"; return; }
  py=$(command -v "$python")
  figure kernel "$(uname -r)"
  figure self_cgroup "$(tr '\n' ' ' </proc/self/cgroup)"
  local mounts
  mounts=$(awk '{for (i = 7; i < NF; i++) if ($i == "-" && $(i+1) ~ /^cgroup/) printf "%s(%s) ", $5, $(i+1)}' /proc/self/mountinfo)
  figure cgroup_mounts "${mounts:-none}"
  # A root with no cgroup file system mounted in it (the rehearsal's Debian 13 root) has nothing
  # to test; a machine's own root always has one.
  [ -n "$mounts" ] || { skip "no cgroup file system is mounted in this root"; return; }
  [ -f "$root/cgroup.controllers" ] && figure v2_controllers "$(cat "$root/cgroup.controllers")"
  local placed_ok=0 delegated_ok=0 delegated="not tried (no cgroup v2 root with the cpu controller, or not root)"
  TRAINYARD_TEST_PYTHON=$py timeout 300 "$bin" >"$state/cgroups.log" 2>&1 && placed_ok=1
  cat "$state/cgroups.log"
  figure as_placed "$(gtest_summary "$state/cgroups.log"); $(grep -m1 -o 'task isolation: .*' "$state/cgroups.log" | head -c 300)"
  if [ "$(id -u)" = 0 ] && grep -qw cpu "$root/cgroup.controllers" 2>/dev/null; then
    local own=$root/trainyard-check-$$ c
    for c in memory cpu; do
      grep -qw "$c" "$root/cgroup.subtree_control" || echo "+$c" >"$root/cgroup.subtree_control" ||
        figure delegation "cannot enable $c at the root"
    done
    if mkdir "$own" 2>/dev/null; then
      # One process alone in the delegated cgroup (the test moves itself into a leaf of it).
      TRAINYARD_TEST_PYTHON=$py OWN=$own timeout 300 bash -c 'echo $$ >"$OWN/cgroup.procs" && exec "$0"' "$bin" \
        >"$state/cgroups-delegated.log" 2>&1 && delegated_ok=1
      cat "$state/cgroups-delegated.log"
      delegated="$(gtest_summary "$state/cgroups-delegated.log"); $(grep -m1 -o 'task isolation: .*' "$state/cgroups-delegated.log" | head -c 300)"
      grep -q '^\[  SKIPPED' "$state/cgroups-delegated.log" && delegated_ok=0
      find "$own" -depth -type d -exec rmdir {} \; 2>/dev/null
    else
      delegated="cannot make $own"
    fi
  fi
  figure delegated "$delegated"
  # The cgroup a sandbox puts us in may share its processes (no v2 child can then get controllers:
  # the agent falls back to the watch and says why); the delegated one is what a worker is given.
  local placed
  placed="$([ $placed_ok = 1 ] && echo passed || echo "cgroups refused: $(grep -m1 -o 'cgroup v2: [^;]*' "$state/cgroups.log")")"
  if [ "$delegated_ok" = 1 ] || { [ "$placed_ok" = 1 ] && ! grep -q '^\[  SKIPPED' "$state/cgroups.log"; }; then
    pass "delegated: $delegated; as placed: $placed"
  else
    fail "delegated: $delegated; as placed: $placed"
  fi
}

# A local cluster from the bundle's coordinator and agent with the trainer built here.
start_cluster() {
  local port
  port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  export TRAINYARD_COORDINATOR="127.0.0.1:$port"
  "$bundle/bin/trainyard" up --workers 1 --port "$port" --state-dir "$work/cluster" \
    >"$work/cluster.log" 2>&1 &
  cluster_pid=$!
  local deadline=$((SECONDS + 60))
  until "$bundle/bin/trainyard" workers 2>/dev/null | grep -q READY; do
    if ! kill -0 "$cluster_pid" 2>/dev/null || [ $SECONDS -gt $deadline ]; then
      cat "$work/cluster.log"; return 1
    fi
    sleep 0.2
  done
  "$bundle/bin/trainyard" workers
}

# The preconditions of an item that runs jobs: the build, CUDA when it says `cuda`, and the local
# cluster (started by the first item that needs it). Says skip or fail itself; returns non-zero
# when the item cannot go on.
ready_for_jobs() {  # [cuda [WHY-NO-CUDA-IS-FINE]]
  built || { skip "no build"; return 1; }
  if [ "${1:-}" = cuda ] && ! has_cuda; then skip "no CUDA device${2:+ ($2)}"; return 1; fi
  [ -n "$cluster_pid" ] || start_cluster || { fail "the local cluster did not come up"; return 1; }
}

job_spec() {  # NAME GPUS STEPS
  cat <<EOF
name: $1
strategy: single
resources: {gpus_per_worker: $2}
model: {builtin: mlp, args: {inputs: 64, hidden: [256, 256], classes: 8}}
data:
  synthetic: {samples: 20000, features: 64, classes: 8, noise: 0.5}
  validation_split: 0.1
batch_size: 256
optimizer: {name: adamw, lr: 0.001}
loss: cross_entropy
max_steps: $3
seed: 3
checkpoint: {uri: "file://$work/ckpt", every_steps: 100}
EOF
}

# Submits and follows the job to its end (at most 10 minutes); prints its id when it succeeded.
run_job() {  # NAME GPUS STEPS [RESUME_FROM]
  local spec="$work/$1.yaml" job rc=0
  job_spec "$1" "$2" "$3" >"$spec"
  local resume=()
  [ -n "${4:-}" ] && resume=(--resume-from "$4")
  timeout 600 "$bundle/bin/trainyard" submit "$spec" "${resume[@]}" --wait >"$work/$1.submit" 2>&1 || rc=$?
  job=$(head -1 "$work/$1.submit")
  cat "$work/$1.submit" >&2
  [ -n "$job" ] && "$bundle/bin/trainyard" describe "$job" >&2
  [ -n "$job" ] && "$bundle/bin/trainyard" logs "$job" >"$work/$1.log" 2>&1
  cat "$work/$1.log" >&2 2>/dev/null
  [ "$rc" = 0 ] || return 1
  echo "$job"
}

job_field() {  # JOB PYTHON-EXPRESSION over `describe -o json` (the Job message) as j
  "$bundle/bin/trainyard" describe "$1" -o json |
    "$python" -c "import json,sys; j=json.load(sys.stdin); print($2)"
}

# The same path as gpu_job on the CPU, so that a machine without a GPU (the rehearsal) proves the
# bundle's programs, the job helpers and the resume check before a GPU run depends on them.
item_cluster_cpu() {
  ready_for_jobs || return
  local job resumed start t0=$SECONDS
  job=$(run_job cpu-check 0 200) || { fail "a CPU job through the bundle's coordinator and agent did not succeed"; return; }
  figure cpu_job_seconds "$((SECONDS - t0))"
  resumed=$(run_job cpu-check-resume 0 300 "$job") || { fail "the resume of $job did not succeed"; return; }
  start=$(job_field "$resumed" 'j.get("progress", {}).get("attemptStartStep", 0)')
  figure resume_start_step "$start"
  [ "$start" = 200 ] || { fail "the resume of $job started at step $start, not 200"; return; }
  pass "job $job SUCCEEDED on the CPU through the bundle's coordinator and agent; $resumed resumed it at step 200"
}

item_gpu_job() {
  ready_for_jobs cuda || return
  local job resumed on_cpu t0=$SECONDS
  job=$(run_job gpu-check 1 300) || { fail "a 1-GPU job did not succeed"; return; }
  figure gpu_job_seconds "$((SECONDS - t0))"
  grep -q 'training on cuda:0' "$work/gpu-check.log" ||
    { fail "job $job did not train on cuda:0 (its log)"; return; }
  # Resumed on the GPU and on the CPU from the GPU job's last checkpoint.
  resumed=$(run_job gpu-resume 1 400 "$job") || { fail "the GPU resume of $job did not succeed"; return; }
  on_cpu=$(run_job cpu-resume 0 400 "$job") || { fail "the CPU resume of $job did not succeed"; return; }
  local s1 s2
  s1=$(job_field "$resumed" 'j.get("progress", {}).get("attemptStartStep", 0)')
  s2=$(job_field "$on_cpu" 'j.get("progress", {}).get("attemptStartStep", 0)')
  figure gpu_resume_start_step "$s1"
  figure cpu_resume_start_step "$s2"
  [ "$s1" = 300 ] && [ "$s2" = 300 ] ||
    { fail "resumes started at $s1 (GPU) and $s2 (CPU), not at 300"; return; }
  pass "trained on cuda:0; resumed at step 300 on the GPU and on the CPU"
}

item_nvml() {
  ready_for_jobs || return
  local line smi
  line=$(grep -m1 -o 'offering .* GPUs, found through .*' "$work/cluster/logs/worker-1.log")
  figure agent "${line:-no discovery line (trainyard up gave worker-1 --gpus=0: no /dev/nvidia*)}"
  if ! nvidia-smi -L >/dev/null 2>&1; then skip "no NVIDIA driver"; return; fi
  smi=$(nvidia-smi -L | grep -c '^GPU ')
  case "$line" in
    "offering $smi GPUs, found through NVML") pass "the agent found $smi GPUs through NVML, as nvidia-smi lists" ;;
    *) fail "nvidia-smi lists $smi GPUs; the agent: ${line:-said nothing}" ;;
  esac
}
# The GPU health checks on a healthy machine (docs/gpu.md, GPU health): the trainer's compute
# check (`--gpu_check`: known products against the CPU's, a 256 MiB memory pattern) passes on
# every GPU, and the agent's pre-flight check (NVML's ECC, retired pages, row remapping, PCIe link
# and clock readings, then that compute check) found every GPU healthy and took none out.
item_gpu_health() {
  ready_for_jobs cuda "the compute check's CPU side is in gpu_check_test, the agent's in nvml_test and agent_gpu_test" || return
  local n i summary rc=0 failed="" log="$work/cluster/logs/worker-1.log" line out_of_service
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  [ "${n:-0}" -gt 0 ] || n=1
  for ((i = 0; i < n; i++)); do
    summary=$(CUDA_VISIBLE_DEVICES=$i CUDA_DEVICE_ORDER=PCI_BUS_ID timeout 120 \
      "$build/bin/trainyard-trainer" --gpu_check=0 2>"$work/gpu-check-$i.err")
    rc=$?
    cat "$work/gpu-check-$i.err"
    summary=$(echo "$summary" | tail -1)
    figure "gpu_check_$i" "exit $rc: $summary"
    [ "$rc" = 0 ] || failed="$failed GPU $i ($summary)"
  done
  line=$(grep -m1 -o 'pre-flight check: .*' "$log")
  figure agent_preflight "${line:-none}"
  out_of_service=$(grep -o 'GPU [0-9]* taken out of service: .*' "$log" | head -3 | tr '\n' ' ')
  [ -z "$failed" ] || { fail "the compute check failed on$failed"; return; }
  [ -n "$line" ] || { fail "the agent logged no pre-flight check (a bundle made before it: make gpu-bundle)"; return; }
  [ -z "$out_of_service" ] || { fail "the agent took GPUs out of service: $out_of_service"; return; }
  case "$line" in
    "pre-flight check: $n of $n GPUs passed (NVML's readings, the compute check)") ;;
    *) fail "the agent's pre-flight check: $line (expected all $n GPUs with NVML's readings and the compute check)"; return ;;
  esac
  pass "the compute check passed on $n GPUs ($(echo "$summary" | grep -o 'in [0-9.]* s' || echo "$summary")); the agent's pre-flight passed them all"
}

item_precision() {
  ready_for_jobs cuda "bf16 on the CPU is checked against PyTorch by make test" || return
  local rc=0
  "$python" "$here/tests/gpu/precision_parity.py" "$bundle/bin/trainyard" "$work/precision" \
    >"$work/precision.out" 2>&1 || rc=$?
  cat "$work/precision.out"
  while read -r _ key value; do figure "$key" "$value"; done < <(grep '^figure ' "$work/precision.out")
  if [ "$rc" = 0 ]; then
    pass "fp32, bf16 and fp16 per-step losses match torch.autocast (and GradScaler) within tolerance"
  else
    fail "$(grep -v '^figure\|^{' "$work/precision.out" | tail -1)"
  fi
}
# The whole step as a CUDA graph (cuda_graph: true) against the same job without, through the
# bundle's coordinator and agent: the MLP in fp32 and the built-in transformer in bf16, each step's
# loss printed (log_every_steps: 1) over 100 steps with a learning rate that moves every step; the
# two runs' losses must be the same to the last printed digit, and the graphed run must say it
# captured its step. Also each run's median samples/s over steps 20 to 100.
graph_job_spec() {  # NAME MODEL(mlp|transformer) CUDA_GRAPH(true|false)
  local model data precision batch
  if [ "$2" = transformer ]; then
    model="{builtin: transformer, args: {vocab: 256, context: 64, layers: 4, dim: 256, heads: 4}}"
    data="{tokens: \"$work/graph-text/t-*.safetensors\", shuffle: false}"
    precision=bf16 batch=32
  else
    model="{builtin: mlp, args: {inputs: 64, hidden: [1024, 1024], classes: 8}}"
    data="{synthetic: {samples: 40000, features: 64, classes: 8, noise: 0.5}}"
    precision=fp32 batch=256
  fi
  cat <<EOF
name: $1
resources: {gpus_per_worker: 1}
model: $model
data: $data
batch_size: $batch
optimizer: {name: adamw, lr: 0.001, weight_decay: 0.01, schedule: {name: cosine, warmup_steps: 10}}
precision: $precision
cuda_graph: $3
max_steps: 100
log_every_steps: 1
seed: 3
EOF
}

median_rate() {  # LOG: the median samples/s of its progress lines from step 20 on
  grep -oE '^step=([2-9][0-9]|100) .*samples_per_s=[0-9.]+' "$1" | sed -E 's/.*samples_per_s=//' |
    sort -n | awk '{a[NR] = $1} END {print (NR ? a[int((NR + 1) / 2)] : "none")}'
}

item_cuda_graph() {
  ready_for_jobs cuda || return
  mkdir -p "$work/graph-text"
  "$python" -c 'import sys, numpy as np
rng = np.random.default_rng(0)
open(sys.argv[1], "wb").write(rng.integers(32, 127, size=400000, dtype=np.uint8).tobytes())' \
    "$work/graph-text.txt" &&
    "$bundle/bin/trainyard" data pack --text "$work/graph-text.txt" "$work/graph-text/t" ||
    { fail "cannot write the transformer's token shards"; return; }
  local model mode job n summary=""
  for model in mlp transformer; do
    for mode in false true; do
      local name="graph-$model-$mode"
      graph_job_spec "$name" "$model" "$mode" >"$work/$name.yaml"
      timeout 600 "$bundle/bin/trainyard" submit "$work/$name.yaml" --wait >"$work/$name.submit" 2>&1
      job=$(head -1 "$work/$name.submit")
      "$bundle/bin/trainyard" logs "$job" >"$work/$name.log" 2>&1
      grep -E '^step=[0-9]+ total=' "$work/$name.log" | sed -E 's/ lr=.*//' >"$work/$name.losses"
      figure "${model}_${mode}_samples_per_s" "$(median_rate "$work/$name.log")"
    done
    n=$(wc -l <"$work/graph-$model-false.losses")
    [ "$n" = 100 ] ||
      { fail "$model: the eager job printed $n step losses, not 100 (graph-$model-false.log)"; return; }
    grep -q 'cuda_graph: the training step captured' "$work/graph-$model-true.log" ||
      { fail "$model: the cuda_graph job never captured its step (graph-$model-true.log)"; return; }
    if ! diff -q "$work/graph-$model-false.losses" "$work/graph-$model-true.losses" >/dev/null; then
      figure "${model}_first_difference" \
        "$(diff "$work/graph-$model-false.losses" "$work/graph-$model-true.losses" | head -3 | tr '\n' ' ')"
      fail "$model: the graphed run's step losses differ from the eager run's"; return
    fi
    summary="$summary$model: 100 step losses identical; "
  done
  pass "${summary%; }"
}

# Trainyard against eager PyTorch and torch.compile on this GPU (bench/gpu_models.py): its table
# goes to OUT_DIR/bench.md. Several minutes: run it in a call of its own (ITEMS=benchmarks).
item_benchmarks() {
  ready_for_jobs cuda || return
  local rc=0
  "$python" "$here/bench/gpu_models.py" "$bundle/bin/trainyard" "$work/bench" \
    ${BENCH_ARGS:-} >"$out/bench.md" 2>&1 || rc=$?
  cat "$out/bench.md"
  [ "$rc" = 0 ] || { fail "bench/gpu_models.py exited $rc (bench.md)"; return; }
  # The script's last line is its figures as JSON: kept for data_wait, and the headline ones
  # into the report.
  while read -r key value; do figure "$key" "$value"; done < <("$python" - "$out/bench.md" "$state/bench.json" <<'EOF'
import json, sys
figures = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
json.dump(figures, open(sys.argv[2], "w"))
for case, r in figures.items():
    if isinstance(r, dict):
        for k in ("trainyard", "trainyard_graph", "eager", "compiled", "compiled_ro",
                  "vs_eager", "vs_compiled", "vs_compiled_ro", "gpu_util_trainyard",
                  "mfu_trainyard", "data_wait_share"):
            v = r.get(k)
            print(f"{case}.{k}", "-" if v is None else round(v, 4))
EOF
)
  pass "table in bench.md"
}

# The ResNet-50 benchmark's share of step time spent waiting for data (aim: under 2 %). Batches
# are pinned but still copied on the default stream: no side-stream copy ahead of use yet.
item_data_wait() {
  [ -f "$state/bench.json" ] || { skip "needs the benchmarks item first (ITEMS=\"benchmarks data_wait\")"; return; }
  local share
  share=$("$python" -c 'import json,sys; r=json.load(open(sys.argv[1])).get("resnet50-fp32"); print(r["data_wait_share"] if r else "")' "$state/bench.json")
  [ -n "$share" ] || { skip "the ResNet-50 fp32 case did not run"; return; }
  figure resnet50_fp32_data_wait_share "$share"
  if "$python" -c "import sys; sys.exit(0 if float('$share') < 0.02 else 1)"; then
    pass "data wait $share of step time (< 0.02)"
  else
    fail "data wait $share of step time (aim < 0.02; batches are not yet copied on a side stream)"
  fi
}
item_gpu_metrics() {
  ready_for_jobs cuda || return
  # worker-1's metrics are on the coordinator's port + 2 (trainyard up). A job that runs until
  # cancelled; scraped once it has trained (progress past step 100), so that the GPU is busy
  # with it, until its utilisation series is labelled with the job and above 0.
  local url="http://127.0.0.1:$(( ${TRAINYARD_COORDINATOR##*:} + 2 ))/metrics" job found="" util=""
  job_spec gpu-metrics 1 1000000 >"$work/gpu-metrics.yaml"
  job=$("$bundle/bin/trainyard" submit "$work/gpu-metrics.yaml" | head -1) || { fail "submit failed"; return; }
  local deadline=$((SECONDS + 120)) step=0
  until [ "${step:-0}" -ge 100 ] || [ $SECONDS -ge $deadline ]; do
    sleep 0.5
    step=$(job_field "$job" 'j.get("progress", {}).get("step", 0)' 2>/dev/null)
  done
  figure step_at_first_scrape "${step:-0}"
  deadline=$((SECONDS + 30))
  while [ $SECONDS -lt $deadline ]; do
    if curl -sf "$url" >"$work/worker-metrics.txt" 2>/dev/null ||
       "$python" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' "$url" >"$work/worker-metrics.txt" 2>/dev/null; then
      util=$(grep -m1 "^DCGM_FI_DEV_GPU_UTIL{.*job=\"$job\"" "$work/worker-metrics.txt" | awk '{print $NF}')
      if [ -n "$util" ]; then
        found=1
        "$python" -c "import sys; sys.exit(0 if float('$util') > 0 else 1)" && break
      fi
    fi
    sleep 1
  done
  "$bundle/bin/trainyard" cancel "$job" >/dev/null 2>&1
  grep -E '^(DCGM_|trainyard_worker_gpu)' "$work/worker-metrics.txt"
  [ -n "$found" ] || { fail "no DCGM_FI_DEV_GPU_UTIL series labelled with job $job in $url (job at step ${step:-0})"; return; }
  local v
  for m in DCGM_FI_DEV_GPU_UTIL DCGM_FI_DEV_FB_USED DCGM_FI_DEV_GPU_TEMP DCGM_FI_DEV_POWER_USAGE; do
    v=$(grep -m1 "^$m{.*job=\"$job\"" "$work/worker-metrics.txt" | awk '{print $NF}')
    figure "$m" "${v:-absent}"
  done
  "$python" -c "import sys; sys.exit(0 if float('$util') > 0 else 1)" ||
    { fail "job $job's GPU series are labelled, but its utilisation stayed 0 for 30 s while it trained"; return; }
  pass "each GPU series of the agent names job $job while it trains; utilisation $util %"
}

# A user's own DDP script (Gloo, CPU) under Trainyard and under torchrun, pair by pair
# (bench/program_vs_torchrun.sh): on a machine with more cores than ranks, where a gap of 1 % can
# be seen, as it cannot on a 2-core one. PROGRAM_ROUNDS (default 6) pairs of each.
item_program_bench() {
  "$python" -c 'import torch.distributed.run' 2>/dev/null ||
    { skip "$python has no torch.distributed.run"; return; }
  local rc=0 col
  PYTHON="$python" timeout 600 "$here/bench/program_vs_torchrun.sh" "$build" \
    "${PROGRAM_ROUNDS:-6}" 600 >"$out/program_bench.md" 2>&1 || rc=$?
  cat "$out/program_bench.md"
  [ "$rc" = 0 ] || { fail "bench/program_vs_torchrun.sh exited $rc (program_bench.md)"; return; }
  for col in plain module; do  # the round-by-round median ratio to torchrun on the same script
    figure "steps_ratio_$col" "$(grep -m1 "^| Trainyard, .*$col" "$out/program_bench.md" |
      awk -F'|' '{print $5}' | awk '{print $1}')"
  done
  pass "table in program_bench.md"
}

# report.md and report.json from the items so far: written after every item, so that a call cut
# short at its time limit still brings back what ran. SHOW=1 prints it.
write_report() {  # [SHOW]
"$python" - "$results" "$figures" "$out" "$started" "${1:-}" <<'EOF'
import json, sys, datetime
results_path, figures_path, out, started, show = sys.argv[1:6]
items = []
for line in open(results_path):
    name, status, seconds, detail = line.rstrip("\n").split("\t", 3)
    items.append({"name": name, "status": status, "seconds": int(seconds), "detail": detail.strip(),
                  "figures": {}})
by_name = {i["name"]: i for i in items}
for line in open(figures_path):
    name, key, value = line.rstrip("\n").split("\t", 2)
    if name in by_name:
        by_name[name]["figures"][key] = value
counts = {s: sum(1 for i in items if i["status"] == s) for s in ("pass", "fail", "skip")}
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
report = {"started": started, "finished": now,
          "counts": counts, "items": items}
json.dump(report, open(f"{out}/report.json", "w"), indent=2)
with open(f"{out}/report.md", "w") as f:
    f.write(f"# GPU check, {started}\n\n")
    f.write(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped\n\n")
    f.write("| item | result | seconds | detail |\n| --- | --- | ---: | --- |\n")
    for i in items:
        f.write(f"| {i['name']} | {i['status']} | {i['seconds']} | {i['detail']} |\n")
    f.write("\n## Figures\n\n")
    for i in items:
        for k, v in i["figures"].items():
            f.write(f"- {i['name']}.{k}: {v}\n")
if show:
    print(open(f"{out}/report.md").read())
EOF
}

for it in $items; do
  case " $all_items " in
    *" $it "*)
      if [ -n "${DEADLINE_S:-}" ] && [ "$SECONDS" -ge "$DEADLINE_S" ]; then
        printf '%s\tskip\t0\tout of time (DEADLINE_S=%s)\n' "$it" "$DEADLINE_S" >>"$results"
        echo "gpu-check: $it: skip (out of time)"
      else
        run_item "$it"
      fi
      write_report
      [ -d "$work/cluster/logs" ] && tar -czf "$out/cluster-logs.tar.gz" -C "$work" cluster/logs \
        $(cd "$work" && ls *.log 2>/dev/null) 2>/dev/null ;;
    *) echo "gpu-check: unknown item $it" >&2 ;;
  esac
done
cleanup
cluster_pid=""
[ -d "$work/cluster" ] && tar -czf "$out/cluster-logs.tar.gz" -C "$work" cluster/logs \
  $(cd "$work" && ls *.log 2>/dev/null) 2>/dev/null

write_report 1
grep -q $'\tfail\t' "$results" && exit 1
exit 0
