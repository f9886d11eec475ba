"""A Trainyard cluster on a bed of hosts (hosts.py), set up as the operations guide tells an
operator: a CA and the coordinator's certificate made with openssl, the coordinator serving TLS
on its host's address, one agent token per worker made with `trainyard token create NAME --role
agent`, each agent on its own host with `--ca_file`, `--token_file` and
`--tls_server_name=trainyard-coordinator` (its address it finds itself), and s3rver on a host of
its own for checkpoints. No `--insecure` anywhere.

  cluster = HostCluster(bed, bin_dir, workers=["w1", "w2", "w3"])
  cluster.start()
  job = cluster.submit(spec_text)
  cluster.wait(job, lambda j: j["state"] == "SUCCEEDED")
  cluster.stop()
"""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COORDINATOR_NAME = "trainyard-coordinator"
S3_KEYS = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER",
           "AWS_REGION": "us-east-1"}


class ClusterError(Exception):
    pass


def s3rver_binary():
    tools = os.environ.get("TRAINYARD_TOOLS_DIR", os.path.join(ROOT, ".tools"))
    path = os.path.join(tools, "node_modules", ".bin", "s3rver")
    return path if os.access(path, os.X_OK) else ""


class HostCluster:
    def __init__(self, bed, bin_dir, workers, coordinator="coord", s3="s3", slots=2,
                 bucket="ckpt", agent_flags=()):
        self.bed = bed
        self.bin = os.path.abspath(bin_dir)
        self.workers = list(workers)
        self.coordinator = coordinator
        self.s3 = s3
        self.slots = slots
        self.bucket = bucket
        self.dir = tempfile.mkdtemp(prefix="trainyard-hosts-cluster-")
        self.procs = {}  # name -> Popen
        self.started_at = {}  # host -> when its agent was last started (time.time())
        self.agent_flags = list(agent_flags)
        # Holds (the trainer's TRAINYARD_TEST_HOLD_DIR): a job waits at a known step for a test.
        self.hold_dir = self.path("holds")
        os.makedirs(self.hold_dir)
        self.address = "%s:7070" % bed.address(coordinator)
        self.s3_endpoint = "http://%s:9000" % bed.address(s3) if s3 else ""

    # ---- start and stop ----

    def start(self):
        self._certificates()
        if self.s3:
            self._start_s3()
        self._start_coordinator()
        for w in self.workers:
            self.start_worker(w)
        self.wait_workers(len(self.workers))

    def _certificates(self):
        d = self.path("tls")
        os.makedirs(d)
        ip = self.bed.address(self.coordinator)

        def ssl(*args):
            subprocess.run(["openssl"] + list(args), cwd=d, check=True, capture_output=True)

        ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=trainyard-ca", "-keyout", "ca.key", "-out", "ca.crt")
        ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + COORDINATOR_NAME,
            "-keyout", "tls.key", "-out", "tls.csr")
        with open(os.path.join(d, "tls.ext"), "w") as f:
            f.write("subjectAltName=DNS:%s,IP:%s\n" % (COORDINATOR_NAME, ip))
        ssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "tls.ext", "-out", "tls.crt")

    def _start_s3(self):
        binary = s3rver_binary()
        if not binary:
            raise ClusterError("s3rver is not installed (scripts/install-deps.sh installs it)")
        data = self.path("s3-data")
        os.makedirs(data)
        log = open(self.path("s3rver.log"), "w")
        env = dict(os.environ, NODE_OPTIONS="--openssl-legacy-provider")
        self.procs["s3"] = self.bed.popen(
            self.s3, [binary, "-d", data, "-a", self.bed.address(self.s3), "-p", "9000",
                      "--configure-bucket", self.bucket], stdout=log, stderr=subprocess.STDOUT,
            env=env)
        log.close()
        def listening():
            with open(self.path("s3rver.log")) as f:
                return "listening on" in f.read()

        self._until(listening, 30, "s3rver did not start")

    def _start_coordinator(self):
        state = self.path("coordinator")
        os.makedirs(state)
        checkpoints = ("s3://%s/runs" % self.bucket) if self.s3 else "file://" + self.path("ckpt")
        log = open(self.path("coordinator.log"), "w")
        self.procs["coordinator"] = self.bed.popen(
            self.coordinator,
            [self.program("trainyard-coordinator"), "--listen=" + self.address,
             "--state_dir=" + state, "--tls_cert=" + self.path("tls", "tls.crt"),
             "--tls_key=" + self.path("tls", "tls.key"), "--checkpoint_root=" + checkpoints,
             "--metrics_listen=%s:7071" % self.bed.address(self.coordinator)],
            stdout=log, stderr=subprocess.STDOUT, env=self.env())
        log.close()
        token = os.path.join(state, "admin.token")
        self._until(lambda: os.path.exists(token) and self.cli(["workers"], check=False)[0] == 0,
                    60, "the coordinator did not come up")

    def start_worker(self, host):
        """Starts (or restarts) the agent of `host`, with its token made by the admin."""
        token = self.path("tokens", host)
        if not os.path.exists(token):
            os.makedirs(self.path("tokens"), exist_ok=True)
            _, secret, _ = self.cli(["token", "create", host, "--role", "agent"])
            with open(token, "w") as f:
                f.write(secret.strip() + "\n")
            os.chmod(token, 0o600)
        work = self.path("work", host)
        os.makedirs(work, exist_ok=True)
        old = self.procs.get(host)
        if old is not None and old.poll() is None:
            raise ClusterError("the agent of %s still runs" % host)
        if old is not None:
            old.wait()
        log = open(self.path("%s.log" % host), "a")
        self.started_at[host] = time.time()
        self.procs[host] = self.bed.popen(
            host,
            # No --address: the agent finds its host's address on the way to the coordinator.
            [self.program("trainyard-worker"), "--coordinator=" + self.address, "--name=" + host,
             "--slots=%d" % self.slots, "--gpus=0",
             "--work_dir=" + work, "--ca_file=" + self.path("tls", "ca.crt"),
             "--token_file=" + token, "--tls_server_name=" + COORDINATOR_NAME,
             "--metrics_listen=%s:7072" % self.bed.address(host),
             "--trainer_path=" + self.program("trainyard-trainer")] + self.agent_flags,
            stdout=log, stderr=subprocess.STDOUT, env=dict(self.env(),
                                                          TRAINYARD_TEST_HOLD_DIR=self.hold_dir))
        log.close()

    def hold(self, job_name, updates):
        """Every attempt of the job named `job_name` waits after `updates` updates from where it
        started, until release()."""
        path = os.path.join(self.hold_dir, job_name)
        with open(path + ".new", "w") as f:
            f.write("%d\n" % updates)
        os.rename(path + ".new", path)

    def release(self, job_name):
        try:
            os.unlink(os.path.join(self.hold_dir, job_name))
        except FileNotFoundError:
            pass

    def stop(self):
        for name, p in list(self.procs.items()):
            if p.poll() is None:
                p.send_signal(signal.SIGINT if name != "s3" else signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- using ----

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def program(self, name):
        return os.path.join(self.bin, name)

    def env(self):
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": self.dir, "LANG": "C.UTF-8"}
        if self.s3:
            env.update(S3_KEYS)
            env["AWS_ENDPOINT_URL"] = self.s3_endpoint
        return env

    def cli(self, args, check=True, host=None):
        """`trainyard ARGS` as the admin, from the coordinator's host (or `host`), over TLS:
        (exit code, stdout, stderr)."""
        command = [self.program("trainyard"), "--coordinator", self.address, "--ca",
                   self.path("tls", "ca.crt"), "--tls-server-name", COORDINATOR_NAME,
                   "--token-file", self.path("coordinator", "admin.token")] + list(args)
        done = self.bed.run(host or self.coordinator, command, capture_output=True, text=True,
                            env=self.env(), timeout=600)
        if check and done.returncode != 0:
            raise ClusterError("trainyard %s: exit %d\n%s%s" % (" ".join(args), done.returncode,
                                                                done.stdout, done.stderr))
        return done.returncode, done.stdout, done.stderr

    def submit(self, spec_text):
        path = self.path("spec-%d.yaml" % time.monotonic_ns())
        with open(path, "w") as f:
            f.write(spec_text)
        return self.cli(["submit", path])[1].splitlines()[0].strip()

    def job(self, job_id):
        return json.loads(self.cli(["describe", job_id, "-o", "json"])[1])

    def wait(self, job_id, condition, timeout=300, what="the condition"):
        """Polls the job until `condition(job)`; fails at its end if it never holds."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if condition(job):
                return job
            if job.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED") or \
                    time.monotonic() > deadline:
                raise ClusterError("job %s: %s did not hold (state %s: %s)\n%s" % (
                    job_id, what, job.get("state"), job.get("reason"),
                    "".join(self.cli(["describe", job_id], check=False)[1:])))
            time.sleep(0.2)

    def wait_workers(self, n):
        self._until(lambda: self.cli(["workers"], check=False)[1].count("READY") >= n, 60,
                    "%d workers were not READY" % n)

    def wait_worker_started(self, host, timeout=60):
        """Until the agent last started on `host` has registered and is READY: not an earlier
        agent of the host that registered again before it was killed."""
        since_ms = int(self.started_at[host] * 1000)

        def registered():
            workers = json.loads(self.cli(["workers", "-o", "json"])[1]).get("workers", [])
            return any(w.get("id") == host and w.get("state") == "READY" and
                       int(w.get("registeredUnixMs", 0)) >= since_ms for w in workers)
        self._until(registered, timeout, "the agent started on %s did not register" % host)

    def wait_idle(self, timeout=60):
        """Until every worker runs nothing (cancelled jobs' trainers gone)."""
        def idle():
            workers = json.loads(self.cli(["workers", "-o", "json"])[1]).get("workers", [])
            return all(int(w.get("slotsUsed", 0)) == 0 for w in workers)
        self._until(idle, timeout, "the workers did not come free")

    def worker_of(self, job, rank=0):
        for t in job.get("tasks", []):
            if t.get("rank", 0) == rank and t.get("generation") == job.get("generation") and \
                    not t.get("taskId", "").split(".")[-1].startswith("s"):
                return t.get("workerId")
        return None

    def _s3(self, body, *args):
        """Runs `body` (Python, with `c` a botocore S3 client of s3rver) on the coordinator's
        host with `args` after the endpoint: its stdout, as bytes."""
        code = ("import sys, botocore.session as s\n"
                "c = s.get_session().create_client('s3', endpoint_url=sys.argv[1], "
                "region_name='us-east-1', aws_access_key_id='S3RVER', "
                "aws_secret_access_key='S3RVER')\n" + body)
        done = self.bed.run(self.coordinator, ["/usr/bin/python3", "-c", code, self.s3_endpoint] +
                            list(args), capture_output=True)
        if done.returncode != 0:
            raise ClusterError("s3 %s: %s" % (" ".join(args), done.stderr.decode(errors="replace")))
        return done.stdout

    def s3_get(self, key):
        """An object of the checkpoint bucket, read with botocore from the coordinator's host."""
        return self._s3("sys.stdout.buffer.write(c.get_object(Bucket=sys.argv[2], "
                        "Key=sys.argv[3])['Body'].read())\n", self.bucket, key)

    def s3_list(self, prefix):
        """The keys of the checkpoint bucket under `prefix`, listed with botocore."""
        return self._s3("for page in c.get_paginator('list_objects_v2').paginate("
                        "Bucket=sys.argv[2], Prefix=sys.argv[3]):\n"
                        "    for o in page.get('Contents', []): print(o['Key'])\n",
                        self.bucket, prefix).decode().split()

    def last_step(self, host, task_id):
        """The last update a trainer completed, from its own file on its host's disk (readable
        when the coordinator is not); -1 without one."""
        try:
            with open(self.path("work", host, "tasks", task_id, "last-step")) as f:
                return int(f.read().strip() or -1)
        except (FileNotFoundError, ValueError):
            return -1

    @staticmethod
    def _until(predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise ClusterError(what + " within %d s" % timeout)
            time.sleep(0.1)
