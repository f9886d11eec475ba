#!/usr/bin/python3
"""Every example in examples/ as a user runs it: on a fresh local cluster (`trainyard up
--workers 2 --slots 2`), each command an example spec's header tells the user to run (the lines
`#   $ COMMAND`, run from the repository root, in file order, each command once) is run as written,
and must succeed: the data writers, then `trainyard submit ... --wait` and `trainyard search submit
... --wait`, whose exit code is the job's or search's outcome. Every spec must be run by one of
these commands (named in it, or in a script it runs), so an example cannot be left without one.

Specs that share a command (a data writer) form one chain, run in file order; independent chains
run two at a time (this machine has two cores), the longest first by their specs' max_steps.

A command that exits with 77 says this machine lacks what its example needs (the GPT example
needs PyTorch 2, which Debian 12 lacks): the rest of its chain is skipped, and the summary names it.

The examples write under /tmp/trainyard-examples and /tmp/trainyard-distill, as their headers say;
the test removes those first (under a lock, so two runs do not share them).

  tests/examples/examples_test.py --bin-dir build/bin
"""

import argparse
import fcntl
import glob
import os
import shutil
import socket
import subprocess
import sys
import re
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE_DIRS = ["/tmp/trainyard-examples", "/tmp/trainyard-distill"]
COMMAND_PREFIX = "#   $ "
SKIPPED = 77  # the exit code of a command whose example this machine cannot run


def example_specs():
    return sorted(glob.glob(os.path.join(ROOT, "examples", "**", "*.yaml"), recursive=True))


def commands_of(spec):
    """The commands a spec's header comment tells the user to run, in order."""
    out = []
    with open(spec) as f:
        for line in f:
            if not line.startswith("#"):
                break
            if line.startswith(COMMAND_PREFIX):
                out.append(line[len(COMMAND_PREFIX):].strip())
    return out


def runs_spec(command, spec):
    """Whether `command` submits `spec`: it names it, or runs a script of the repository that
    names it."""
    relative = os.path.relpath(spec, ROOT)
    if relative in command:
        return True
    program = command.split()[0]
    script = os.path.join(ROOT, program)
    if os.path.isfile(script) and not program.startswith("/"):
        with open(script, errors="replace") as f:
            return os.path.basename(spec) in f.read()
    return False


def length_of(spec):
    """A spec's length in steps (max_steps, or a search's max_length): orders the chains."""
    with open(spec) as f:
        m = re.search(r"^\s*(?:max_steps|max_length):\s*(\d+)", f.read(), re.M)
    return int(m.group(1)) if m else 0


def chains_of(specs):
    """The specs' commands in chains: specs that share a command are one chain (their commands
    in file order, each once); chains are independent of each other. Longest first."""
    groups = []  # [specs, commands]
    for spec in specs:
        commands = commands_of(spec)
        joined = [g for g in groups if set(g[1]) & set(commands)]
        merged = [[], []]
        for g in joined:
            groups.remove(g)
            merged[0] += g[0]
            merged[1] += g[1]
        merged[0].append(spec)
        merged[1] += [c for c in commands if c not in merged[1]]
        groups.append(merged)
    groups.sort(key=lambda g: -max(length_of(s) for s in g[0]))
    return [[(c, next(s for s in g[0] if c in commands_of(s))) for c in g[1]] for g in groups]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", required=True)
    args = parser.parse_args()
    bin_dir = os.path.abspath(args.bin_dir)
    trainyard = os.path.join(bin_dir, "trainyard")

    specs = example_specs()
    uncovered = [os.path.relpath(spec, ROOT) for spec in specs
                 if not any(runs_spec(c, spec) for c in commands_of(spec))]
    if uncovered:
        sys.exit("FAIL: no '%s' line of these specs runs them: %s" % (COMMAND_PREFIX.strip(),
                                                                     ", ".join(uncovered)))
    chains = chains_of(specs)
    count = sum(len(c) for c in chains)

    lock = open("/tmp/trainyard-examples.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    for d in EXAMPLE_DIRS:
        shutil.rmtree(d, ignore_errors=True)

    work = tempfile.mkdtemp(prefix="trainyard-examples-test-")
    port = free_port()
    env = dict(os.environ)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["TRAINYARD_COORDINATOR"] = "127.0.0.1:%d" % port
    log = open(os.path.join(work, "cluster.log"), "w")
    cluster = subprocess.Popen([trainyard, "up", "--workers", "2", "--slots", "2", "--port",
                                str(port), "--state-dir", os.path.join(work, "state")],
                               stdout=log, stderr=subprocess.STDOUT, env=env)
    failed = []
    skipped = []
    try:
        deadline = time.time() + 120
        while True:
            workers = subprocess.run([trainyard, "workers"], env=env, capture_output=True,
                                     text=True)
            if workers.returncode == 0 and workers.stdout.count("READY") == 2:
                break
            if cluster.poll() is not None or time.time() > deadline:
                log.flush()
                with open(os.path.join(work, "cluster.log")) as f:
                    sys.exit("FAIL: the local cluster did not come up:\n" + f.read())
            time.sleep(0.2)

        printing = threading.Lock()

        def run_chain(chain):
            for command, spec in chain:
                start = time.time()
                run = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env,
                                     capture_output=True, text=True, timeout=900)
                took = time.time() - start
                with printing:
                    print("==> %s   (%s)" % (command, os.path.relpath(spec, ROOT)), flush=True)
                    if run.returncode == SKIPPED:
                        reason = (run.stderr.strip().splitlines() or [""])[-1]
                        skipped.append("%s (%s)" % (command, reason))
                        print("SKIPPED: %s" % reason, flush=True)
                        return
                    if run.returncode != 0:
                        failed.append(command)
                        print("FAIL (exit %d after %.0f s)\n%s%s" % (
                            run.returncode, took, run.stdout, run.stderr), flush=True)
                        return  # the rest of the chain needs what this one made
                    tail = run.stdout.strip().splitlines()[-1:] or [""]
                    print("    ok in %.1f s: %s" % (took, tail[0]), flush=True)

        queue = list(chains)

        def lane():
            while True:
                with printing:
                    if not queue:
                        return
                    chain = queue.pop(0)
                run_chain(chain)

        lanes = [threading.Thread(target=lane) for _ in range(2)]
        for t in lanes:
            t.start()
        for t in lanes:
            t.join()
    finally:
        cluster.terminate()
        try:
            cluster.wait(timeout=60)
        except subprocess.TimeoutExpired:
            cluster.kill()
        shutil.rmtree(work, ignore_errors=True)
    if failed:
        sys.exit("FAIL: %d of %d commands failed: %s" % (len(failed), count, "; ".join(failed)))
    print("%d commands of %d example specs succeeded" % (count - len(skipped), len(specs)))
    if skipped:
        print("skipped on this machine: %s" % "; ".join(skipped))


if __name__ == "__main__":
    main()
