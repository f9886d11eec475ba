#!/usr/bin/python3
"""Trainyard on a real Slurm (Debian's slurmctld, slurmd and munge) on the bed of hosts: the
coordinator and s3rver each on a host, slurmctld on its own, three Slurm nodes n1..n3. Agents run
where Slurm puts them, started by deploy/slurm/trainyard-agents.sbatch as an operator submits it.

  tests/hosts/slurm_test.py --bin-dir build/bin
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as cluster_lib  # noqa: E402
import slurm as slurm_lib  # noqa: E402

BIN_DIR = None
SCRIPT = os.path.join(cluster_lib.ROOT, "deploy", "slurm", "trainyard-agents.sbatch")
NODES = ["n1", "n2", "n3"]
HELD_AFTER = 30  # updates into an attempt at which the preempted job is held


def spec(name, steps=120, cpus=1):
    return f"""name: {name}
strategy: data_parallel
workers: 2
resources: {{cpus: {cpus}}}
model: {{builtin: mlp, args: {{inputs: 16, hidden: [64], classes: 4}}}}
data: {{synthetic: {{samples: 4096, features: 16, classes: 4, noise: 1.0}}, validation_split: 0.1}}
batch_size: 64
optimizer: {{name: sgd, lr: 0.05, momentum: 0.9}}
max_steps: {steps}
seed: 11
checkpoint: {{every_steps: 10, keep_last: 2}}
restart: {{max_failures: 0}}
"""


class SlurmTest(cluster_lib.ClusterTestCase):
    slurm = None

    @classmethod
    def setUpClass(cls):
        slurm_lib.check_machine()
        cls.start_cluster(["coord", "s3", "ctl"] + NODES, BIN_DIR, [])
        c = cls.cluster
        # One agent token per node, in a folder every node reads, as docs/operations.md says.
        os.makedirs(c.path("agent-tokens"))
        for n in NODES:
            secret = c.cli(["token", "create", n, "--role", "agent"])[1].strip()
            with open(c.path("agent-tokens", n), "w") as f:
                f.write(secret + "\n")
            os.chmod(c.path("agent-tokens", n), 0o600)
        cls.slurm = slurm_lib.SlurmCluster(cls.bed, "ctl", NODES, c.dir, grace=20)
        c.extra_env = {"SLURM_CONF": cls.slurm.path("slurm.conf")}
        try:
            cls.slurm.start()
        except Exception:
            cls.dump_slurm()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.slurm is not None:
            cls.slurm.run(["scancel", "--full", "--user=root"], check=False)
            cls.slurm.stop()
        super().tearDownClass()

    @classmethod
    def dump(cls):
        super().dump()
        cls.dump_slurm()

    @classmethod
    def dump_slurm(cls):
        if cls.slurm is None or not os.path.isdir(cls.slurm.dir):
            return
        for f in sorted(os.listdir(cls.slurm.dir)):
            if f.endswith(".log") or f.endswith(".out"):
                with open(cls.slurm.path(f), errors="replace") as log:
                    print("==== slurm/%s\n%s" % (f, log.read()[-3000:]))
        for f in sorted(os.listdir(cls.cluster.dir)):
            if f.startswith(("agents-", "trainyard-agents-")):
                with open(cls.cluster.path(f), errors="replace") as log:
                    print("==== %s\n%s" % (f, log.read()[-4000:]))

    def agents_env(self):
        """What the operator sets for the sbatch script (docs/operations.md), and the test's
        holds."""
        c = self.cluster
        env = dict(c.env())
        env.update({
            "TRAINYARD_COORDINATOR": c.address,
            "TRAINYARD_CA_FILE": c.path("tls", "ca.crt"),
            "TRAINYARD_TLS_SERVER_NAME": cluster_lib.COORDINATOR_NAME,
            "TRAINYARD_TOKEN_DIR": c.path("agent-tokens"),
            "TRAINYARD_BIN_DIR": c.bin,
            "TRAINYARD_WORK_ROOT": c.path("work"),
            "TRAINYARD_GRACE_PERIOD": "10s",
            "TRAINYARD_TEST_HOLD_DIR": c.hold_dir,
        })
        return env

    def start_agents(self, nodes=2, extra=(), env=None):
        return self.slurm.sbatch(["-N", str(nodes), "-p", "train",
                                  "--output=" + self.cluster.path("agents-%j.log")] +
                                 list(extra) + [SCRIPT], host="coord",
                                 env=dict(self.agents_env(), **(env or {})))

    def agents_log(self, alloc):
        with open(self.cluster.path("agents-%s.log" % alloc), errors="replace") as f:
            return f.read()

    def workers(self):
        import json
        return {w["id"]: w for w in
                json.loads(self.cluster.cli(["workers", "-o", "json"])[1]).get("workers", [])}

    def ready_workers(self):
        return sorted(i for i, w in self.workers().items()
                      if w.get("state") == "READY" and not w.get("draining"))

    def wait_ready(self, names, timeout=90):
        self.cluster.until(lambda: set(names) <= set(self.ready_workers()), timeout,
                           "workers %s were not READY" % names)

    def workers_of(self, job):
        return sorted({t["workerId"] for t in job["tasks"]
                       if t.get("generation") == job["generation"]})

    def held_job(self, name, cpus=1):
        """A data-parallel job held HELD_AFTER updates in, with a checkpoint committed."""
        self.cluster.hold(name, HELD_AFTER)
        job_id = self.cluster.submit(spec(name, cpus=cpus))
        return job_id, self.cluster.wait(
            job_id, lambda j: j["state"] == "RUNNING" and
            int(j.get("progress", {}).get("step", 0)) >= HELD_AFTER and
            int(j.get("committedStep", 0)) >= 20, timeout=120, what="held at its step")

    def urgent_job_on(self, node):
        """A job of the high-priority partition on `node`: Slurm preempts what holds it."""
        urgent = self.slurm.sbatch(["-p", "urgent", "-w", node, "-o", "/dev/null",
                                    "--wrap", "sleep 600"], host="coord")
        self.slurm.until(lambda: (self.slurm.job(urgent) or {}).get("state") == "RUNNING", 90,
                         "the urgent job did not start")
        return urgent

    def recovered_and_done(self, job_id, name, where, timeout=180):
        """Waits for the held job's restart to reach its first step `where`, releases it, and
        checks it ended with no step lost. Returns its restart record."""
        self.cluster.wait(job_id, lambda j: any(r.get("recovered") for r in j.get("restarts", [])),
                          timeout=timeout, what="recovered " + where)
        self.cluster.release(name)
        done = self.cluster.wait(job_id, lambda j: j["state"] == "SUCCEEDED", timeout=300,
                                 what="SUCCEEDED")
        restart = done["restarts"][0]
        self.assertEqual(restart["reason"], "PREEMPTED", restart)
        self.assertEqual(int(restart.get("stepsLost", 0)), 0, restart)
        self.assertEqual(int(restart.get("resumedStep", 0)), int(restart.get("lastStep", -1)),
                         restart)
        return done, restart

    def test_1_agents_on_an_allocation_and_a_slurm_preemption_loses_no_step(self):
        c = self.cluster
        alloc = self.start_agents(2)
        self.slurm.until(lambda: (self.slurm.job(alloc) or {}).get("state") == "RUNNING", 60,
                         "the agents' allocation did not start")
        first_nodes = self.slurm.nodes_of(alloc)
        self.assertEqual(len(first_nodes), 2, first_nodes)
        self.wait_ready(first_nodes)
        # Each agent offers its node as Slurm allocated it.
        for n in first_nodes:
            w = self.workers()[n]
            self.assertEqual(int(w["slots"]), self.slurm.cpus, w)
            self.assertEqual(w["address"], self.bed.address(n), w)

        name = "slurmpreempt"
        job_id, held = self.held_job(name)
        self.assertEqual(self.workers_of(held), first_nodes)

        # A job of the high-priority partition on one of the allocation's nodes: Slurm preempts
        # the allocation (REQUEUE, GraceTime 20 s), its agents get SIGTERM.
        victim = c.worker_of(held)
        preempted_at = time.time()
        urgent = self.urgent_job_on(victim)
        # The agents saved and left; the script put its allocation back in the queue, where Slurm
        # holds it while the old run's credential lasts (AuthInfo cred_expire: 20 s here, 120 s by
        # default).
        self.slurm.until(lambda: (self.slurm.job(alloc) or {}).get("state") == "PENDING", 60,
                         "the allocation was not requeued")
        self.assertIn("requeued", self.agents_log(alloc))
        done, restart = self.recovered_and_done(job_id, name, "on the requeued allocation")
        # The same allocation, requeued by Slurm, on the nodes the urgent job left.
        again = self.slurm.job(alloc)
        self.assertEqual(again["state"], "RUNNING", again)
        second_nodes = self.slurm.nodes_of(alloc)
        self.assertNotIn(victim, second_nodes)
        self.assertLessEqual(set(self.workers_of(done)), set(second_nodes))
        self.assertIn("Restarts=1", self.slurm.run(["scontrol", "show", "job", alloc]).stdout)
        print("  Slurm preemption: the job restarted (%s) %.1f s after the urgent job's "
              "submission, its first step on the requeued allocation %.1f s after that; steps "
              "lost %s" % (restart["reason"], int(restart["detectedUnixMs"]) / 1000 - preempted_at,
                           restart.get("recoverySeconds", 0), restart.get("stepsLost", 0)),
              flush=True)

        # The operator ends it: the agents leave (the workers drain), nothing else runs.
        self.slurm.run(["scancel", urgent, alloc])
        self.slurm.until(lambda: not self.slurm.jobs(), 60, "the Slurm jobs did not end")
        self.cluster.until(lambda: not self.ready_workers(), 30, "the agents did not leave")

    def test_4_a_node_slurm_drains_hands_its_work_on(self):
        c = self.cluster
        alloc = self.start_agents(3, env={"TRAINYARD_AGENT_FLAGS": "--drain_poll_interval=1s"})
        self.slurm.until(lambda: (self.slurm.job(alloc) or {}).get("state") == "RUNNING", 60,
                         "the agents' allocation did not start")
        nodes = self.slurm.nodes_of(alloc)
        self.wait_ready(nodes)
        name = "slurmdrain"
        job_id, held = self.held_job(name, cpus=2)
        victim = c.worker_of(held)
        self.slurm.run(["scontrol", "update", "nodename=" + victim, "state=drain",
                        "reason=maintenance"])
        done, restart = self.recovered_and_done(job_id, name, "on the other nodes")
        self.assertIn("preemption notice for worker %s (drain)" % victim, restart["message"])
        # A coordinator that asks Slurm itself (test 3's, when run after it) leaves agents started
        # by hand alone, though they share the job name.
        self.assertNotIn("Slurm job %s:" % alloc, self.coordinator_log())
        self.assertNotIn(victim, self.workers_of(done))
        self.assertNotIn(victim, self.ready_workers())
        # The allocation goes on on the other nodes.
        self.assertEqual(self.slurm.job(alloc)["state"], "RUNNING")
        self.slurm.run(["scancel", alloc])
        self.slurm.run(["scontrol", "update", "nodename=" + victim, "state=resume"])
        self.slurm.until(lambda: not self.slurm.jobs(), 60, "the Slurm jobs did not end")
        self.cluster.until(lambda: not self.ready_workers(), 30, "the agents did not leave")
        self.slurm.until(lambda: set(self.slurm.node_states().values()) == {"idle"}, 60,
                         "the nodes did not come back")

    def test_5_an_allocation_at_its_time_limit_hands_its_work_on(self):
        """A 3-minute allocation warned a minute before its end (Slurm sends it 60 to 120 s in):
        the job saves, the script requeues the allocation, the job ends on it."""
        c = self.cluster
        alloc = self.start_agents(2, extra=["--time=3", "--signal=TERM@60"])
        self.slurm.until(lambda: (self.slurm.job(alloc) or {}).get("state") == "RUNNING", 60,
                         "the agents' allocation did not start")
        self.wait_ready(self.slurm.nodes_of(alloc))
        name = "slurmtimelimit"
        job_id, _ = self.held_job(name)
        done, restart = self.recovered_and_done(job_id, name, "on the requeued allocation",
                                                timeout=300)
        self.assertIn("SIGTERM", restart["message"])
        self.assertRegex(self.agents_log(alloc), r"allocation %s at its time limit in \d+s: "
                                                 r"requeued" % alloc)
        self.slurm.run(["scancel", alloc])
        self.slurm.until(lambda: not self.slurm.jobs(), 60, "the Slurm jobs did not end")
        self.cluster.until(lambda: not self.ready_workers(), 30, "the agents did not leave")

    # ---- the coordinator as a Slurm client ----

    def restart_coordinator(self, **slurm):
        """The coordinator again, asking Slurm for nodes (--capacity=slurm) with `slurm` as its
        --slurm_* flags; the agents' settings in their file, as docs/operations.md says."""
        c = self.cluster
        env_file = c.path("slurm.env")
        with open(env_file, "w") as f:
            for key, value in sorted(self.agents_env().items()):
                if key.startswith(("TRAINYARD_", "AWS_")):
                    f.write("%s=%s\n" % (key, value))
        flags = {"script": SCRIPT, "partition": "train", "cpus_per_node": 2, "max_nodes": 3,
                 "env_file": env_file, "output_dir": c.dir, "idle_timeout": "5s",
                 "poll_interval": "1s", "retry_after": "2s"}
        flags.update(slurm)
        c.coordinator_flags = ["--capacity=slurm"] + ["--slurm_%s=%s" % kv for kv in flags.items()]
        proc = c.coordinator_proc(c.coordinator)
        proc.send_signal(2)
        proc.wait(timeout=30)
        c.start_coordinator()
        c.until(lambda: c.cli(["workers"], check=False)[0] == 0, 60, "the coordinator came back")

    def coordinator_log(self):
        with open(self.cluster.coordinator_log(self.cluster.coordinator), errors="replace") as f:
            return f.read()

    def asked_allocations(self):
        return [j for j in self.slurm.jobs() if j["name"] == "trainyard-agents"]

    def test_2_the_coordinator_asks_slurm_for_a_waiting_gang_and_gives_it_back(self):
        c = self.cluster
        self.restart_coordinator()
        # Two ranks of 2 CPUs each: a node each.
        name = "slurmgang"
        c.hold(name, HELD_AFTER)
        submitted = time.time()
        job_id = c.submit(spec(name, cpus=2))
        asked = c.wait(job_id, lambda j: "asked Slurm for 2 nodes (job " in j.get("reason", ""),
                       timeout=60, what="capacity asked for")
        self.assertEqual(asked["state"], "PENDING", asked)
        allocations = self.asked_allocations()
        self.assertEqual(len(allocations), 1, allocations)
        first = allocations[0]["id"]
        self.assertIn("(job %s" % first, asked["reason"])
        held = c.wait(job_id, lambda j: j["state"] == "RUNNING" and
                      int(j.get("progress", {}).get("step", 0)) >= HELD_AFTER and
                      int(j.get("committedStep", 0)) >= 20, timeout=120, what="held at its step")
        first_nodes = self.slurm.nodes_of(first)
        self.assertEqual(self.workers_of(held), first_nodes)
        self.print_first_step_split(held, submitted, first)

        # Slurm preempts the allocation: its agents leave and the script ends it (the coordinator
        # asks again itself); the coordinator asks for a new one, on the nodes left.
        victim = c.worker_of(held)
        urgent = self.urgent_job_on(victim)
        done, restart = self.recovered_and_done(job_id, name, "on a new allocation")
        second = [e for e in self.coordinator_log().splitlines()
                  if "capacity: asked Slurm for 2 nodes for job " + job_id in e]
        self.assertEqual(len(second), 2, second)
        second_id = second[1].rsplit("job ", 1)[1].strip()
        self.assertNotEqual(second_id, first)
        self.assertNotIn(victim, self.workers_of(done))
        print("  Slurm preemption with the coordinator asking: %.1f s from the notice to the "
              "first step on the new allocation (%s), steps lost %s" % (
                  restart.get("recoverySeconds", 0), second_id, restart.get("stepsLost", 0)),
              flush=True)

        # Idle for --slurm_idle_timeout: given back; the urgent job is not ours to touch.
        self.slurm.until(lambda: not self.asked_allocations(), 60,
                         "the idle allocation was not cancelled")
        self.assertIn("capacity: gave back Slurm job %s: its agents ran nothing for" % second_id,
                      self.coordinator_log())
        self.assertEqual([j["id"] for j in self.slurm.jobs()], [urgent])
        self.slurm.run(["scancel", urgent])
        self.cluster.until(lambda: not self.ready_workers(), 30, "the agents did not leave")

    def print_first_step_split(self, job, submitted, allocation):
        """From submission to the first step, with Slurm's part apart from ours."""
        events = {e["to"]: int(e["timeUnixMs"]) / 1000 for e in job.get("events", [])
                  if "to" in e}
        log = self.coordinator_log()
        show = self.slurm.run(["scontrol", "show", "job", allocation, "-o"]).stdout
        fields = dict(kv.split("=", 1) for kv in show.split() if "=" in kv)
        start = time.mktime(time.strptime(fields["StartTime"], "%Y-%m-%dT%H:%M:%S"))
        workers = self.workers()
        registered = max(int(workers[n]["registeredUnixMs"]) / 1000
                         for n in self.slurm.nodes_of(allocation))
        print("  waiting gang to first step: %.1f s; sbatch at +%.1f s (ours), allocation "
              "running at +%.0f s (Slurm's, 1 s resolution), agents registered at +%.1f s, "
              "placed at +%.1f s, running at +%.1f s" % (
                  events.get("RUNNING", 0) - submitted, self.asked_at(log, job["id"]) - submitted,
                  start - submitted, registered - submitted,
                  events.get("SCHEDULED", 0) - submitted, events.get("RUNNING", 0) - submitted),
              flush=True)

    @staticmethod
    def asked_at(log, job_id):
        for line in log.splitlines():
            if "capacity: asked Slurm" in line and job_id in line:
                stamp = line.split()[0].rstrip("Z")
                return time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) - \
                    time.timezone + float("0." + stamp[20:] or 0)
        return 0

    def test_3_an_allocation_slurm_refuses_is_in_the_jobs_reason(self):
        c = self.cluster
        self.restart_coordinator(partition="nosuch")
        job_id = c.submit(spec("refused", cpus=2))
        job = c.wait(job_id, lambda j: "Slurm refused 2 nodes" in j.get("reason", ""),
                     timeout=60, what="the refusal in the reason")
        self.assertIn("invalid partition", job["reason"].lower())
        self.assertIn("asking again in", job["reason"])
        self.assertEqual(self.asked_allocations(), [])
        c.cli(["cancel", job_id])


if __name__ == "__main__":
    BIN_DIR, argv = cluster_lib.test_args()
    unittest.main(argv=argv, verbosity=2)
