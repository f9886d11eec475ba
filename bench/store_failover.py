"""Coordinators on PostgreSQL against SQLite: durable submissions/s with the same client, and the
failover time of two coordinators sharing PostgreSQL.

    python3 bench/store_failover.py BUILD_DIR [JOBS] [ROUNDS] [QUEUED]

JOBS 0 skips the first part. Starts a PostgreSQL server of its own (Debian's binaries, a new cluster in a temporary folder,
fsync on: every acknowledged submission durable, as SQLite's synchronous=FULL), then
  1. submissions: a fresh coordinator on SQLite, one on PostgreSQL and one on PostgreSQL with the
     change feed's triggers off (what the standbys' warm copy costs the leader), in turn, ROUNDS
     times each, each loaded by coordinator_load (8 clients, JOBS submissions);
  2. failover: two coordinators on PostgreSQL (--leader_lease=3s, the default), QUEUED jobs
     (default 10,000) waiting in it (no workers), the leader killed (SIGKILL) ROUNDS times: kill -> the standby takes the lease (its log's "leading" line) ->
     it serves (its port file) -> the first submission acknowledged through the list of both
     (the CLI, retried), each killed coordinator started again as the next standby (and, with
     its warm copy, the next kill only once the copy has read the state); once with the
     standbys' warm copy (--warm_standby, the default) and once without.
Needs cmake --build BUILD_DIR --target coordinator_load trainyard-coordinator trainyard.
"""
import datetime
import glob
import os
import pwd
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from coordinator_load import Coordinator, load  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """A throwaway PostgreSQL cluster on 127.0.0.1, as the `postgres` user when run as root."""

    def __enter__(self):
        versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                          key=lambda p: int(p.split("/")[4]))
        if not versions:
            sys.exit("no PostgreSQL under /usr/lib/postgresql: run scripts/install-deps.sh")
        self.bin = os.path.dirname(versions[-1])
        self.dir = tempfile.mkdtemp(prefix="store_failover.pg.")
        drop = None
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.dir, user.pw_uid, user.pw_gid)

            def drop():
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)
        self.port = free_port()
        subprocess.run([f"{self.bin}/initdb", "-D", f"{self.dir}/data", "-A", "trust", "-U",
                        "trainyard", "--no-instructions"], preexec_fn=drop, check=True,
                       stdout=subprocess.DEVNULL)
        self.log = open(f"{self.dir}/postgres.log", "w")
        self.proc = subprocess.Popen(
            [f"{self.bin}/postgres", "-D", f"{self.dir}/data", "-p", str(self.port), "-k",
             self.dir, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=on"],
            preexec_fn=drop, stdout=self.log, stderr=self.log)
        for _ in range(600):
            if subprocess.run([f"{self.bin}/pg_isready", "-q", "-h", "127.0.0.1", "-p",
                               str(self.port)]).returncode == 0:
                break
            time.sleep(0.05)
        else:
            sys.exit("postgres did not start: see " + self.log.name)
        return self

    def database(self, name):
        subprocess.run([f"{self.bin}/psql", "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U",
                        "trainyard", "-d", "postgres", "-c", f"CREATE DATABASE {name}"],
                       check=True)
        return f"postgres://trainyard@127.0.0.1:{self.port}/{name}"

    def psql(self, name, sql):
        subprocess.run([f"{self.bin}/psql", "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U",
                        "trainyard", "-d", name, "-c", sql], check=True)

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def submissions_per_second(build, jobs, *flags, before=None):
    with Coordinator(build, *flags) as c:
        if before:
            before()
        out = load(build, "submit", f"--coordinator={c.address}", c.token_flag, "--threads=8",
                   f"--jobs={jobs}", f"--window={jobs}")
    for line in out.splitlines():
        if line.startswith("all "):
            return float(line.split("|")[1].split()[0])
    sys.exit("coordinator_load printed no total:\n" + out)


def log_time(path, text, after):
    """The time of the first log line containing `text` at or after `after` (a UTC datetime)."""
    with open(path) as f:
        for line in f:
            if text in line:
                at = datetime.datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S.%f")
                if at >= after:
                    return at
    return None


def failover(build, uri, rounds, queued, warm=True):
    root = tempfile.mkdtemp(prefix="store_failover.")
    ports = [free_port(), free_port()]
    addresses = ",".join(f"127.0.0.1:{p}" for p in ports)
    token_file = f"{root}/admin.token"
    procs = [None, None]

    def start(i):
        log = open(f"{root}/coordinator-{i}.log", "a")
        port_file = f"{root}/coordinator-{i}.port"
        if os.path.exists(port_file):
            os.remove(port_file)
        procs[i] = subprocess.Popen(
            [f"{build}/bin/trainyard-coordinator", f"--listen=127.0.0.1:{ports[i]}",
             f"--state_dir={root}/state-{i}", f"--port_file={port_file}", f"--store={uri}",
             f"--admin_token_file={token_file}", "--metrics_listen=",
             f"--warm_standby={'true' if warm else 'false'}"], stdout=log, stderr=log)

    def leader():
        for i in range(2):
            if procs[i].poll() is None and os.path.exists(f"{root}/coordinator-{i}.port"):
                return i
        return None

    spec = f"{root}/job.yaml"
    with open(spec, "w") as f:
        f.write("name: after-failover\nstrategy: single\nmodel: {builtin: mlp, args: "
                "{inputs: 4, hidden: [8], classes: 2}}\ndata: {synthetic: {samples: 64, "
                "features: 4, classes: 2}}\nbatch_size: 8\nmax_steps: 1\n")
    results = []
    try:
        start(0)
        start(1)
        while leader() is None:
            time.sleep(0.05)
        if queued:
            load(build, "submit", f"--coordinator={addresses}", f"--token_file={token_file}",
                 "--threads=8", f"--jobs={queued}", f"--window={queued}")
        for _ in range(rounds):
            old = leader()
            new = 1 - old
            killed_at = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
            t0 = time.monotonic()
            procs[old].kill()
            procs[old].wait()
            while leader() != new:
                time.sleep(0.005)
            serving = time.monotonic() - t0
            env = dict(os.environ, TRAINYARD_TOKEN_FILE=token_file)
            while subprocess.run([f"{build}/bin/trainyard", f"--coordinator={addresses}",
                                  "submit", spec], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL).returncode != 0:
                time.sleep(0.01)
            acknowledged = time.monotonic() - t0
            led = log_time(f"{root}/coordinator-{new}.log", "leading (lease token", killed_at)
            lease = (led - killed_at).total_seconds() if led else float("nan")
            listening = log_time(f"{root}/coordinator-{new}.log", "listening on", killed_at)
            loading = (listening - led).total_seconds() if led and listening else float("nan")
            results.append((lease, serving, acknowledged, loading))
            print(f"round {len(results)}: lease taken {lease:.2f} s, serving {serving:.2f} s, "
                  f"first submission acknowledged {acknowledged:.2f} s (lease to listening, "
                  f"the state loaded: {loading:.2f} s)", flush=True)
            start(old)  # the next standby, standing by before the next kill
            standby_log = f"{root}/coordinator-{old}.log"
            since = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
            # Standing by, and (warm) its copy read: a standby has stood by long before a failure.
            ready = "standby: read the whole state" if warm else "standby: "
            while log_time(standby_log, ready, since - datetime.timedelta(seconds=1)) is None:
                time.sleep(0.02)
    finally:
        for p in procs:
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait()
        shutil.rmtree(root, ignore_errors=True)
    return results


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    build = sys.argv[1]
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    queued = int(sys.argv[4]) if len(sys.argv) > 4 else 10000
    with Postgres() as pg:
        sqlite, postgres, no_feed = [], [], []
        for r in range(rounds if jobs > 0 else 0):
            sqlite.append(submissions_per_second(build, jobs))
            postgres.append(submissions_per_second(build, jobs, f"--store={pg.database(f'load_{r}')}"))
            # The change feed's cost: the same with its triggers off (the coordinator made the
            # schema as it started; the load begins after).
            name = f"nofeed_{r}"
            no_feed.append(submissions_per_second(
                build, jobs, f"--store={pg.database(name)}",
                before=lambda: pg.psql(name, "; ".join(
                    f"ALTER TABLE {t} DISABLE TRIGGER USER" for t in
                    ("jobs", "workers", "events", "tasks", "progress", "checkpoints", "tokens",
                     "searches", "trials", "queues")))))
            print(f"round {r + 1}: SQLite {sqlite[-1]:.0f}, PostgreSQL {postgres[-1]:.0f} "
                  f"(without the change feed {no_feed[-1]:.0f}) durable submissions/s", flush=True)
        if sqlite:
            print(f"submissions/s, median of {rounds}: SQLite {statistics.median(sqlite):.0f} "
                  f"({min(sqlite):.0f} to {max(sqlite):.0f}), PostgreSQL "
                  f"{statistics.median(postgres):.0f} ({min(postgres):.0f} to "
                  f"{max(postgres):.0f}); PostgreSQL / SQLite "
                  f"{statistics.median(postgres) / statistics.median(sqlite):.2f}; without the "
                  f"change feed's triggers {statistics.median(no_feed):.0f} ({min(no_feed):.0f} "
                  f"to {max(no_feed):.0f}), with / without "
                  f"{statistics.median(postgres) / statistics.median(no_feed):.2f}")
        for warm in (True, False):
            results = failover(build, pg.database(f"failover_{'warm' if warm else 'cold'}"),
                               rounds, queued, warm)
            print(f"with {queued} jobs queued, --warm_standby={'true' if warm else 'false'}:")
            for name, column in (("lease taken", 0), ("serving", 1), ("first acknowledged", 2),
                                 ("lease taken -> listening (state loaded)", 3)):
                values = [r[column] for r in results]
                print(f"kill -9 -> {name}: median {statistics.median(values):.2f} s "
                      f"({min(values):.2f} to {max(values):.2f})")


if __name__ == "__main__":
    main()
