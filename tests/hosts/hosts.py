#!/usr/bin/python3
"""A network of hosts on one machine, for tests and benchmarks: each host is a network namespace
with one interface on a private switch, and faults are one call each.

Layout of a bed named NAME (names are unique per run: NAME defaults to ty<pid><random>):
- a switch namespace `NAME-sw` holding a bridge `br0`; nothing of the bed is in the machine's
  own namespace, so there is no route out and no NAT: traffic stays among the bed's hosts;
- a host namespace `NAME-HOST` per host, its interface `eth0` (address 10.RR.0.N/24, RR picked
  per bed) wired by a veth pair to the bridge (switch side `v-HOST`), and loopback up;
- `/run/trainyard-hosts/NAME.json`: the bed's hosts, addresses and owner process, so that `down`
  (or the next bed, for an owner that died) removes everything.

Faults (each one call; `heal` undoes the link ones):
  kill HOST          SIGKILL every process of the host (its peers get resets)
  cut HOST           the host's switch port goes down: peers hear nothing, no reset
  partition A B      drop what A and B send each other (`oneway`: only A -> B), with nftables
  loss HOST P        drop P % of the packets the host receives, at random (nftables)
  rate HOST R        cap what the host sends at R (tc tbf, e.g. 10mbit)
  delay HOST MS [J]  delay what the host sends by MS ms, +- J ms of jitter (tc netem; where the
                     kernel has no sch_netem, tests/hosts/delayer.py does it in user space on an
                     iptables NFQUEUE, and says so)
  freeze / thaw HOST SIGSTOP / SIGCONT every process of the host
  heal HOST          undo cut, partition, loss and rate on the host

  tests/hosts/hosts.py up [--name NAME] HOST...     prints the bed's JSON
  tests/hosts/hosts.py down NAME | --stale
  tests/hosts/hosts.py fault NAME FAULT ARGS...
  tests/hosts/hosts.py exec NAME HOST COMMAND...
Needs root (namespaces), iproute2 and nftables (and iptables for a delay without sch_netem).
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

STATE_DIR = "/run/trainyard-hosts"
DELAYER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "delayer.py")
DELAY_QUEUE = 7  # the NFQUEUE number the delayer of a host listens on


class HostsError(Exception):
    pass


def _run(args, check=True, **kwargs):
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if check and done.returncode != 0:
        raise HostsError("%s: %s" % (" ".join(args), (done.stderr or done.stdout).strip()))
    return done


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _state(pid):
    """A process's state letter (R, S, T, ...), None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def _describe(pid):
    """"PID (STATE, wchan WCHAN): COMMAND", for an error that names a process."""
    def read(name):
        try:
            with open("/proc/%d/%s" % (pid, name), "rb") as f:
                return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            return "?"
    return "%d (%s, wchan %s): %s" % (pid, _state(pid), read("wchan"), read("cmdline")[:120])


