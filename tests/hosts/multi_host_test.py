#!/usr/bin/python3
"""Trainyard across hosts (tests/hosts/hosts.py): the coordinator, s3rver and three worker agents
each on a host of its own, over TLS and tokens as the operations guide sets them up
(tests/hosts/cluster.py).

- A 2-rank data-parallel job and a 2-rank, 2-shard parameter-server job end bit for bit where the
  same jobs end on loopback (`trainyard up` on one machine).
- A worker host killed (every process, SIGKILL: its peers get resets), a worker host cut off (its
  link down: nobody hears anything) and a preemption notice (SIGTERM to an agent): each time the
  job, held at a known step while the fault happens, restarts on the spare host, succeeds, and
  ends bit for bit where the uninterrupted job ended; the preemption loses no step.
- s3rver's host cut off for 10 s mid-run: training goes on, due checkpoints are skipped rather
  than waited for, every committed checkpoint is whole, and the job ends bit for bit.

Needs root (namespaces) and s3rver (scripts/install-deps.sh); fails saying so without them.

  tests/hosts/multi_host_test.py --bin-dir build/bin
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as cluster_lib  # noqa: E402
import hosts  # noqa: E402

BIN_DIR = None
HELD_AFTER = 30  # updates into an attempt at which a faulted job is held


def spec(name, strategy, steps):
    extra = {"data_parallel": "strategy: data_parallel\nworkers: 2\n",
             "parameter_server": "strategy: parameter_server\nworkers: 2\n"
                                 "parameter_servers: 2\n"}[strategy]
    return f"""name: {name}
{extra}model: {{builtin: mlp, args: {{inputs: 16, hidden: [64], classes: 4}}}}
data: {{synthetic: {{samples: 4096, features: 16, classes: 4, noise: 1.0}}, validation_split: 0.1}}
batch_size: 64
optimizer: {{name: sgd, lr: 0.05, momentum: 0.9}}
max_steps: {steps}
seed: 11
checkpoint: {{every_steps: 10, keep_last: 2}}
restart: {{max_failures: 0}}
"""


CASES = {"dp": ("data_parallel", 120), "ps": ("parameter_server", 120)}


def loopback_models(specs):
    """The exported model of each spec run to its end by `trainyard up` on one machine (in a
    network namespace of its own): name -> bytes."""
    work = tempfile.mkdtemp(prefix="trainyard-loopback-")
    try:
        lines = ["set -e", "ip link set lo up",
                 "trainyard up --workers 3 --slots 2 --state-dir %s/state >%s/up.log 2>&1 &" %
                 (work, work),
                 "until [ \"$(trainyard workers 2>/dev/null | grep -c READY)\" = 3 ]; do "
                 "sleep 0.2; done"]
        for name, text in specs.items():
            path = os.path.join(work, name + ".yaml")
            with open(path, "w") as f:
                f.write(text)
            lines.append("id=$(trainyard submit %s --wait | head -1)" % path)
            lines.append("trainyard describe $id -o json > %s/%s.json" % (work, name))
        lines.append("kill %1; wait")
        env = {"PATH": BIN_DIR + ":/usr/sbin:/usr/bin:/sbin:/bin", "HOME": work}
        done = subprocess.run(["unshare", "--net", "--pid", "--fork", "--kill-child",
                               "--mount-proc", "bash", "-c", "\n".join(lines)], env=env,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise AssertionError("the loopback runs failed: %s%s" % (done.stdout, done.stderr))
        models = {}
        for name in specs:
            with open(os.path.join(work, name + ".json")) as f:
                job = json.load(f)
            assert job["state"] == "SUCCEEDED", job
            with open(job["modelUri"][len("file://"):], "rb") as f:
                models[name] = f.read()
        return models
    finally:
        shutil.rmtree(work, ignore_errors=True)


class MultiHostTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise RuntimeError("FAIL: hosts need root (network namespaces), as CI has")
        if not cluster_lib.s3rver_binary():
            raise RuntimeError("FAIL: s3rver is not installed (scripts/install-deps.sh)")
        cls.reference = loopback_models({n: spec(n, *CASES[n]) for n in CASES})
        cls.bed = hosts.Bed.up(["coord", "s3", "w1", "w2", "w3"])
        cls.bed.remove_on_exit()
        cls.cluster = cluster_lib.HostCluster(cls.bed, BIN_DIR, ["w1", "w2", "w3"])
        try:
            cls.cluster.start()
        except Exception:
            cls.dump()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        cls.bed.down()
        cls.cluster.cleanup()

    @classmethod
    def dump(cls):
        for f in sorted(os.listdir(cls.cluster.dir)):
            if f.endswith(".log"):
                with open(cls.cluster.path(f), errors="replace") as log:
                    print("==== %s\n%s" % (f, log.read()[-4000:]))

    def model_of(self, job):
        uri = job["modelUri"]
        self.assertTrue(uri.startswith("s3://ckpt/"), uri)
        return self.cluster.s3_get(uri[len("s3://ckpt/"):])

    def run_to_success(self, job_id):
        try:
            return self.cluster.wait(job_id, lambda j: j["state"] == "SUCCEEDED", timeout=300,
                                     what="SUCCEEDED")
        except cluster_lib.ClusterError:
            self.dump()
            raise

    def workers_of(self, job):
        return sorted({t["workerId"] for t in job["tasks"]
                       if t.get("generation") == job["generation"]})

    def test_0_each_agent_found_its_hosts_address(self):
        workers = json.loads(self.cluster.cli(["workers", "-o", "json"])[1])["workers"]
        self.assertEqual({w["id"]: w["address"] for w in workers},
                         {h: self.bed.address(h) for h in ("w1", "w2", "w3")})

    def test_1_jobs_across_hosts_end_as_on_loopback(self):
        for name in CASES:
            with self.subTest(name):
                job = self.run_to_success(self.cluster.submit(spec(name, *CASES[name])))
                if name == "dp":  # one rank per host: the gradients cross the switch
                    self.assertEqual(len(self.workers_of(job)), 2, job["tasks"])
                self.assertEqual(self.model_of(job), self.reference[name],
                                 "%s: the model differs from the loopback run's" % name)

    def fault_and_recover(self, name, fault, reasons):
        """Holds a data-parallel job HELD_AFTER updates in, applies `fault` to the host of its
        rank 0, and checks it restarts on the spare host for one of `reasons`, succeeds, and
        ends bit for bit as without the fault. Returns the job once recovered, and the host."""
        self.cluster.hold(name, HELD_AFTER)
        job_id = self.cluster.submit(spec(name, *CASES["dp"]))
        held = self.cluster.wait(
            job_id, lambda j: j["state"] == "RUNNING" and
            int(j.get("progress", {}).get("step", 0)) >= HELD_AFTER and
            int(j.get("committedStep", 0)) >= 20, timeout=120, what="held at its step")
        victim = self.cluster.worker_of(held)
        fault(victim)
        recovered = self.cluster.wait(
            job_id, lambda j: any(r.get("recovered") for r in j.get("restarts", [])),
            timeout=120, what="recovered")
        self.cluster.release(name)
        done = self.run_to_success(job_id)
        restart = done["restarts"][0]
        self.assertIn(restart["reason"], reasons, restart)
        self.assertNotIn(victim, self.workers_of(done))
        self.assertGreater(restart.get("recoverySeconds", 0), 0, restart)  # the time split
        self.assertEqual(self.model_of(done), self.reference["dp"])
        print("  %s: %s, detection %.1f s, then %.1f s to the first step (scheduling %.1f, start "
              "%.1f, rendezvous %.1f, checkpoint load %.1f, first step %.1f), steps lost %s" % (
                  name, restart["reason"], restart.get("detectionSeconds", 0),
                  restart.get("recoverySeconds", 0), restart.get("schedulingSeconds", 0),
                  restart.get("startSeconds", 0), restart.get("rendezvousSeconds", 0),
                  restart.get("checkpointLoadSeconds", 0), restart.get("firstStepSeconds", 0),
                  restart.get("stepsLost", 0)), flush=True)
        return recovered, victim

    def restore(self, host):
        self.bed.heal(host)
        self.bed.kill(host)
        self.cluster.procs[host].wait(timeout=30)
        self.cluster.start_worker(host)
        self.cluster.wait_workers(3)

    def test_2_a_killed_worker_host(self):
        # The peer's reset (INFRASTRUCTURE: a lost peer) or the lease (WORKER_LOST), first wins.
        _, victim = self.fault_and_recover("killed", self.bed.kill,
                                           ("WORKER_LOST", "INFRASTRUCTURE"))
        self.restore(victim)

    def test_3_a_worker_host_cut_off(self):
        _, victim = self.fault_and_recover("cut", self.bed.cut, ("WORKER_LOST", "INFRASTRUCTURE"))
        self.restore(victim)

    def test_4_a_preemption_notice_loses_no_step(self):
        def preempt(host):
            self.cluster.procs[host].send_signal(15)

        recovered, victim = self.fault_and_recover("preempted", preempt, ("PREEMPTED",))
        restart = [r for r in recovered["restarts"] if r.get("recovered")][0]
        self.assertEqual(int(restart.get("stepsLost", 0)), 0, restart)
        self.restore(victim)

    def test_5_an_unreachable_object_store_does_not_stop_training(self):
        """s3rver's host cut off mid-run: the job trains on (a due checkpoint does not wait for an
        upload that hangs), nothing committed is corrupt, and the job ends as without it."""
        name = "s3cut"
        self.cluster.hold(name, HELD_AFTER)
        job_id = self.cluster.submit(spec(name, *CASES["dp"]))
        self.cluster.wait(job_id, lambda j: int(j.get("progress", {}).get("step", 0)) >=
                          HELD_AFTER and int(j.get("committedStep", 0)) >= 20, timeout=120,
                          what="held at its step")
        self.bed.cut("s3")
        cut_at = time.monotonic()
        self.cluster.hold(name, 2 * HELD_AFTER)  # 30 more updates, checkpoints due every 10
        self.cluster.wait(job_id, lambda j: int(j.get("progress", {}).get("step", 0)) >=
                          2 * HELD_AFTER, timeout=120, what="trained on")
        trained = time.monotonic() - cut_at
        # Waiting for the hanging upload would have cost max_wait (30 s) per due checkpoint.
        self.assertLess(trained, 25, "30 updates took %.1f s with the store unreachable" % trained)
        while time.monotonic() - cut_at < 10:  # the store stays away a while longer
            time.sleep(0.2)
        self.bed.heal("s3")
        self.cluster.release(name)
        done = self.run_to_success(job_id)
        self.assertEqual(done.get("restarts", []), [])
        self.assertEqual(self.model_of(done), self.reference["dp"])
        logs = self.cluster.cli(["logs", job_id, "--rank", "0"])[1]
        self.assertIn("skipped: the checkpoint of step", logs)
        # Every committed checkpoint is whole: each object of its manifest, as listed.
        listed = json.loads(self.cluster.cli(["checkpoints", job_id, "-o", "json"])[1])
        for checkpoint in listed["checkpoints"]:
            folder = checkpoint["uri"][len("s3://ckpt/"):]
            manifest = json.loads(self.cluster.s3_get(folder + "/MANIFEST.json"))
            for obj in manifest["objects"]:
                data = self.cluster.s3_get(folder + "/" + obj["name"])
                self.assertEqual(len(data), int(obj["size"]), obj["name"])
                self.assertEqual(hashlib.sha256(data).hexdigest(), obj["sha256"], obj["name"])
        print("  s3 cut: 30 updates in %.1f s while unreachable; %d checkpoints committed, whole" %
              (trained, len(listed["checkpoints"])), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    args, rest = parser.parse_known_args()
    BIN_DIR = os.path.abspath(args.bin_dir)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
