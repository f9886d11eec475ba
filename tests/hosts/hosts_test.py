#!/usr/bin/python3
"""The bed of hosts itself (tests/hosts/hosts.py): hosts reach each other over their own
addresses and nothing else; each fault does what it says and heals; everything is removed at
the end, also when the process that made the bed is interrupted or killed.

Needs root, as CI runs: without network namespaces it fails, saying why.

  tests/hosts/hosts_test.py
"""

import json
import os
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hosts  # noqa: E402

# A TCP echo on port 9000 and a UDP sink on 9001 that logs what it receives to stdout.
SERVER = r"""
import socket, sys, threading
address = sys.argv[1]
def tcp():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((address, 9000)); s.listen()
    while True:
        c, _ = s.accept(); c.sendall(c.recv(100)); c.close()
threading.Thread(target=tcp, daemon=True).start()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 9001))
# Room for every datagram a test sends at once (1,000 of about 1 KiB each as the kernel counts
# them): with the default buffer a busy machine's slow reader dropped a third of them, which the
# loss test took for the fault's. SO_RCVBUFFORCE (root) passes net.core.rmem_max.
u.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 8 << 20)
print("ready", flush=True)
while True:
    data, peer = u.recvfrom(100); print(data.decode(), flush=True)
"""

# From a host: exit 0 when `address` echoes over TCP within 2 s, 3 on a timeout (no answer at
# all), 4 on a refusal or unreachable network.
PROBE = r"""
import socket, sys
s = socket.socket(); s.settimeout(2)
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); s.sendall(b"hi"); sys.exit(0 if s.recv(2) == b"hi" else 5)
except socket.timeout:
    sys.exit(3)
except OSError as e:
    print(e); sys.exit(4)
"""

SEND_UDP = r"""
import socket, sys
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(sys.argv[4]) if len(sys.argv) > 4 else 20):
    u.sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))
"""


# From a host: the median milliseconds of argv[3] TCP connects to argv[1]:argv[2].
CONNECT_TIMES = r"""
import socket, statistics, sys, time
times = []
for _ in range(int(sys.argv[3])):
    s = socket.socket(); s.settimeout(5)
    started = time.monotonic(); s.connect((sys.argv[1], int(sys.argv[2])))
    times.append((time.monotonic() - started) * 1000); s.close()
print(statistics.median(times))
"""


class HostsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise RuntimeError("FAIL: the bed of hosts needs root (network namespaces), as CI has")
        cls.bed = hosts.Bed.up(["a", "b", "c"])
        cls.bed.remove_on_exit()
        cls.servers = {}
        for h in ("b", "c"):
            p = cls.bed.popen(h, ["python3", "-c", SERVER, cls.bed.address(h)],
                              stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "ready"
            cls.servers[h] = p

    @classmethod
    def tearDownClass(cls):
        cls.bed.down()
        for p in cls.servers.values():
            p.wait(timeout=10)
            p.stdout.close()

    def probe(self, src, dst, port=9000):
        return self.bed.run(src, ["python3", "-c", PROBE, self.bed.address(dst), str(port)],
                            capture_output=True, text=True).returncode

    def udp_arrives(self, src, dst, word, count=20):
        """How many of `count` datagrams tagged `word` from src reach dst's sink: sent, then 20
        markers from dst to itself (over its loopback, which no fault touches), and the sink read
        up to the last marker."""
        self.bed.run(src, ["python3", "-c", SEND_UDP, self.bed.address(dst), "9001", word,
                           str(count)])
        marker = word + "-end"
        self.bed.run(dst, ["python3", "-c", SEND_UDP, "127.0.0.1", "9001", marker])
        seen = markers = 0
        while markers < 20:
            line = self.servers[dst].stdout.readline().strip()
            markers += line == marker
            seen += line == word
        return seen

    def test_1_hosts_reach_each_other_and_nothing_else(self):
        self.assertEqual(self.probe("a", "b"), 0)
        self.assertEqual(self.probe("a", "c"), 0)
        routes = self.bed.run("a", ["ip", "route"], capture_output=True, text=True).stdout
        self.assertNotIn("default", routes)
        out = self.bed.run("a", ["python3", "-c", PROBE, "192.0.2.1", "80"], capture_output=True,
                           text=True)
        self.assertEqual(out.returncode, 4, out.stdout)
        self.assertIn("unreachable", out.stdout)
        # Nothing of the bed in the machine's own namespace.
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        self.assertNotIn("v-a", links)

    def test_2_a_cut_link_answers_nothing_until_healed(self):
        self.bed.cut("b")
        self.assertEqual(self.probe("a", "b"), 3)  # a timeout: no reset, no refusal
        self.assertEqual(self.probe("a", "c"), 0)
        self.bed.heal("b")
        self.assertEqual(self.probe("a", "b"), 0)

    def test_3_partitions_both_ways_and_one_way(self):
        self.bed.partition("a", "b")
        self.assertEqual(self.probe("a", "b"), 3)
        self.assertEqual(self.udp_arrives("b", "c", "b-to-c"), 20)  # others unaffected
        self.bed.heal("a")
        self.assertEqual(self.probe("a", "b"), 0)

        self.bed.partition("a", "c", oneway=True)  # only a -> c is dropped
        self.assertEqual(self.udp_arrives("a", "c", "a-to-c"), 0)
        self.assertEqual(self.udp_arrives("b", "c", "b-to-c2"), 20)
        self.bed.heal("a")
        self.assertEqual(self.udp_arrives("a", "c", "a-to-c2"), 20)

    def test_4_loss_drops_what_a_host_receives(self):
        self.bed.loss("c", 100)
        self.assertEqual(self.udp_arrives("a", "c", "lost"), 0)
        self.bed.heal("c")
        self.bed.loss("c", 50)
        # 1000 datagrams at 50 %: the chance of fewer than 350 or more than 650 is nil.
        arrived = self.udp_arrives("a", "c", "half", count=1000)
        self.assertGreater(arrived, 350)
        self.assertLess(arrived, 650)
        self.bed.heal("c")
        self.assertEqual(self.udp_arrives("a", "c", "back"), 20)

    def connect_ms(self, src, dst, count=20):
        """The median time of `count` TCP connects from src to dst's echo: one round trip."""
        out = self.bed.run(src, ["python3", "-c", CONNECT_TIMES, self.bed.address(dst), "9000",
                                 str(count)], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        return float(out.stdout)

    def test_5_rate_caps_and_delay_delays(self):
        self.bed.rate("a", "8mbit")
        qdisc = self.bed.run("a", ["tc", "qdisc", "show", "dev", "eth0"], capture_output=True,
                             text=True).stdout
        self.assertIn("tbf", qdisc)
        self.assertIn("rate 8Mbit", qdisc)
        self.bed.heal("a")
        # 50 ms (+- 10) on what a sends: a round trip from a takes that much more, and only
        # while the fault lasts (netem, or the user-space delayer where the kernel lacks it).
        clean = self.connect_ms("a", "b")
        self.assertLess(clean, 20)
        how = self.bed.delay("a", 50, 10)
        self.assertIn(how, ("netem", "delayer"))
        delayed = self.connect_ms("a", "b")
        self.assertGreater(delayed, 38)
        self.assertLess(delayed, 90)
        self.assertLess(self.connect_ms("c", "b"), 20)  # others unaffected
        self.bed.heal("a")
        self.assertLess(self.connect_ms("a", "b"), 20)
        if how == "delayer":
            self.assertFalse(any(hosts.DELAYER.encode() in open("/proc/%d/cmdline" % pid, "rb")
                                 .read() for pid in self.bed.pids("a")))

    def test_6_freeze_thaw_and_kill_act_on_every_process_of_a_host(self):
        pid = self.servers["b"].pid
        # A process that forks all the time: freeze and kill must catch its children too.
        forker = self.bed.popen("b", ["sh", "-c", "while :; do sleep 0.01; done"])
        # The server runs under `ip netns exec`, which execs it: the pid is the server's.
        self.bed.freeze("b")
        self.assertEqual(self.state_of(pid), "T")
        self.assertTrue(all(self.state_of(p) in ("T", "Z") for p in self.bed.pids("b")))
        self.assertEqual(self.probe("a", "b"), 3)  # a frozen host answers nothing
        self.bed.thaw("b")
        self.assertIn(self.state_of(pid), ("S", "R"))
        self.assertEqual(self.probe("a", "b"), 0)
        self.bed.kill("b")
        self.servers["b"].wait(timeout=10)
        self.assertEqual(self.servers["b"].returncode, -signal.SIGKILL)
        self.assertEqual(forker.wait(timeout=10), -signal.SIGKILL)
        self.assertEqual(self.bed.pids("b"), [])
        self.assertEqual(self.probe("a", "b"), 4)  # a reset: refused

    @staticmethod
    def state_of(pid):
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]


class CleanupTest(unittest.TestCase):
    MAKER = r"""
import os, sys, json, time
sys.path.insert(0, sys.argv[1])
import hosts
bed = hosts.Bed.up(["x", "y"])
if sys.argv[2] == "clean":
    bed.remove_on_exit()
bed.popen("x", ["sleep", "600"])
print(json.dumps({"name": bed.name}), flush=True)
time.sleep(600)
"""

    def make(self, mode):
        p = subprocess.Popen([sys.executable, "-c", self.MAKER,
                              os.path.dirname(os.path.abspath(__file__)), mode],
                             stdout=subprocess.PIPE, text=True)
        name = json.loads(p.stdout.readline())["name"]
        self.assertIn(name, hosts.Bed.names())
        return p, name

    @staticmethod
    def namespaces(name):
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [line.split()[0] for line in out.splitlines() if line.startswith(name + "-")]

    def test_an_interrupted_maker_removes_its_bed(self):
        p, name = self.make("clean")
        self.assertEqual(len(self.namespaces(name)), 3)  # x, y and the switch
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        self.assertEqual(self.namespaces(name), [])
        self.assertNotIn(name, hosts.Bed.names())

    def test_a_killed_makers_bed_goes_with_the_next_sweep(self):
        p, name = self.make("killed")
        p.kill()
        p.wait()
        self.assertEqual(len(self.namespaces(name)), 3)  # SIGKILL leaves it
        self.assertIn(name, hosts.Bed.sweep_stale())
        self.assertEqual(self.namespaces(name), [])
        self.assertNotIn(name, hosts.Bed.names())


if __name__ == "__main__":
    unittest.main(verbosity=2)
