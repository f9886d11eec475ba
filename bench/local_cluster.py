"""A local Trainyard cluster for the benchmarks: `trainyard up` in a temporary state folder, jobs
submitted and waited for through the CLI, their logs read back.

    with LocalCluster(build, workers=2, slots=4, prefix="ps_sparse.") as cluster:
        job_id = cluster.run_job("name", yaml_text)    # exits the script if the job fails
        log = cluster.logs(job_id, "--rank", "0")
"""
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median_samples_per_second(log, skip=2):
    """The median of a rank's progress lines' samples_per_s, less the first `skip` windows."""
    rates = [float(r) for r in re.findall(r"samples_per_s=([0-9.]+)", log)][skip:]
    return statistics.median(rates) if rates else float("nan")


def timed_samples_per_second(step, batch, steps, warmup):
    """The rate of the peer's loop: step(i) trains on batch i; `warmup` steps untimed, then
    `steps` timed."""
    for i in range(warmup):
        step(i)
    began = time.perf_counter()
    for i in range(steps):
        step(warmup + i)
    return batch * steps / (time.perf_counter() - began)


def pack_random_text(build, work, tokens):
    """Byte-token shards of `tokens` random printable bytes at WORK/text-*.safetensors (through
    `trainyard data pack --text`); returns their glob."""
    import numpy as np
    rng = np.random.default_rng(0)
    with open(f"{work}/text.txt", "wb") as f:
        f.write(rng.integers(32, 127, size=tokens, dtype=np.uint8).tobytes())
    subprocess.run([f"{build}/bin/trainyard", "data", "pack", "--text", f"{work}/text.txt",
                    f"{work}/text"], check=True, capture_output=True)
    return f"{work}/text-*.safetensors"


class LocalCluster:
    def __init__(self, build, workers, slots, prefix):
        self.cli = os.path.join(build, "bin", "trainyard")
        if not os.access(self.cli, os.X_OK):
            sys.exit(f"build it first: cmake --build {build}")
        self.build = build
        self.workers = workers
        self.slots = slots
        self.state = tempfile.mkdtemp(prefix=prefix)
        self.port = free_port()
        self.coordinator = ["--coordinator", f"127.0.0.1:{self.port}"]
        self.jobs = 0
        self.up = None

    def __enter__(self):
        env = dict(os.environ, PATH=os.path.join(self.build, "bin") + ":" + os.environ["PATH"])
        self.up = subprocess.Popen(
            [self.cli, "up", "--workers", str(self.workers), "--slots", str(self.slots),
             "--port", str(self.port), "--state-dir", self.state],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.time() + 60
        while self.call("workers").returncode != 0:
            if time.time() > deadline:
                self.__exit__(None, None, None)
                sys.exit("the local cluster did not come up")
            time.sleep(0.2)
        return self

    def __exit__(self, *exc):
        self.up.send_signal(signal.SIGINT)
        self.up.wait(timeout=60)

    def call(self, *args):
        return subprocess.run([self.cli, *self.coordinator, *args], capture_output=True,
                              text=True)

    def job_id(self, name):
        """The id the next job submitted under `name` gets."""
        return f"{name}-{self.jobs + 1}"

    def run_job(self, name, spec_yaml):
        """Submits the job, waits for it and returns its id; exits the script if it fails."""
        self.jobs += 1
        spec = os.path.join(self.state, f"{name}.yaml")
        with open(spec, "w") as f:
            f.write(spec_yaml)
        done = self.call("submit", spec, "--wait")
        job_id = f"{name}-{self.jobs}"
        if done.returncode != 0:
            sys.exit(f"{job_id} did not succeed:\n{done.stdout}\n{done.stderr}")
        return job_id

    def logs(self, job_id, *args):
        return self.call("logs", job_id, *args).stdout
