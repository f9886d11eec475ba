"""A real Slurm on a bed of hosts (hosts.py), from Debian's packages: `munged` with a key of its
own, `slurmctld` on its host, and one `slurmd` per node host, each host its own node (its hostname
in a UTS namespace of its own is the node's name, its address the node's NodeAddr). Users' commands
(`sbatch`, `squeue`, `scancel`, `scontrol`) run on any host with SLURM_CONF from env().

Partitions: `train`, where the Trainyard agents run (PriorityTier 1, preempted by REQUEUE with
`grace` seconds of GraceTime), and `urgent` on the same nodes (PriorityTier 10, not preemptible):
a job there preempts the train jobs on its nodes (PreemptType=preempt/partition_prio).

  slurm = SlurmCluster(bed, "ctl", ["n1", "n2", "n3"], workdir)
  slurm.start()
  job = slurm.sbatch(["-N", "2", script], host="coord")
  slurm.stop()
"""

import os
import subprocess
import time


class SlurmError(Exception):
    pass


def check_machine():
    """Fails (never skips) where Slurm is missing."""
    for tool in ("munged", "slurmctld", "slurmd", "sbatch"):
        if subprocess.run(["sh", "-c", "command -v " + tool], capture_output=True).returncode:
            raise RuntimeError("FAIL: %s is missing (scripts/install-deps.sh installs Slurm)" %
                               tool)


class SlurmCluster:
    def __init__(self, bed, controller, nodes, workdir, grace=20, cpus=2):
        self.bed = bed
        self.controller = controller
        self.nodes = list(nodes)
        self.dir = os.path.join(workdir, "slurm")
        self.grace = grace
        self.cpus = cpus
        self.procs = {}
        self.munged_pid = None

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def env(self, extra=None):
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
               "SLURM_CONF": self.path("slurm.conf")}
        env.update(extra or {})
        return env

    # ---- start and stop ----

    def start(self):
        os.makedirs(self.path("state"), exist_ok=True)
        for n in self.nodes:
            os.makedirs(self.path("spool-" + n), exist_ok=True)
        os.chmod(self.dir, 0o755)
        self._start_munge()
        with open(self.path("slurm.conf"), "w") as f:
            f.write(self._conf())
        self.procs[self.controller] = self._daemon(self.controller, "slurmctld -D -i")
        for n in self.nodes:
            self.procs[n] = self._daemon(n, "slurmd -D")
        self.until(lambda: self.node_states() == {n: "idle" for n in self.nodes}, 60,
                   "the Slurm nodes were not idle")

    def _start_munge(self):
        key = self.path("munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(128))
        os.chmod(key, 0o600)
        done = subprocess.run(
            ["munged", "--key-file", key, "--socket", self.path("munge.socket"),
             "--pid-file", self.path("munged.pid"), "--log-file", self.path("munged.log"),
             "--seed-file", self.path("munge.seed"), "--force"],
            capture_output=True, text=True)
        if done.returncode != 0:
            raise SlurmError("munged: " + (done.stderr or done.stdout).strip())
        with open(self.path("munged.pid")) as f:
            self.munged_pid = int(f.read().strip())

    def _conf(self):
        nodes = ",".join(self.nodes)
        lines = [
            "ClusterName=trainyard-test",
            "SlurmctldHost=%s(%s)" % (self.controller, self.bed.address(self.controller)),
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            # cred_expire: how long a requeued job waits before it may start again (120 s by
            # default); the tests' requeues wait 20 s.
            "AuthInfo=socket=%s,cred_expire=20" % self.path("munge.socket"),
            "StateSaveLocation=" + self.path("state"),
            "SlurmdSpoolDir=" + self.path("spool-%n"),
            "SlurmctldPidFile=" + self.path("slurmctld.pid"),
            "SlurmdPidFile=" + self.path("slurmd-%n.pid"),
            "SlurmctldLogFile=" + self.path("slurmctld.log"),
            "SlurmdLogFile=" + self.path("slurmd-%n.log"),
            "MailProg=/bin/true",
            # Our hosts share one kernel: no cgroups, no binding.
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SwitchType=switch/none",
            "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "ReturnToService=2",
            "PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE",
        ]
        for n in self.nodes:
            lines.append("NodeName=%s NodeAddr=%s CPUs=%d State=UNKNOWN" % (
                n, self.bed.address(n), self.cpus))
        lines.append("PartitionName=train Nodes=%s Default=YES PriorityTier=1 "
                     "PreemptMode=REQUEUE GraceTime=%d MaxTime=INFINITE" % (nodes, self.grace))
        lines.append("PartitionName=urgent Nodes=%s PriorityTier=10 PreemptMode=OFF "
                     "MaxTime=INFINITE" % nodes)
        return "\n".join(lines) + "\n"

    def _daemon(self, host, command):
        """A daemon on `host`: in its network namespace (entered with nsenter, which keeps the
        machine's /sys, where slurmd looks for cgroups) and a UTS namespace named after it."""
        log = open(self.path("%s.out" % host), "a")
        p = subprocess.Popen(
            ["nsenter", "--net=/run/netns/" + self.bed.ns(host), "unshare", "--uts", "sh", "-c",
             "hostname %s && exec %s" % (host, command)],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return p

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.munged_pid:
            try:
                os.kill(self.munged_pid, 15)
            except ProcessLookupError:
                pass
            self.munged_pid = None

    # ---- using ----

    def run(self, args, host=None, env=None, check=True):
        done = self.bed.run(host or self.controller, args, capture_output=True, text=True,
                            env=self.env(env), timeout=60)
        if check and done.returncode != 0:
            raise SlurmError("%s: exit %d: %s" % (" ".join(args), done.returncode,
                                                  (done.stderr or done.stdout).strip()))
        return done

    def sbatch(self, args, host=None, env=None):
        """Submits; returns the Slurm job id."""
        return self.run(["sbatch", "--parsable"] + list(args), host, env).stdout.strip()

    def node_states(self):
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def job(self, job_id):
        """squeue's view of a job: {"state": "RUNNING", "nodes": "n1,n2", "reason": ...}, or
        None once it has left the queue."""
        out = self.run(["squeue", "-h", "-j", job_id, "-o", "%T|%N|%r|%P"], check=False).stdout
        line = out.strip().splitlines()
        if not line:
            return None
        state, nodes, reason, partition = line[0].split("|")
        return {"state": state, "nodes": nodes, "reason": reason, "partition": partition}

    def jobs(self):
        out = self.run(["squeue", "-h", "-o", "%i|%T|%j|%P|%N"], check=False).stdout
        return [dict(zip(("id", "state", "name", "partition", "nodes"), line.split("|")))
                for line in out.splitlines() if line.strip()]

    def nodes_of(self, job_id):
        """The job's nodes, expanded (scontrol show hostnames)."""
        j = self.job(job_id)
        if not j or not j["nodes"]:
            return []
        return self.run(["scontrol", "show", "hostnames", j["nodes"]]).stdout.split()

    def log(self):
        with open(self.path("slurmctld.log"), errors="replace") as f:
            return f.read()

    @staticmethod
    def until(predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise SlurmError(what + " within %d s" % timeout)
            time.sleep(0.2)
