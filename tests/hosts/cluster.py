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

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import hosts

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


# PostgreSQL refuses to run as root: as Debian's `postgres` user (setpriv execs, so a Popen's pid
# is the server's own).
AS_POSTGRES = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]


class HostCluster:
    def __init__(self, bed, bin_dir, workers, coordinator="coord", s3="s3", slots=2,
                 bucket="ckpt", agent_flags=(), coordinators=None, database=None,
                 coordinator_flags=()):
        """`coordinators` (hosts), with `database` (the host of a PostgreSQL server this cluster
        starts): several coordinators sharing that store, one leading, the others standing by;
        clients and agents are given every coordinator's address. Otherwise one coordinator on
        `coordinator`, with SQLite."""
        self.bed = bed
        self.bin = os.path.abspath(bin_dir)
        self.workers = list(workers)
        self.coordinators = list(coordinators or [coordinator])
        if len(self.coordinators) > 1 and not database:
            raise ClusterError("several coordinators need a database host")
        # The host the CLI runs on (a test's admin), the first coordinator's.
        coordinator = self.coordinators[0]
        self.coordinator = coordinator
        self.database = database
        self.coordinator_flags = list(coordinator_flags)
        self.db_dir = None
        self.s3 = s3
        self.slots = slots
        self.bucket = bucket
        self.dir = tempfile.mkdtemp(prefix="trainyard-hosts-cluster-")
        self.procs = {}  # name -> Popen
        self.started_at = {}  # host -> when its agent was last started (time.time())
        self.agent_flags = list(agent_flags)
        self.extra_env = {}  # more of every process's environment (a test's SLURM_CONF)
        # Holds (the trainer's TRAINYARD_TEST_HOLD_DIR): a job waits at a known step for a test.
        self.hold_dir = self.path("holds")
        os.makedirs(self.hold_dir)
        self.address = ",".join("%s:7070" % bed.address(c) for c in self.coordinators)
        self.s3_endpoint = "http://%s:9000" % bed.address(s3) if s3 else ""

    # ---- start and stop ----

    def start(self):
        self._certificates()
        if self.s3:
            self._start_s3()
        if self.database:
            self._start_database()
        for c in self.coordinators:
            self.start_coordinator(c)
        token = self.path("coordinator", "admin.token")
        self.until(lambda: os.path.exists(token) and self.cli(["workers"], check=False)[0] == 0,
                    60, "no coordinator came up")
        for w in self.workers:
            self.start_worker(w)
        self.wait_workers(len(self.workers))

    def _certificates(self):
        d = self.path("tls")
        os.makedirs(d)
        ips = ",".join("IP:" + self.bed.address(c) for c in self.coordinators)

        def ssl(*args):
            subprocess.run(["openssl"] + list(args), cwd=d, check=True, capture_output=True)

        ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=trainyard-ca", "-keyout", "ca.key", "-out", "ca.crt")
        ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + COORDINATOR_NAME,
            "-keyout", "tls.key", "-out", "tls.csr")
        with open(os.path.join(d, "tls.ext"), "w") as f:
            f.write("subjectAltName=DNS:%s,%s\n" % (COORDINATOR_NAME, ips))
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

        self.until(listening, 30, "s3rver did not start")

    def _start_database(self):
        """Debian's PostgreSQL on the database host, as its `postgres` user (it refuses root),
        trusting the bed's addresses; the database `trainyard`, owned by the user `trainyard`."""
        versions = sorted(os.listdir("/usr/lib/postgresql"), key=lambda v: int(v))
        if not versions:
            raise ClusterError("PostgreSQL is not installed (scripts/install-deps.sh)")
        pg = "/usr/lib/postgresql/%s/bin/" % versions[-1]
        self.db_dir = tempfile.mkdtemp(prefix="trainyard-hosts-db-")
        shutil.chown(self.db_dir, "postgres", "postgres")
        data = os.path.join(self.db_dir, "data")

        def as_postgres(args, **kwargs):
            return self.bed.run(self.database, AS_POSTGRES + args, capture_output=True,
                                text=True, **kwargs)
        done = as_postgres([pg + "initdb", "-D", data, "-A", "trust", "-U", "trainyard",
                            "-E", "UTF8", "--no-sync", "--no-instructions"])
        if done.returncode != 0:
            raise ClusterError("initdb failed: %s%s" % (done.stdout, done.stderr))
        subnet = self.bed.address(self.database).rsplit(".", 1)[0] + ".0/24"
        with open(os.path.join(data, "pg_hba.conf"), "a") as f:
            f.write("host all all %s trust\n" % subnet)
        log = open(self.path("postgres.log"), "w")
        self.procs["postgres"] = self.bed.popen(
            self.database, AS_POSTGRES + [pg + "postgres", "-D", data,
                            "-p", "5432", "-k", self.db_dir, "-c", "listen_addresses=" +
                            self.bed.address(self.database), "-c", "fsync=off", "-c",
                            "logging_collector=off"], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        host = self.bed.address(self.database)
        self.until(lambda: as_postgres([pg + "pg_isready", "-h", host, "-p", "5432"])
                    .returncode == 0, 60, "PostgreSQL did not start")
        done = as_postgres([pg + "createdb", "-h", host, "-p", "5432", "-U", "trainyard",
                            "trainyard"])
        if done.returncode != 0:
            raise ClusterError("createdb failed: %s%s" % (done.stdout, done.stderr))
        self.store = "postgres://trainyard@%s:5432/trainyard" % host

    def _coordinator_name(self, host):
        """The name of a coordinator's log, state folder and process: "coordinator", with its
        host's name after a dash where there are several."""
        return "coordinator-" + host if len(self.coordinators) > 1 else "coordinator"

    def coordinator_log(self, host):
        return self.path(self._coordinator_name(host) + ".log")

    def start_coordinator(self, host=None):
        """Starts (or starts again) the coordinator of `host` (the only one by default)."""
        host = host or self.coordinators[0]
        name = self._coordinator_name(host)
        state = self.path(name)
        os.makedirs(state, exist_ok=True)
        checkpoints = ("s3://%s/runs" % self.bucket) if self.s3 else "file://" + self.path("ckpt")
        old = self.procs.get(name)
        if old is not None and old.poll() is None:
            raise ClusterError("the coordinator of %s still runs" % host)
        if old is not None:
            old.wait()
        args = [self.program("trainyard-coordinator"),
                "--listen=%s:7070" % self.bed.address(host),
                "--state_dir=" + state, "--tls_cert=" + self.path("tls", "tls.crt"),
                "--tls_key=" + self.path("tls", "tls.key"), "--checkpoint_root=" + checkpoints,
                "--metrics_listen=%s:7071" % self.bed.address(host)]
        if self.database:
            # One admin token for all, made by the first to lead, where the CLI reads it.
            os.makedirs(self.path("coordinator"), exist_ok=True)
            args += ["--store=" + self.store,
                     "--admin_token_file=" + self.path("coordinator", "admin.token")]
        log = open(self.coordinator_log(host), "a")
        self.procs[name] = self.bed.popen(host, args + self.coordinator_flags, stdout=log,
                                          stderr=subprocess.STDOUT, env=self.env())
        log.close()

    def coordinator_proc(self, host):
        return self.procs[self._coordinator_name(host)]

    def leader(self):
        """The coordinator host that leads now, by its log ("leading (lease token N)", the
        highest N of those still running), or None."""
        best, best_token = None, -1
        for host in self.coordinators:
            if self.coordinator_proc(host).poll() is not None:
                continue
            with open(self.coordinator_log(host), errors="replace") as f:
                for line in f:
                    if "leading (lease token " in line:
                        token = int(line.split("leading (lease token ")[1].split(")")[0])
                        if token > best_token:
                            best, best_token = host, token
        return best

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
            if p.poll() is None and name != "postgres":
                p.send_signal(signal.SIGINT if name != "s3" else signal.SIGTERM)
        # PostgreSQL last, once the coordinators are gone (SIGINT: its fast shutdown).
        for name, p in sorted(self.procs.items(), key=lambda item: item[0] == "postgres"):
            if name == "postgres" and p.poll() is None:
                p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.db_dir:
            shutil.rmtree(self.db_dir, ignore_errors=True)

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
        env.update(self.extra_env)
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
        self.until(lambda: self.cli(["workers"], check=False)[1].count("READY") >= n, 60,
                    "%d workers were not READY" % n)

    def wait_worker_started(self, host, timeout=60):
        """Until the agent last started on `host` has registered and is READY: not an earlier
        agent of the host that registered again before it was killed."""
        since_ms = int(self.started_at[host] * 1000)

        def registered():
            workers = json.loads(self.cli(["workers", "-o", "json"])[1]).get("workers", [])
            return any(w.get("id") == host and w.get("state") == "READY" and
                       int(w.get("registeredUnixMs", 0)) >= since_ms for w in workers)
        self.until(registered, timeout, "the agent started on %s did not register" % host)

    def wait_idle(self, timeout=60):
        """Until every worker runs nothing (cancelled jobs' trainers gone)."""
        def idle():
            workers = json.loads(self.cli(["workers", "-o", "json"])[1]).get("workers", [])
            return all(int(w.get("slotsUsed", 0)) == 0 for w in workers)
        self.until(idle, timeout, "the workers did not come free")

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
    def until(predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise ClusterError(what + " within %d s" % timeout)
            time.sleep(0.1)


class ClusterTestCase(unittest.TestCase):
    """Tests over one HostCluster on a bed of its own: a subclass's setUpClass calls
    start_cluster; the cluster and the bed go at the end; a test that fails shows the logs."""

    bed = None
    cluster = None

    @classmethod
    def check_machine(cls):
        """Fails (never skips) where the tests cannot run."""
        if os.geteuid() != 0:
            raise RuntimeError("FAIL: hosts need root (network namespaces), as CI has")
        if not s3rver_binary():
            raise RuntimeError("FAIL: s3rver is not installed (scripts/install-deps.sh)")

    @classmethod
    def start_cluster(cls, bed_hosts, bin_dir, workers, **options):
        cls.check_machine()
        cls.bed = hosts.Bed.up(bed_hosts)
        cls.bed.remove_on_exit()
        cls.cluster = HostCluster(cls.bed, bin_dir, workers, **options)
        try:
            cls.cluster.start()
        except Exception:
            cls.dump()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.cluster is not None:
            cls.cluster.stop()
        if cls.bed is not None:
            cls.bed.down()
        if cls.cluster is not None:
            cls.cluster.cleanup()

    @classmethod
    def dump(cls):
        for f in sorted(os.listdir(cls.cluster.dir)):
            if f.endswith(".log"):
                with open(cls.cluster.path(f), errors="replace") as log:
                    print("==== %s\n%s" % (f, log.read()[-4000:]))

    def tearDown(self):
        outcome = getattr(self, "_outcome", None)
        result = getattr(outcome, "result", None)
        if result is not None and any(test is self for test, _ in result.failures + result.errors):
            self.dump()


def test_args():
    """The hosts tests' command line: the absolute --bin-dir, and the arguments for unittest."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    args, rest = parser.parse_known_args()
    return os.path.abspath(args.bin_dir), [sys.argv[0]] + rest
