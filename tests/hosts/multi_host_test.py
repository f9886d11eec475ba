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
- The coordinator's host cut off from every worker for 30 s: training goes on, progress and
  checkpoints catch up after the heal, nothing restarts (a mass loss is held, not acted on).
- A worker host partitioned from the coordinator (it still reaches its peers): the attempt is
  fenced and restarts elsewhere, the old rank writes nothing, its agent kills it after 40 s
  without a lease (self-fencing), and the host is used again once healed. A worker host frozen
  for 20 s: the same, the old rank killed when its agent comes back.
- A 500 ms cut of a worker host's link and 1 % loss on the ranks' links: no restart (steps/s
  against the clean link printed).
- Every restart records the exact last step the ranks completed.

Needs root (namespaces) and s3rver (scripts/install-deps.sh); fails saying so without them.

  tests/hosts/multi_host_test.py --bin-dir build/bin
"""

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


class MultiHostTest(cluster_lib.ClusterTestCase):
    @classmethod
    def setUpClass(cls):
        cls.check_machine()
        cls.reference = loopback_models({n: spec(n, *CASES[n]) for n in CASES})
        # Agents fence themselves after 40 s without a lease: longer than the coordinator's 30 s
        # cut (test 6), which training rides through, shorter than test 7's partition.
        cls.start_cluster(["coord", "s3", "w1", "w2", "w3"], BIN_DIR, ["w1", "w2", "w3"],
                          agent_flags=["--self_fence_after=40s"])

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

    def tearDown(self):
        """Whatever a test left (a failure midway), the next one starts from a whole cluster:
        every host healed and thawed, every agent running, no job left running. A failed test
        shows the logs first."""
        super().tearDown()
        for host in self.cluster.workers + [self.cluster.coordinator]:
            self.bed.thaw(host)
            self.bed.heal(host)
        for name in os.listdir(self.cluster.hold_dir):
            self.cluster.release(name)
        listed = json.loads(self.cluster.cli(["jobs", "-o", "json"])[1]).get("jobs", [])
        for job in listed:
            if job["state"] in ("PENDING", "SCHEDULED", "RUNNING", "RESTARTING"):
                self.cluster.cli(["cancel", job["id"]], check=False)
        for host in self.cluster.workers:
            if self.cluster.procs[host].poll() is not None:
                self.cluster.start_worker(host)
        self.cluster.wait_workers(3)
        self.cluster.wait_idle()

    def fault_and_recover(self, name, fault, reasons, exact_step=True):
        """Holds a data-parallel job HELD_AFTER updates in, applies `fault` to the host of its
        rank 0, and checks it restarts on the spare host for one of `reasons`, succeeds, and
        ends bit for bit as without the fault. Returns the job once recovered, and the host."""
        job_id, held = self.held_job(name)
        victim = self.cluster.worker_of(held)
        fault_at = time.time()
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
        # Exact: the ranks completed HELD_AFTER updates (held before the next), whatever the
        # last progress report said (a preemption's ranks go on to the step they agree on); the
        # steps lost count from there.
        if exact_step:
            self.assertEqual(int(restart.get("lastStep", 0)), HELD_AFTER, restart)
        self.assertEqual(int(restart.get("stepsLost", 0)),
                         max(0, int(restart.get("lastStep", 0)) -
                             int(restart.get("resumedStep", 0))), restart)
        first_step = int(restart["detectedUnixMs"]) / 1000 + restart.get("recoverySeconds", 0)
        print("  %s: %s, %.1f s from the fault to the first step elsewhere; the coordinator's "
              "split: detection %.1f s, then scheduling %.1f, start %.1f, rendezvous %.1f, "
              "checkpoint load %.1f, first step %.1f; steps lost %s" % (
                  name, restart["reason"], first_step - fault_at,
                  restart.get("detectionSeconds", 0), restart.get("schedulingSeconds", 0),
                  restart.get("startSeconds", 0), restart.get("rendezvousSeconds", 0),
                  restart.get("checkpointLoadSeconds", 0), restart.get("firstStepSeconds", 0),
                  restart.get("stepsLost", 0)), flush=True)
        return recovered, victim, restart

    def assert_only_committed_folders(self, job_id):
        """Every step folder in the store is one the coordinator committed: nothing was written
        by an attempt after it was fenced."""
        listed = json.loads(self.cluster.cli(["checkpoints", job_id, "-o", "json"])[1])
        committed = {c["uri"].rstrip("/").rsplit("/", 1)[1] for c in listed["checkpoints"]}
        folders = {key.split("/")[2] for key in self.cluster.s3_list("runs/%s/" % job_id)}
        stray = {f for f in folders if f.startswith("step-")} - committed
        self.assertEqual(stray, set(), "step folders no commit names")

    def restore(self, host):
        self.bed.heal(host)
        self.bed.kill(host)
        self.cluster.procs[host].wait(timeout=30)
        self.cluster.start_worker(host)
        # Not the old agent, which may have registered again before it was killed.
        self.cluster.wait_worker_started(host)
        self.cluster.wait_workers(3)

    def test_2_a_killed_worker_host(self):
        # The agent's lease stream breaks with its host's reset: lost without waiting out a lease.
        _, victim, restart = self.fault_and_recover("killed", self.bed.kill, ("WORKER_LOST",))
        self.assertIn("its connection broke", restart["message"])
        self.restore(victim)

    def test_3_a_worker_host_cut_off(self):
        # Nobody hears anything: the busy agent's beats stop (the coordinator's pings, 75 s
        # apart, would take far longer).
        _, victim, restart = self.fault_and_recover("cut", self.bed.cut, ("WORKER_LOST",))
        self.assertIn("no word from its agent", restart["message"])
        self.restore(victim)

    def test_4_a_preemption_notice_loses_no_step(self):
        def preempt(host):
            self.cluster.procs[host].send_signal(15)

        recovered, victim, _ = self.fault_and_recover("preempted", preempt, ("PREEMPTED",),
                                                      exact_step=False)
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
            manifest = json.loads(self.cluster.s3_get(
                folder + "/MANIFEST.g%d.json" % int(checkpoint.get("generation", 0))))
            for obj in manifest["objects"]:
                data = self.cluster.s3_get(folder + "/" + obj["name"])
                self.assertEqual(len(data), int(obj["size"]), obj["name"])
                self.assertEqual(hashlib.sha256(data).hexdigest(), obj["sha256"], obj["name"])
        print("  s3 cut: 30 updates in %.1f s while unreachable; %d checkpoints committed, whole" %
              (trained, len(listed["checkpoints"])), flush=True)

    def assert_killed_on_return(self, job_id, old_rank):
        """The rank `old_rank` of a fenced attempt, on a host back from LOST, ends by SIGKILL
        (its agent was told to kill it), not by saving."""
        ended = self.cluster.wait(
            job_id, lambda j: any(t["taskId"] == old_rank and t.get("state") in
                                  ("TASK_STOPPED", "TASK_EXITED") for t in j["tasks"]),
            timeout=60, what="the fenced rank ended")
        self.assertEqual([t.get("signal") for t in ended["tasks"] if t["taskId"] == old_rank],
                         [9])

    def held_job(self, name):
        self.cluster.hold(name, HELD_AFTER)
        job_id = self.cluster.submit(spec(name, *CASES["dp"]))
        job = self.cluster.wait(
            job_id, lambda j: j["state"] == "RUNNING" and
            int(j.get("progress", {}).get("step", 0)) >= HELD_AFTER and
            int(j.get("committedStep", 0)) >= 20, timeout=120, what="held at its step")
        return job_id, job

    def test_6_the_coordinator_cut_off_restarts_nothing(self):
        """The coordinator's host cut off from everyone for 30 s: the ranks train on (steps need
        no coordinator), progress and checkpoints catch up after the heal, no job restarts."""
        name = "coordcut"
        job_id, job = self.held_job(name)
        ranks = [(t["workerId"], t["taskId"]) for t in job["tasks"]
                 if t.get("generation") == job["generation"]]
        self.bed.cut("coord")
        cut_at = time.monotonic()
        self.cluster.hold(name, 2 * HELD_AFTER)
        # Training goes on: each rank's own last-step file, on its host's disk, says so.
        deadline = time.monotonic() + 25
        while min(self.cluster.last_step(h, t) for h, t in ranks) < 2 * HELD_AFTER:
            self.assertLess(time.monotonic(), deadline, "the ranks stopped training: %s" %
                            [self.cluster.last_step(h, t) for h, t in ranks])
            time.sleep(0.1)
        trained = time.monotonic() - cut_at
        # `trainyard workers` says what the coordinator knows: every worker held by the mass
        # loss (UNREACHABLE, with when it would count as lost), none READY.
        deadline = time.monotonic() + 20
        while True:
            workers = json.loads(self.cluster.cli(["workers", "-o", "json"])[1])["workers"]
            if all(w.get("state") == "UNREACHABLE" for w in workers):
                break
            self.assertLess(time.monotonic(), deadline, "workers during the cut: %s" % workers)
            time.sleep(0.2)
        self.assertTrue(all("LOST if it is not back within" in w.get("stateReason", "")
                            for w in workers), workers)
        while time.monotonic() - cut_at < 30:
            time.sleep(0.2)
        log_at_heal = os.path.getsize(self.cluster.path("coordinator.log"))
        self.bed.heal("coord")
        healed_at = time.monotonic()
        # A checkpoint taken while the coordinator was away commits once it is back (later ones
        # due while that commit was retried were skipped, as with a slow store).
        before = int(job.get("committedStep", 0))
        self.cluster.wait(job_id, lambda j: int(j.get("progress", {}).get("step", 0)) >=
                          2 * HELD_AFTER, timeout=90, what="progress caught up")
        progress_back = time.monotonic() - healed_at
        caught_up = self.cluster.wait(job_id, lambda j: int(j.get("committedStep", 0)) > before,
                                      timeout=90, what="checkpoints caught up")
        commit_back = time.monotonic() - healed_at
        self.assertEqual(caught_up.get("restarts", []), [], caught_up.get("restarts"))
        self.assertEqual(caught_up["generation"], job["generation"])
        # Every worker held its lease again soon after the heal, the idle one too (its agent's
        # own pings found its dead connection while the coordinator was away): otherwise a
        # machine lost in the next minute would be taken for part of this mass loss.
        def back():
            names = set()
            with open(self.cluster.path("coordinator.log"), errors="replace") as log:
                log.seek(log_at_heal)
                for line in log:
                    if "workers reachable again: " in line:
                        names.update(line.rsplit(": ", 1)[1].strip().split(", "))
            return names
        deadline = time.monotonic() + 20
        while back() != set(self.cluster.workers):
            self.assertLess(time.monotonic(), deadline, "back after the heal: %s" % back())
            time.sleep(0.1)
        workers_back = time.monotonic() - healed_at
        self.cluster.wait_workers(3)
        self.cluster.release(name)
        done = self.run_to_success(job_id)
        self.assertEqual(done.get("restarts", []), [])
        self.assertEqual(self.model_of(done), self.reference["dp"])
        log = open(self.cluster.path("coordinator.log"), errors="replace").read()
        self.assertIn("3 of 3 workers unreachable at once", log)
        print("  coordinator cut 30 s: %d updates in %.1f s meanwhile; after the heal, progress "
              "in %.1f s, a commit in %.1f s, every worker's lease back in %.1f s; no restart" % (
                  HELD_AFTER, trained, progress_back, commit_back, workers_back), flush=True)

    def test_7_a_worker_host_partitioned_from_the_coordinator(self):
        """One worker host cannot reach the coordinator but still reaches its peers: the
        coordinator fences the attempt and restarts it elsewhere; the host's rank writes
        nothing, and its agent kills it once it has been without a lease for 40 s
        (self-fencing); healed, the agent registers again and is used again."""
        name = "partition"
        job_id, job = self.held_job(name)
        victim = self.cluster.worker_of(job)
        self.bed.partition("coord", victim)
        recovered = self.cluster.wait(
            job_id, lambda j: any(r.get("recovered") for r in j.get("restarts", [])),
            timeout=120, what="recovered")
        self.assertNotIn(victim, self.workers_of(recovered))
        old_rank = "%s.g%s.r0" % (job_id, job["generation"])
        self.assertEqual(self.cluster.last_step(victim, old_rank), HELD_AFTER)
        # Still cut off, the agent kills the old rank itself.
        agent_log = self.cluster.path("%s.log" % victim)
        partitioned_at = time.monotonic()
        deadline = partitioned_at + 90
        while "no lease from the coordinator for" not in open(agent_log, errors="replace").read():
            self.assertLess(time.monotonic(), deadline, "the cut-off agent kept its trainer")
            time.sleep(0.2)
        fenced_after = time.monotonic() - partitioned_at
        self.bed.heal(victim)
        self.cluster.wait_workers(3)
        # Back, it reports the rank of the fenced attempt stopped by its own hand.
        self.assert_killed_on_return(job_id, old_rank)
        ended = self.cluster.job(job_id)
        self.assertIn("(self-fencing)", [t.get("message", "") for t in ended["tasks"]
                                         if t["taskId"] == old_rank][0])
        print("  partition: the cut-off agent killed its trainer %.1f s after the partition" %
              fenced_after, flush=True)
        self.cluster.release(name)
        done = self.run_to_success(job_id)
        self.assertEqual(self.model_of(done), self.reference["dp"])
        # Nothing of the fenced attempt was committed after the next one started.
        started = int(done["restarts"][0]["detectedUnixMs"])
        listed = json.loads(self.cluster.cli(["checkpoints", job_id, "-o", "json"])[1])
        for checkpoint in listed["checkpoints"]:
            if int(checkpoint.get("generation", 0)) == int(job["generation"]):
                self.assertLess(int(checkpoint["createdUnixMs"]), started, checkpoint)
        self.assert_only_committed_folders(job_id)
        # And it is used again: a job of three ranks needs it.
        again = self.run_to_success(self.cluster.submit(
            spec("after-partition", *CASES["dp"]).replace("workers: 2", "workers: 6")
            .replace("batch_size: 64", "batch_size: 96")))
        self.assertIn(victim, self.workers_of(again))

    def test_8_a_frozen_worker_host(self):
        """Every process of a worker host stopped (SIGSTOP) for 20 s: the job restarts
        elsewhere; thawed, the host's old rank ends without writing anything."""
        name = "frozen"
        _, victim, restart = self.fault_and_recover_frozen(name)
        self.assertIn("no word from its agent", restart["message"])

    def fault_and_recover_frozen(self, name):
        job_id, job = self.held_job(name)
        victim = self.cluster.worker_of(job)
        frozen_at = time.monotonic()
        self.bed.freeze(victim)
        try:
            recovered = self.cluster.wait(
                job_id, lambda j: any(r.get("recovered") for r in j.get("restarts", [])),
                timeout=120, what="recovered")
            self.assertNotIn(victim, self.workers_of(recovered))
            while time.monotonic() - frozen_at < 20:
                time.sleep(0.2)
        finally:
            self.bed.thaw(victim)
        old_rank = "%s.g%s.r0" % (job_id, job["generation"])
        self.assert_killed_on_return(job_id, old_rank)
        self.cluster.release(name)
        done = self.run_to_success(job_id)
        self.assertEqual(self.model_of(done), self.reference["dp"])
        self.assert_only_committed_folders(job_id)
        self.cluster.wait_workers(3)
        return done, victim, done["restarts"][0]

    def test_9_a_blip_and_a_slow_lossy_link_restart_nothing(self):
        """A 500 ms cut of a rank's host, then 50 ms of delay with 10 ms of jitter and 1 % loss
        on both ranks' links for 20 s: no restart, no worker lost; steps/s against the clean
        link. (The delay is netem's, or the user-space delayer's where the kernel has no netem:
        see hosts.py.)"""
        name = "lossy"
        self.cluster.hold(name, 20)
        job_id = self.cluster.submit(spec(name, *CASES["dp"]).replace("max_steps: 120",
                                                                        "max_steps: 1000000"))
        job = self.cluster.wait(job_id, lambda j: j["state"] == "RUNNING" and
                                int(j.get("progress", {}).get("step", 0)) >= 20, timeout=120,
                                what="held at its step")
        ranks = [(t["workerId"], t["taskId"]) for t in job["tasks"]
                 if t.get("generation") == job["generation"]]
        self.cluster.release(name)

        def steps_per_second(seconds):
            first = min(self.cluster.last_step(h, t) for h, t in ranks)
            started = time.monotonic()
            while time.monotonic() - started < seconds:
                time.sleep(0.1)
            return (min(self.cluster.last_step(h, t) for h, t in ranks) - first) / seconds

        clean = steps_per_second(5)
        victim = ranks[0][0]
        self.bed.cut(victim)
        time.sleep(0.5)
        self.bed.heal(victim)
        after_blip = steps_per_second(5)
        how = set()
        for host in {h for h, _ in ranks}:
            how.add(self.bed.delay(host, 50, 10))
            self.bed.loss(host, 1)
        lossy = steps_per_second(20)
        for host in {h for h, _ in ranks}:
            self.bed.heal(host)
        job = self.cluster.job(job_id)
        self.assertEqual(job["state"], "RUNNING", job.get("reason"))
        self.assertEqual(job.get("restarts", []), [])
        workers = json.loads(self.cluster.cli(["workers", "-o", "json"])[1])["workers"]
        self.assertEqual(sorted(w["state"] for w in workers), ["READY"] * 3)
        self.assertGreater(lossy, 0)
        print("  steps/s: clean link %.1f, after a 500 ms cut %.1f, with 50 +- 10 ms of delay "
              "(%s) and 1 %% loss %.1f (%.2fx); no restart" %
              (clean, after_blip, "/".join(sorted(how)), lossy, lossy / clean), flush=True)


if __name__ == "__main__":
    BIN_DIR, argv = cluster_lib.test_args()
    unittest.main(argv=argv, verbosity=2)
