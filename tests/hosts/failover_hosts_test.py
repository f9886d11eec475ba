#!/usr/bin/python3
"""Two coordinators across hosts (tests/hosts/hosts.py): PostgreSQL (Debian's, started here), two
coordinators sharing it, s3rver and two worker agents, each on a host of its own, over TLS and
tokens; clients and agents are given both coordinators' addresses.

- A client given the standby's address alone is told where the leader serves.
- The leader's host killed (every process, SIGKILL) while a job trains: the standby leads within
  5 s, the ranks train on meanwhile, a submission is acknowledged through the list, and the job
  ends in its first attempt, never restarted.
- The leader cut off from the database (partitioned from its host, both ways) while a job trains:
  the leader stops (exit code 3) once it cannot renew its lease, the standby leads, and the job
  ends in its first attempt.

Needs root (namespaces), s3rver and PostgreSQL (scripts/install-deps.sh); fails saying so
without them.

  tests/hosts/failover_hosts_test.py --bin-dir build/bin
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as cluster_lib  # noqa: E402
import multi_host_test  # noqa: E402

BIN_DIR = None
HELD_AFTER = 30  # updates into the attempt at which a job is held
STEPS = 120


def spec(name):
    """multi_host_test's 2-rank data-parallel job, STEPS long."""
    return multi_host_test.spec(name, "data_parallel", STEPS)


class FailoverHostsTest(cluster_lib.ClusterTestCase):
    @classmethod
    def setUpClass(cls):
        cls.start_cluster(["db", "s3", "c1", "c2", "w1", "w2"], BIN_DIR, ["w1", "w2"], slots=1,
                          coordinators=["c1", "c2"], database="db",
                          coordinator_flags=["--leader_lease=2s"])
        cls.cluster.wait_workers(2)

    def tearDown(self):
        super().tearDown()
        for host in self.cluster.coordinators + self.cluster.workers:
            self.bed.heal(host)
        self.bed.heal("db")
        for name in os.listdir(self.cluster.hold_dir):
            self.cluster.release(name)
        # Both coordinators run for the next test, whatever this one left.
        for host in self.cluster.coordinators:
            if self.cluster.coordinator_proc(host).poll() is not None:
                self.cluster.start_coordinator(host)

    def standby_of(self, leader):
        return next(c for c in self.cluster.coordinators if c != leader)

    def wait_for_leader(self, not_this, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            leader = self.cluster.leader()
            if leader not in (None, not_this):
                return leader
            self.assertLess(time.monotonic(), deadline, "no coordinator took over")
            time.sleep(0.05)

    def log_of(self, host):
        with open(self.cluster.coordinator_log(host), errors="replace") as f:
            return f.read()

    def restart_coordinator(self, host):
        """Starts the coordinator of `host` again; it stands by for the other."""
        self.cluster.coordinator_proc(host).wait(timeout=30)
        already = self.log_of(host).count("standby: ")
        self.cluster.start_coordinator(host)
        self.cluster.until(lambda: self.log_of(host).count("standby: ") > already, 30,
                           "%s did not stand by" % host)

    def held_job(self, name):
        self.cluster.hold(name, HELD_AFTER)
        job_id = self.cluster.submit(spec(name))
        job = self.cluster.wait(
            job_id, lambda j: j["state"] == "RUNNING" and
            int(j.get("progress", {}).get("step", 0)) >= HELD_AFTER, timeout=120,
            what="held at its step")
        ranks = [(t["workerId"], t["taskId"]) for t in job["tasks"]
                 if t.get("generation") == job["generation"]]
        return job_id, ranks

    def ranks_reach(self, ranks, step, timeout=30):
        deadline = time.monotonic() + timeout
        while min(self.cluster.last_step(h, t) for h, t in ranks) < step:
            self.assertLess(time.monotonic(), deadline, "the ranks stopped training")
            time.sleep(0.05)

    def ends_in_its_first_attempt(self, job_id):
        done = self.cluster.wait(job_id, lambda j: j["state"] == "SUCCEEDED", timeout=180,
                                 what="SUCCEEDED")
        self.assertEqual(int(done.get("generation", 0)), 1, done)
        self.assertEqual(done.get("restarts", []), [])
        self.assertEqual(int(done["progress"]["step"]), STEPS)

    def test_1_a_standby_tells_clients_where_the_leader_is(self):
        leader = self.cluster.leader()
        self.assertIsNotNone(leader)
        standby = self.standby_of(leader)
        command = [self.cluster.program("trainyard"), "--coordinator",
                   "%s:7070" % self.bed.address(standby), "--ca",
                   self.cluster.path("tls", "ca.crt"), "--tls-server-name",
                   cluster_lib.COORDINATOR_NAME, "--token-file",
                   self.cluster.path("coordinator", "admin.token"), "jobs"]
        done = self.bed.run("w1", command, capture_output=True, text=True, timeout=60,
                            env=self.cluster.env())
        self.assertNotEqual(done.returncode, 0, done.stdout)
        self.assertIn("stands by; the leader serves at %s:7070" % self.bed.address(leader),
                      done.stderr)

    def test_2_killing_the_leaders_host_restarts_no_job(self):
        leader = self.cluster.leader()
        job_id, ranks = self.held_job("killed")
        killed_at = time.monotonic()
        self.bed.kill(leader)
        # Training needs no coordinator: held until the leader is dead, the ranks go on.
        self.cluster.hold("killed", 2 * HELD_AFTER)
        self.ranks_reach(ranks, 2 * HELD_AFTER)
        now = self.wait_for_leader(leader)
        took = time.monotonic() - killed_at
        print("  kill -9 of the leader's host -> the standby leads: %.2f s" % took, flush=True)
        self.assertLess(took, 5)
        # Acknowledged through the list of both addresses, by the new leader.
        other = self.cluster.submit(spec("after-kill"))
        self.cluster.release("killed")
        self.ends_in_its_first_attempt(job_id)
        self.ends_in_its_first_attempt(other)
        self.restart_coordinator(leader)
        self.assertEqual(self.cluster.leader(), now)

    def test_3_a_leader_cut_off_from_the_database_stops_and_restarts_no_job(self):
        leader = self.cluster.leader()
        job_id, ranks = self.held_job("cutdb")
        self.bed.partition(leader, "db")
        proc = self.cluster.coordinator_proc(leader)
        proc.wait(timeout=30)
        self.assertEqual(proc.returncode, 3)  # it stopped acting
        self.assertIn("no longer the leader", self.log_of(leader))
        # Held until the leader stopped, the ranks go on.
        self.cluster.hold("cutdb", 2 * HELD_AFTER)
        self.ranks_reach(ranks, 2 * HELD_AFTER)
        now = self.wait_for_leader(leader)
        self.assertNotEqual(now, leader)
        self.cluster.release("cutdb")
        self.ends_in_its_first_attempt(job_id)
        self.bed.heal(leader)
        self.restart_coordinator(leader)


if __name__ == "__main__":
    BIN_DIR, argv = cluster_lib.test_args()
    unittest.main(argv=argv, verbosity=2)
