#!/usr/bin/python3
"""The commands and specs of README.md and docs/*.md, tried as a user meets them.

Every fenced block names its language (sh, yaml, text, ...), and every `sh` block has a marker on
the line before its fence:
  <!-- docs-test: run -->                  this test runs it, as below;
  <!-- docs-test: not run: REASON -->      with the reason: what runs it instead, or why it cannot
so that no block of commands a user is told to run can be added without being tried or saying why.

A `run` block runs in network and PID namespaces of its own (loopback only, so the default port
7070 is its own and nothing else is reached; nothing it starts outlives it), with an empty HOME, from the repository root, all its lines
in one bash, each as written and each must exit 0, except:
- `make build` is skipped (the test is given the built programs, --bin-dir) and `build/bin/` is
  that folder;
- `trainyard up ...` runs in the background (with or without `&`), and the next line waits until
  its workers are READY, as a user waits to see them; whatever is still running when the block
  ends is stopped;
- `PID` is the agent PID of the worker that runs the last submitted job (`trainyard workers`),
  and after `kill -TERM PID` (a preemption) the job must recover with no step lost;
- `trainyard logs -f JOB` is followed until its first progress line (`step=`), then interrupted;
- a comment saying `prints its id (ID)` is checked against what `submit` printed.

YAML blocks that are whole job specs (top-level `name` and `model`) are submitted to a local
cluster and must SUCCEED; whole search specs (`name`, `searcher`, `template`) must be accepted
at submission, and are then cancelled.

  tests/docs/docs_test.py --bin-dir build/bin [--only README.md]
"""

import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# A network namespace of its own (loopback only) and a PID namespace whose end kills whatever the
# block left running.
UNSHARE = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
MARKER = re.compile(r"^<!-- docs-test: (run|not run: .+) -->$")


