#!/usr/bin/python3
"""The console at scale, measured in a real headless Chromium (docs/benchmarks.md, "The console").

1. 10,000 jobs in the store (1,000 waiting, 9,000 cancelled): the jobs page's first answer (the
   ListJobs call that fills it, as the page makes it, and filtered by a name nothing matches), and
   the browser's page load until the table shows.
2. A job of 1,000,000 steps reported (100,000 reports, one every 10 steps, written through the
   coordinator's own job manager by bench/metric_history_fill): how many points its history kept,
   the GetJobMetrics answer's size and time, and the job page's load until its charts are drawn.
3. 10 console windows, each following a running job (held at a step: nothing changes), the
   coordinator's CPU over 60 s, against the same coordinator with none open.

Usage: bench/console_bench.py BUILD_DIR [--jobs 10000] [--reports 100000]
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from submit_python import stubs

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By


def wait_for(what, condition, timeout=120):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.05)


class Coordinator:
    """A coordinator alone (no workers) on a state folder, with its console."""

    def __init__(self, build, state):
        self.state = state
        for name in ("port", "console.port"):
            if os.path.exists(f"{state}/{name}"):
                os.remove(f"{state}/{name}")
        self.process = subprocess.Popen(
            [f"{build}/bin/trainyard-coordinator", "--listen=127.0.0.1:0", f"--state_dir={state}",
             f"--port_file={state}/port", "--console_listen=127.0.0.1:0",
             f"--console_port_file={state}/console.port", "--metrics_listen=",
             "--max_active_jobs=200000"],
            stdout=open(f"{state}/coordinator.log", "a"), stderr=subprocess.STDOUT)
        wait_for("the coordinator", lambda: os.path.exists(f"{state}/port"))
        self.url = f"http://127.0.0.1:{open(f'{state}/console.port').read().strip()}/"
        self.token = open(f"{state}/admin.token").read().strip()

    def post(self, method, body=None):
        """As call, on one kept-alive connection (as a browser's): for timing."""
        if getattr(self, "connection", None) is None:
            host, port = self.url[len("http://"):-1].split(":")
            self.connection = http.client.HTTPConnection(host, int(port), timeout=120)
        self.connection.request("POST", f"/api/v1/{method}", body=json.dumps(body or {}),
                                headers={"Authorization": f"Bearer {self.token}"})
        response = self.connection.getresponse()
        return response.read()

    def call(self, method, body=None):
        request = urllib.request.Request(
            f"{self.url}api/v1/{method}", data=json.dumps(body or {}).encode(), method="POST",
            headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.read()

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)


def browser():
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def logged_in(driver, url, token):
    driver.get(url + "#/login")
    driver.execute_script("sessionStorage.setItem('trainyard.token', arguments[0])", token)


def load_ms(driver, url, ready):
    """Milliseconds from navigation to `ready()` (polled), the page fetched afresh."""
    driver.get("about:blank")
    driver.get(url)
    deadline = time.monotonic() + 60
    while not ready():
        if time.monotonic() > deadline:
            sys.exit(f"{url}: never ready")
        time.sleep(0.005)
    return driver.execute_script("return performance.now()")


def timed(call, n):
    times = []
    for _ in range(n):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times), sorted(times)[int(0.95 * (n - 1))]