class Bed:
    """A bed of hosts. Made by Bed.up(...), removed by down() (also on SIGINT and SIGTERM of the
    process that made it, and by the next up() if that process died)."""

    def __init__(self, state):
        self.name = state["name"]
        self.subnet = state["subnet"]
        self.hosts = state["hosts"]  # host -> address
        self.owner = state["owner"]

    # ---- making and removing ----

    @staticmethod
    def up(hosts, name=None, owner=None):
        if os.geteuid() != 0:
            raise HostsError("a bed of hosts needs root (network namespaces)")
        for tool in ("ip", "nft"):
            if _run(["sh", "-c", "command -v " + tool], check=False).returncode != 0:
                raise HostsError("%s is missing (scripts/install-deps.sh installs it)" % tool)
        if len(set(hosts)) != len(hosts) or not hosts:
            raise HostsError("host names must be given, each once: %s" % hosts)
        for h in hosts:
            if not h.replace("-", "").isalnum() or len(h) > 10:
                raise HostsError("host name %r: letters, digits and '-', at most 10" % h)
        Bed.sweep_stale()
        name = name or "ty%d%04d" % (os.getpid() % 100000, random.randrange(10000))
        if len(name) > 12:
            raise HostsError("bed name %r: at most 12 characters" % name)
        os.makedirs(STATE_DIR, exist_ok=True)
        taken = {Bed.load(n).subnet for n in Bed.names()}
        free = [r for r in range(100, 250) if "10.%d.0.0/24" % r not in taken]
        if not free:
            raise HostsError("no free 10.R.0.0/24 range for a new bed")
        subnet_octet = random.choice(free)
        state = {"name": name, "subnet": "10.%d.0.0/24" % subnet_octet,
                 "hosts": {h: "10.%d.0.%d" % (subnet_octet, i + 1) for i, h in enumerate(hosts)},
                 "owner": owner if owner is not None else os.getpid()}
        path = os.path.join(STATE_DIR, name + ".json")
        if os.path.exists(path):
            raise HostsError("a bed named %s exists already" % name)
        with open(path, "w") as f:
            json.dump(state, f)
        bed = Bed(state)
        try:
            bed._make()
        except Exception:
            bed.down()
            raise
        return bed

    def _make(self):
        sw = self.ns("sw")
        _run(["ip", "netns", "add", sw])
        _run(["ip", "-n", sw, "link", "set", "lo", "up"])
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        for host, address in self.hosts.items():
            ns = self.ns(host)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name",
                  "v-" + host, "netns", sw])
            _run(["ip", "-n", ns, "addr", "add", address + "/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", sw, "link", "set", "v-" + host, "master", "br0"])
            _run(["ip", "-n", sw, "link", "set", "v-" + host, "up"])

    def down(self):
        """Kills every process of the bed and removes its namespaces and state. Idempotent."""
        for host in list(self.hosts) + ["sw"]:
            ns = self.ns(host)
            if _run(["ip", "netns", "pids", ns], check=False).returncode == 0:
                self._signal_all(ns, signal.SIGCONT)
                self._signal_all(ns, signal.SIGKILL)
            _run(["ip", "netns", "del", ns], check=False)
        try:
            os.unlink(os.path.join(STATE_DIR, self.name + ".json"))
        except FileNotFoundError:
            pass

    @staticmethod
    def names():
        if not os.path.isdir(STATE_DIR):
            return []
        return sorted(f[:-5] for f in os.listdir(STATE_DIR) if f.endswith(".json"))

    @staticmethod
    def load(name):
        path = os.path.join(STATE_DIR, name + ".json")
        try:
            with open(path) as f:
                return Bed(json.load(f))
        except FileNotFoundError:
            raise HostsError("no bed named %s" % name) from None

    @staticmethod
    def sweep_stale():
        """Removes the beds whose owner process is gone (a run killed before it could clean)."""
        removed = []
        for name in Bed.names():
            bed = Bed.load(name)
            if bed.owner and not _alive(bed.owner):
                bed.down()
                removed.append(name)
        return removed

    def remove_on_exit(self):
        """Removes the bed when this process gets SIGINT or SIGTERM, or exits normally."""
        import atexit
        atexit.register(self.down)

        def on_signal(signum, _frame):
            self.down()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, on_signal)

    # ---- using ----

    def ns(self, host):
        if host != "sw" and host not in self.hosts:
            raise HostsError("no host %r in bed %s (hosts: %s)" % (host, self.name,
                                                                   ", ".join(self.hosts)))
        return "%s-%s" % (self.name, host)

    def address(self, host):
        self.ns(host)
        return self.hosts[host]

    def command(self, host, args):
        """`args` run in `host`'s namespace (as a list for subprocess)."""
        return ["ip", "netns", "exec", self.ns(host)] + list(args)

    def popen(self, host, args, **kwargs):
        return subprocess.Popen(self.command(host, args), **kwargs)

    def run(self, host, args, **kwargs):
        return subprocess.run(self.command(host, args), **kwargs)

    def pids(self, host):
        out = _run(["ip", "netns", "pids", self.ns(host)], check=False).stdout
        return [int(p) for p in out.split()]

    @staticmethod
    def _signal_all(ns, signum):
        out = _run(["ip", "netns", "pids", ns], check=False).stdout
        for pid in (int(p) for p in out.split()):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def _stop_all(self, host, fault):
        """SIGSTOP to every process of the host, and again to any forked meanwhile, until two
        listings in a row find the same processes, each stopped (or a zombie); returns them."""
        deadline = time.monotonic() + 10
        stopped = None
        while True:
            pids = self.pids(host)
            moving = [pid for pid in pids if _state(pid) not in ("T", "t", "Z", None)]
            if not moving:
                if stopped == set(pids):
                    return pids
                stopped = set(pids)
                continue
            stopped = None
            if time.monotonic() > deadline:
                raise HostsError("%s %s: processes still running after 10 s: %s"
                                 % (fault, host, "; ".join(_describe(pid) for pid in moving)))
            for pid in moving:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)

    # ---- faults ----

    def kill(self, host):
        """SIGKILL to every process of the host at once, as when it loses power. Each is stopped
        first, so no process sees another die: signalled one by one, an agent could see its
        trainer killed and report that end (a user's failure) before its own SIGKILL came."""
        for pid in self._stop_all(host, "kill"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def freeze(self, host):
        """SIGSTOP to every process of the host; returns once each is stopped."""
        self._stop_all(host, "freeze")

    def thaw(self, host):
        self._signal_all(self.ns(host), signal.SIGCONT)

    def cut(self, host):
        _run(["ip", "-n", self.ns("sw"), "link", "set", "v-" + host, "down"])

    def _nft(self, host, rules):
        ns = self.ns(host)
        _run(["ip", "netns", "exec", ns, "nft", "add", "table", "inet", "fault"])
        _run(["ip", "netns", "exec", ns, "nft", "add", "chain", "inet", "fault", "input",
              "{ type filter hook input priority 0; }"])
        for rule in rules:  # what arrives over the link, never the host's own loopback
            _run(["ip", "netns", "exec", ns, "nft", "add", "rule", "inet", "fault", "input",
                  "iifname", "eth0"] + rule)

    def partition(self, a, b, oneway=False):
        """Drops what `a` sends `b` (at `b`, silently) and, unless `oneway`, what `b` sends `a`."""
        self._nft(b, [["ip", "saddr", self.address(a), "drop"]])
        if not oneway:
            self._nft(a, [["ip", "saddr", self.address(b), "drop"]])

    def loss(self, host, percent):
        if not 0 < percent <= 100:
            raise HostsError("loss: a percentage in (0, 100], got %s" % percent)
        if percent >= 100:
            self._nft(host, [["drop"]])
            return
        # numgen gives 0..9999: drop below percent * 100.
        self._nft(host, [["numgen", "random", "mod", "10000", "<", str(int(percent * 100)),
                          "drop"]])

    def rate(self, host, rate):
        _run(["ip", "netns", "exec", self.ns(host), "tc", "qdisc", "replace", "dev", "eth0",
              "root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"])

    def delay(self, host, ms, jitter_ms=0):
        """Delays what `host` sends by `ms` ms, +- `jitter_ms`. Returns how: "netem" or "delayer"
        (user space, where the kernel has no sch_netem)."""
        if ms < 0 or jitter_ms < 0:
            raise HostsError("delay: ms and jitter >= 0, got %s and %s" % (ms, jitter_ms))
        ns = self.ns(host)
        done = _run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0",
                     "root", "netem", "delay", "%dms" % ms, "%dms" % jitter_ms], check=False)
        if done.returncode == 0:
            return "netem"
        if not shutil.which("iptables"):
            raise HostsError("delay: this kernel has no sch_netem (%s) and iptables, for the "
                             "user-space delayer, is missing (scripts/install-deps.sh installs "
                             "it)" % done.stderr.strip())
        self._stop_delayer(host)
        with tempfile.TemporaryFile() as errors:
            delayer = subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, DELAYER, "--queue", str(DELAY_QUEUE),
                 "--delay", str(ms), "--jitter", str(jitter_ms)],
                stdout=subprocess.PIPE, stderr=errors, start_new_session=True)
            ready = delayer.stdout.readline().strip()
            delayer.stdout.close()
            if ready != b"ready":
                delayer.kill()
                delayer.wait()
                errors.seek(0)
                raise HostsError("delay: the user-space delayer did not start: %s" %
                                 errors.read().decode(errors="replace").strip())
        self.__dict__.setdefault("_delayers", {})[host] = delayer  # reaped by _stop_delayer
        # What leaves by the link (never loopback); while no delayer listens, packets pass.
        _run(["ip", "netns", "exec", ns, "iptables", "-t", "mangle", "-A", "POSTROUTING",
              "-o", "eth0", "-j", "NFQUEUE", "--queue-num", str(DELAY_QUEUE), "--queue-bypass"])
        return "delayer"

    def _stop_delayer(self, host):
        ns = self.ns(host)
        if shutil.which("iptables"):
            _run(["ip", "netns", "exec", ns, "iptables", "-t", "mangle", "-F", "POSTROUTING"],
                 check=False)
        delayers = []
        for pid in self.pids(host):
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    if DELAYER.encode() in f.read():
                        delayers.append(pid)
            except OSError:
                pass
        for pid in delayers:  # it lets what it holds go, then exits
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while (any(_state(pid) not in (None, "Z") for pid in delayers) and
               time.monotonic() < deadline):
            time.sleep(0.01)
        started = self.__dict__.get("_delayers", {}).pop(host, None)
        if started is not None:
            try:
                started.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass

    def heal(self, host):
        ns = self.ns(host)
        _run(["ip", "-n", self.ns("sw"), "link", "set", "v-" + host, "up"])
        _run(["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "fault"], check=False)
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root"],
             check=False)
        self._stop_delayer(host)
        # Partitions are kept at the receiver: the others' rules naming this host go too.
        for other in self.hosts:
            if other == host:
                continue
            listed = _run(["ip", "netns", "exec", self.ns(other), "nft", "-a", "list", "chain",
                           "inet", "fault", "input"], check=False).stdout
            for line in listed.splitlines():
                if "saddr %s " % self.address(host) in line + " " and "# handle" in line:
                    handle = line.rsplit("# handle", 1)[1].strip()
                    _run(["ip", "netns", "exec", self.ns(other), "nft", "delete", "rule", "inet",
                          "fault", "input", "handle", handle], check=False)

    def fault(self, kind, args):
        table = {
            "kill": (1, lambda h: self.kill(h)),
            "cut": (1, lambda h: self.cut(h)),
            "freeze": (1, lambda h: self.freeze(h)),
            "thaw": (1, lambda h: self.thaw(h)),
            "heal": (1, lambda h: self.heal(h)),
            "partition": (2, lambda a, b: self.partition(a, b)),
            "oneway": (2, lambda a, b: self.partition(a, b, oneway=True)),
            "loss": (2, lambda h, p: self.loss(h, float(p))),
            "rate": (2, lambda h, r: self.rate(h, r)),
            "delay": (2, lambda h, ms, jitter=0: self.delay(h, int(ms), int(jitter))),
        }
        if kind not in table:
            raise HostsError("unknown fault %r (%s)" % (kind, ", ".join(sorted(table))))
        n, fn = table[kind]
        if len(args) != n and not (kind == "delay" and len(args) == 3):
            raise HostsError("%s takes %d argument(s), got %d" % (kind, n, len(args)))
        fn(*args)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="make a bed of hosts (stays until `down`)")
    up.add_argument("--name")
    up.add_argument("hosts", nargs="+")
    down = sub.add_parser("down", help="remove a bed, or every bed whose maker died (--stale)")
    down.add_argument("name", nargs="?")
    down.add_argument("--stale", action="store_true")
    fault = sub.add_parser("fault", help="one fault: kill, cut, partition, oneway, loss, rate, "
                                         "delay, freeze, thaw, heal")
    fault.add_argument("name")
    fault.add_argument("kind")
    fault.add_argument("args", nargs="*")
    ex = sub.add_parser("exec", help="run a command on a host")
    ex.add_argument("name")
    ex.add_argument("host")
    ex.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("list", help="the beds that exist")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            bed = Bed.up(args.hosts, name=args.name, owner=0)  # a person's: kept until `down`
            print(json.dumps({"name": bed.name, "subnet": bed.subnet, "hosts": bed.hosts}))
        elif args.action == "down":
            if args.stale:
                print("removed: %s" % (", ".join(Bed.sweep_stale()) or "none"))
            elif args.name:
                Bed.load(args.name).down()
            else:
                raise HostsError("down: a bed's name, or --stale")
        elif args.action == "fault":
            Bed.load(args.name).fault(args.kind, args.args)
        elif args.action == "exec":
            return Bed.load(args.name).run(args.host, args.command).returncode
        elif args.action == "list":
            for name in Bed.names():
                bed = Bed.load(name)
                print(name, bed.subnet, " ".join("%s=%s" % kv for kv in bed.hosts.items()))
    except HostsError as e:
        print("hosts: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