def documents():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def blocks_of(path):
    """(language, marker or None, first line number, lines) of each fenced block."""
    out = []
    with open(path) as f:
        lines = f.read().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(```+)(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i] != fence.group(1):
            body.append(lines[i])
            i += 1
        out.append((fence.group(2), marker.group(1) if marker else None, start + 1, body))
        i += 1
    return out


def strip_comment(line):
    """The command without its trailing ` # comment`, and the comment."""
    m = re.match(r"^(.*?)\s+#\s(.*)$", line)
    if m and m.group(1).strip():
        return m.group(1).rstrip(), m.group(2)
    if line.lstrip().startswith("#"):
        return "", line.lstrip()[1:].strip()
    return line, ""


HELPERS = r"""
set -u
__fail() { echo "DOCS-TEST FAIL: $*" >&2; exit 1; }
__ready() {  # N: until N workers are READY (120 s)
  local deadline=$((SECONDS + 120))
  until [ "$(trainyard workers 2>/dev/null | grep -c READY)" -ge "$1" ]; do
    [ $SECONDS -lt $deadline ] || { cat "$DOCS_TMP/up.log" >&2; __fail "$1 workers not READY in 120 s"; }
    sleep 0.2
  done
}
__pid() {  # the agent PID of the worker that runs a task of the last submitted job
  [ -n "${__last_job:-}" ] || __fail "PID: no job submitted before this line"
  local pid
  pid=$(trainyard workers | awk -v j="$__last_job." 'index($NF, j) {print $4; exit}')
  [ -n "$pid" ] || { trainyard workers >&2; __fail "PID: no worker runs a task of $__last_job"; }
  echo "$pid"
}
__recovered() {  # JOB: its preempted attempt recovered (the next reported a step), no step lost
  local deadline=$((SECONDS + 120)) r
  while :; do
    r=$(trainyard describe "$1" -o json | python3 -c '
import json, sys
j = json.load(sys.stdin)
r = [x for x in j.get("restarts", []) if x.get("recovered")]
print("%s %s" % (r[-1].get("reason"), r[-1].get("stepsLost", 0)) if r else "")')
    [ -n "$r" ] && break
    [ $SECONDS -lt $deadline ] || { trainyard describe "$1" >&2; __fail "$1 did not recover in 120 s"; }
    sleep 0.2
  done
  echo "    (recovered: $r)"
  [ "$r" = "PREEMPTED 0" ] || { trainyard describe "$1" >&2; __fail "$1: expected a preemption with no step lost, got: $r"; }
}
__follow() {  # JOB: logs -f until the first progress line
  : >"$DOCS_TMP/follow.log"
  trainyard logs -f "$1" >"$DOCS_TMP/follow.log" 2>&1 &
  local p=$! deadline=$((SECONDS + 300))
  until grep -q 'step=' "$DOCS_TMP/follow.log"; do
    kill -0 $p 2>/dev/null || break
    [ $SECONDS -lt $deadline ] || break
    sleep 0.2
  done
  kill -TERM $p 2>/dev/null; wait $p 2>/dev/null  # (a background job ignores SIGINT)
  cat "$DOCS_TMP/follow.log"
  grep -q 'step=' "$DOCS_TMP/follow.log" || __fail "logs -f $1 showed no progress line"
}
__stop_all() {
  local p
  for p in $(jobs -p); do kill -TERM "$p" 2>/dev/null; done
  wait
}
trap __stop_all EXIT  # a failing line leaves no cluster behind
ip link set lo up || __fail "cannot bring up loopback in the test's network namespace"
"""


def script_of(body, bin_dir, where):
    """A bash script that runs a `run` block as the module's docstring says."""
    out = [HELPERS]
    up_started = False
    for n, raw in enumerate(body, start=1):
        line, comment = strip_comment(raw)
        line = line.strip()
        if not line:
            continue
        label = "%s, line %d: %s" % (where, n, raw.strip())
        out.append("echo %s" % shlex.quote("==> " + raw.strip()))
        if line == "make build":
            out.append("echo '    (skipped: built by the test)'")
            continue
        line = line.replace("build/bin/", bin_dir + "/")
        line = re.sub(r"\bPID\b", "$(__pid)", line)
        follow = re.match(r"^trainyard logs -f (\S+)$", line)
        if follow:
            out.append("__follow %s" % shlex.quote(follow.group(1)))
            continue
        words = line.rstrip("&").split()
        if len(words) >= 2 and os.path.basename(words[0]) == "trainyard" and words[1] == "up":
            workers = re.search(r"--workers[ =](\d+)", line)
            command = line.rstrip("&").strip()
            out.append('%s >"$DOCS_TMP/up.log" 2>&1 &' % command)
            out.append("__ready %s" % (workers.group(1) if workers else "1"))
            up_started = True
            continue
        if re.match(r"^trainyard submit\b", line):
            out.append('__out=$(%s); __rc=$?; printf "%%s\\n" "$__out"' % line)
            out.append('[ $__rc -eq 0 ] || __fail %s"exited $__rc"' %
                       shlex.quote(label + ": "))
            out.append('__last_job=$(printf "%s\\n" "$__out" | head -1)')
            expected = re.search(r"prints its id \(([A-Za-z0-9_-]+)\)", comment)
            if expected:
                out.append('[ "$__last_job" = %s ] || __fail %s"printed $__last_job"' %
                           (shlex.quote(expected.group(1)),
                            shlex.quote(label + ": expected id %s, " % expected.group(1))))
            continue
        out.append(line)
        out.append('__rc=$?; [ $__rc -eq 0 ] || __fail %s"exited $__rc"' %
                   shlex.quote(label + ": "))
        if re.match(r"^kill -TERM \$\(__pid\)$", line):
            out.append('__recovered "$__last_job"')
        if line == "kill %1" and up_started:
            out.append("wait %1 2>/dev/null; true")
    out.append("__stop_all")
    out.append("echo 'block passed'")
    return "\n".join(out) + "\n"


def run_block(path, start, body, bin_dir):
    where = "%s:%d" % (os.path.relpath(path, ROOT), start)
    tmp = tempfile.mkdtemp(prefix="trainyard-docs-test-")
    try:
        os.makedirs(os.path.join(tmp, "home"))
        env = {"PATH": bin_dir + os.pathsep + "/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": os.path.join(tmp, "home"), "DOCS_TMP": tmp, "LANG": "C.UTF-8"}
        script = os.path.join(tmp, "block.sh")
        with open(script, "w") as f:
            f.write(script_of(body, bin_dir, where))
        print("==== %s" % where, flush=True)
        run = subprocess.run(UNSHARE + ["bash", script], cwd=ROOT, env=env,
                             timeout=900)
        return None if run.returncode == 0 else "%s: exit %d" % (where, run.returncode)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def spec_kind(body):
    """'job', 'search' or None for a YAML block."""
    keys = {m.group(1) for m in (re.match(r"^([a-z_]+):", l) for l in body) if m}
    if {"name", "searcher", "template"} <= keys:
        return "search"
    if {"name", "model"} <= keys:
        return "job"
    return None


def run_specs(specs, bin_dir):
    """Submits each whole spec found in the docs to one local cluster (in a namespace of its
    own); returns the failures."""
    tmp = tempfile.mkdtemp(prefix="trainyard-docs-specs-")
    lines = [HELPERS]
    try:
        os.makedirs(os.path.join(tmp, "home"))
        lines.append('trainyard up --workers 2 >"$DOCS_TMP/up.log" 2>&1 &')
        lines.append("__ready 2")
        for i, (where, kind, body) in enumerate(specs):
            spec = os.path.join(tmp, "spec-%d.yaml" % i)
            with open(spec, "w") as f:
                f.write("\n".join(body) + "\n")
            lines.append("echo %s" % shlex.quote("==> %s (%s spec)" % (where, kind)))
            if kind == "job":
                lines.append("trainyard submit %s --wait || __fail %s" %
                             (spec, shlex.quote(where + ": the job did not succeed")))
            else:
                lines.append("__id=$(trainyard search submit %s | head -1) || __fail %s" %
                             (spec, shlex.quote(where + ": the search was refused")))
                lines.append('echo "    accepted as $__id"; trainyard search cancel "$__id" '
                             '>/dev/null || __fail %s' %
                             shlex.quote(where + ": cancelling the search failed"))
        lines.append("__stop_all")
        script = os.path.join(tmp, "specs.sh")
        with open(script, "w") as f:
            f.write("\n".join(lines) + "\n")
        env = {"PATH": bin_dir + os.pathsep + "/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": os.path.join(tmp, "home"), "DOCS_TMP": tmp, "LANG": "C.UTF-8"}
        print("==== the docs' whole specs (%d)" % len(specs), flush=True)
        run = subprocess.run(UNSHARE + ["bash", script], cwd=ROOT, env=env,
                             timeout=900)
        return [] if run.returncode == 0 else ["the docs' specs: exit %d" % run.returncode]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--only", help="one document, relative to the repository root")
    args = parser.parse_args()
    bin_dir = os.path.abspath(args.bin_dir)

    problems, to_run, specs, not_run = [], [], [], 0
    for path in documents():
        relative = os.path.relpath(path, ROOT)
        if args.only and relative != args.only:
            continue
        for language, marker, start, body in blocks_of(path):
            where = "%s:%d" % (relative, start)
            if not language:
                problems.append("%s: a fenced block without a language (sh, yaml, text, ...)" %
                                where)
            elif language == "sh":
                if marker is None:
                    problems.append("%s: an sh block without a '<!-- docs-test: run -->' or "
                                    "'<!-- docs-test: not run: REASON -->' line before it" % where)
                elif marker == "run":
                    to_run.append((path, start, body))
                else:
                    not_run += 1
            elif language == "yaml" and spec_kind(body):
                specs.append((where, spec_kind(body), body))
    if problems:
        sys.exit("FAIL:\n  " + "\n  ".join(problems))

    probe = subprocess.run(UNSHARE + ["true"], capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit("FAIL: cannot make network and PID namespaces (%s: %s): run as root, as CI "
                 "does" % (" ".join(UNSHARE), probe.stderr.strip()))
    failed = []
    for path, start, body in to_run:
        failure = run_block(path, start, body, bin_dir)
        if failure:
            failed.append(failure)
    if specs:
        failed += run_specs(specs, bin_dir)
    if failed:
        sys.exit("FAIL: " + "; ".join(failed))
    print("docs test: %d command blocks run, %d whole specs submitted, %d blocks not run "
          "(each says why)" % (len(to_run), len(specs), not_run))


if __name__ == "__main__":
    main()