def many_jobs(build, root, jobs):
    state = f"{root}/many"
    os.makedirs(state)
    c = Coordinator(build, state)
    spec = ("name: {name}\nmodel: {{builtin: mlp, args: {{inputs: 4, hidden: [8], classes: 2}}}}\n"
            "data: {{synthetic: {{samples: 64, features: 4, classes: 2}}}}\nbatch_size: 16\n"
            "max_steps: 100\n")
    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda i: json.loads(c.call(
            "JobService/SubmitJob", {"specYaml": spec.format(name=f"run-{i % 97}")}))["id"],
            range(jobs)))
        list(pool.map(lambda i: c.call("JobService/CancelJob", {"id": ids[i]}),
                      range(jobs // 10, jobs)))
    print(f"{jobs} jobs submitted, {jobs - jobs // 10} cancelled over the JSON API in "
          f"{time.perf_counter() - began:.1f} s")
    page = lambda: c.post("JobService/ListJobs", {"pageSize": 50})
    med, p95 = timed(page, 50)
    print(f"jobs page's ListJobs (50 of {jobs}, {len(page()) / 1024:.0f} KiB of JSON): "
          f"median {med:.1f} ms, p95 {p95:.1f} ms")
    # The same call over gRPC from the same language (Debian's python3-grpcio, stubs made here):
    # what the JSON layer costs.
    stubs(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import grpc
    from trainyard.v1 import job_service_pb2, job_service_pb2_grpc
    address = f"127.0.0.1:{open(f'{state}/port').read().strip()}"
    stub = job_service_pb2_grpc.JobServiceStub(grpc.insecure_channel(address))
    metadata = [("authorization", f"Bearer {c.token}")]
    by_grpc = lambda: stub.ListJobs(job_service_pb2.ListJobsRequest(page_size=50),
                                    metadata=metadata)
    g_med, g_p95 = timed(by_grpc, 50)
    print(f"the same ListJobs over gRPC (python3-grpcio): median {g_med:.1f} ms, p95 {g_p95:.1f} "
          f"ms; JSON over HTTP / gRPC: {med / g_med:.2f}")
    filtered = lambda: c.post("JobService/ListJobs", {"pageSize": 50, "nameContains": "nomatch"})
    med, p95 = timed(filtered, 10)
    print(f"ListJobs filtered by a name no job has (reads up to 5,000 finished jobs): "
          f"median {med:.1f} ms, p95 {p95:.1f} ms")
    med, p95 = timed(lambda: urllib.request.urlopen(c.url).read(), 50)
    print(f"the page itself (GET /): median {med:.2f} ms")
    driver = browser()
    try:
        logged_in(driver, c.url, c.token)
        loads = [load_ms(driver, c.url + "#/jobs",
                         lambda: len(driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")) >= 50)
                 for _ in range(7)]
        print(f"browser: jobs page loaded, 50 rows shown: median {statistics.median(loads):.0f} ms "
              f"(of {', '.join(f'{x:.0f}' for x in loads)})")
    finally:
        driver.quit()
        c.stop()


def long_job(build, root, reports):
    state = f"{root}/long"
    os.makedirs(state)
    began = time.perf_counter()
    out = subprocess.run([f"{build}/bin/metric_history_fill", f"--state_dir={state}",
                          f"--reports={reports}", "--every=10"], check=True,
                         capture_output=True, text=True).stdout.split()
    job, steps, kept = out[0], int(out[1]), int(out[2])
    print(f"{reports} reports of a {steps}-step job written in {time.perf_counter() - began:.0f} s;"
          f" its history keeps {kept} points")
    c = Coordinator(build, state)
    body = c.call("JobService/GetJobMetrics", {"id": job})
    med, p95 = timed(lambda: c.post("JobService/GetJobMetrics", {"id": job}), 20)
    print(f"GetJobMetrics: {len(json.loads(body)['points'])} points, {len(body) / 1024:.0f} KiB "
          f"of JSON, median {med:.1f} ms, p95 {p95:.1f} ms")
    driver = browser()
    try:
        logged_in(driver, c.url, c.token)
        ready = lambda: driver.execute_script(
            "const c = document.getElementById('charts');"
            "return c && Number(c.dataset.points) > 0 && c.querySelectorAll('canvas').length > 0")
        loads = [load_ms(driver, f"{c.url}#/job/{job}", ready) for _ in range(5)]
        print(f"browser: the job's page loaded, charts drawn: median "
              f"{statistics.median(loads):.0f} ms (of {', '.join(f'{x:.0f}' for x in loads)})")
    finally:
        driver.quit()
        c.stop()


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def coordinator_pid(state):
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = open(f"/proc/{pid}/cmdline").read()
            except OSError:
                continue
            if "trainyard-coordinator" in cmd and state in cmd:
                return int(pid)
    sys.exit("no coordinator")


def following_tabs(build, root, tabs, seconds):
    state = f"{root}/tabs"
    holds = f"{root}/holds"
    os.makedirs(holds)
    env = dict(os.environ, TRAINYARD_TEST_HOLD_DIR=holds)
    log = open(f"{root}/up.log", "w+")
    up = subprocess.Popen([f"{build}/bin/trainyard", "up", "--port", "0", "--workers", "1",
                           "--slots", str(tabs), "--state-dir", state],
                          stdout=log, stderr=subprocess.STDOUT, env=env)
    wait_for("the console", lambda: "Console: " in open(log.name).read())
    link = [l for l in open(log.name) if l.startswith("Console: ")][0].split(" ", 1)[1].strip()
    url, token = link.split("#token=")
    c = Coordinator.__new__(Coordinator)
    c.url, c.token = url, token
    ids = []
    for i in range(tabs):
        name = f"followed-{i}"
        with open(f"{holds}/{name}", "w") as f:
            f.write("5\n")
        spec = (f"name: {name}\n"
                "model: {builtin: mlp, args: {inputs: 4, hidden: [8], classes: 2}}\n"
                "data: {synthetic: {samples: 64, features: 4, classes: 2}}\n"
                "batch_size: 16\nlog_every_steps: 1\nmax_steps: 100000\n")
        ids.append(json.loads(c.call("JobService/SubmitJob", {"specYaml": spec}))["id"])
    wait_for("every job held at step 5", lambda: all(
        json.loads(c.call("JobService/GetJob", {"id": i})).get("progress", {}).get("step") in
        ("5", 5) for i in ids), timeout=300)
    pid = coordinator_pid(state)

    def measure():
        before = cpu_seconds(pid)
        began = time.monotonic()
        time.sleep(seconds)
        return 100 * (cpu_seconds(pid) - before) / (time.monotonic() - began)

    idle = measure()
    driver = browser()
    try:
        logged_in(driver, url, token)
        for i, job in enumerate(ids):
            if i:
                driver.switch_to.new_window("window")
            driver.get(f"{url}#/job/{job}")
        hidden = 0
        for handle in driver.window_handles:
            driver.switch_to.window(handle)
            hidden += bool(driver.execute_script("return document.hidden"))
        busy = measure()
        print(f"coordinator CPU, {tabs} jobs held: {idle:.2f} % of a core with no console open, "
              f"{busy:.2f} % with {tabs} windows following them (each polling the job and its "
              f"history every 2 s, and following its logs; {hidden} of them hidden)")
    finally:
        driver.quit()
        up.send_signal(signal.SIGINT)
        up.wait(timeout=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build")
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--reports", type=int, default=100000)
    parser.add_argument("--tabs", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=60)
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    root = tempfile.mkdtemp(prefix="trainyard-console-bench-")
    try:
        many_jobs(build, root, args.jobs)
        long_job(build, root, args.reports)
        following_tabs(build, root, args.tabs, args.seconds)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
