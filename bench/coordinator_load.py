"""The coordinator under load: durable submissions from 8 clients as the queue grows to 10,000,
its idle cost with 10,000 queued, the idle cost of 1,000 simulated agents holding their leases
(each on a connection of its own), and 1,000 simulated agents with jobs flowing through them.

    python3 bench/coordinator_load.py BUILD_DIR [JOBS] [AGENTS] [SECONDS] [PHASES]

PHASES: a comma-separated choice of submit, idle-agents, agents (default: all three). For
idle-agents, LEASE_FLAGS adds coordinator flags, SYNC_WAIT sets the agents' long poll and
BEAT=1 has them beat all along (as agents that run tasks do).

Each phase starts a fresh coordinator (real binary, its own state folder on this disk, metrics
off) and drives it with coordinator_load (cmake --build BUILD_DIR --target coordinator_load).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class Coordinator:
    def __init__(self, build, *flags):
        self.build = build
        self.flags = list(flags)

    def __enter__(self):
        self.state = tempfile.mkdtemp(prefix="coordinator_load.")
        port_file = os.path.join(self.state, "port")
        self.log = open(os.path.join(self.state, "coordinator.log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(self.build, "bin", "trainyard-coordinator"), "--listen=127.0.0.1:0",
             f"--port_file={port_file}", f"--state_dir={self.state}", "--metrics_listen=",
             *self.flags], stdout=self.log, stderr=self.log)
        deadline = time.time() + 30
        while not os.path.exists(port_file):
            if time.time() > deadline or self.proc.poll() is not None:
                sys.exit("the coordinator did not start: see " + self.log.name)
            time.sleep(0.05)
        with open(port_file) as f:
            self.address = "127.0.0.1:" + f.read().strip()
        self.token_flag = "--token_file=" + os.path.join(self.state, "admin.token")
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.state, ignore_errors=True)


def load(build, *args):
    out = subprocess.run([os.path.join(build, "bin", "coordinator_load"), *args],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
    return out.stdout


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else 10000
    agents = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    seconds = int(sys.argv[4]) if len(sys.argv) > 4 else 60
    phases = set((sys.argv[5] if len(sys.argv) > 5 else "submit,idle-agents,agents").split(","))
    if not phases <= {"submit", "idle-agents", "agents"}:
        sys.exit("PHASES: a comma-separated choice of submit, idle-agents, agents")
    if not os.access(os.path.join(build, "bin", "coordinator_load"), os.X_OK):
        sys.exit(f"build it first: cmake --build {build} --target coordinator_load")

    if "submit" in phases:
        submit_phase(build, jobs)
    if "idle-agents" in phases:
        idle_agents_phase(build, agents, seconds)
    if "agents" in phases:
        agents_phase(build, jobs, agents, seconds)


def submit_phase(build, jobs):
    print(f"## Durable submissions, 8 clients, no workers, queue growing to {jobs}")
    with Coordinator(build) as c:
        print(load(build, "submit", f"--coordinator={c.address}", c.token_flag, "--threads=8",
                   f"--jobs={jobs}", "--window=1000"), end="")
        # Idle: everything queued, nothing changing.
        time.sleep(2)
        before = cpu_seconds(c.proc.pid)
        time.sleep(30)
        idle = (cpu_seconds(c.proc.pid) - before) / 30
        with open(f"/proc/{c.proc.pid}/status") as f:
            rss = next(line.split()[1] for line in f if line.startswith("VmRSS"))
        print(f"idle with {jobs} queued: {idle * 100:.2f} % of a core, resident {int(rss) // 1024} MiB")



def idle_agents_phase(build, agents, seconds):
    # LEASE_FLAGS: extra coordinator flags; SYNC_WAIT: the agents' long poll (60s, the agent's);
    # BEAT=1: the agents beat all along, as busy ones do.
    flags = os.environ.get("LEASE_FLAGS", "").split()
    sync_wait = os.environ.get("SYNC_WAIT", "60s")
    beat = ["--beat"] if os.environ.get("BEAT") == "1" else []
    print(f"\n## {agents} {'beating' if beat else 'idle'} agents, each on its own connection "
          f"with a lease stream and a {sync_wait} Sync long poll (the real agent's channel), no "
          f"jobs; coordinator flags: {' '.join(flags) or 'the defaults'}")
    with Coordinator(build, *flags) as c:
        out = subprocess.Popen([os.path.join(build, "bin", "coordinator_load"), "agents",
                                f"--coordinator={c.address}", c.token_flag, f"--agents={agents}",
                                f"--seconds={seconds + 25}", "--rate=0", "--connections=0",
                                f"--sync_wait={sync_wait}", *beat],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(20)  # every agent registered and holding its lease
        before = cpu_seconds(c.proc.pid)
        time.sleep(seconds)
        idle = (cpu_seconds(c.proc.pid) - before) / seconds
        stdout, stderr = out.communicate()
        sys.stderr.write(stderr)
        print(stdout, end="")
        print(f"coordinator CPU, idle: {idle * 100:.2f} % of a core")


def agents_phase(build, jobs, agents, seconds):
    print(f"\n## {agents} simulated agents (1 slot each, Sync long poll 1 s, as agents polled "
          f"before lease streams), jobs at 20/s, {jobs} unplaceable jobs queued")
    with Coordinator(build) as c:
        load(build, "submit", f"--coordinator={c.address}", c.token_flag, "--threads=8", f"--jobs={jobs}",
             "--window=100000", "--spec=gpu")
        before = cpu_seconds(c.proc.pid)
        print(load(build, "agents", f"--coordinator={c.address}", c.token_flag, f"--agents={agents}",
                   f"--seconds={seconds}", "--rate=20", "--sync_wait=1s", "--lease=false"),
              end="")
        print(f"coordinator CPU: {(cpu_seconds(c.proc.pid) - before) / seconds * 100:.0f} % of a "
              f"core")


if __name__ == "__main__":
    main()
