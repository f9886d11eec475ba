#!/usr/bin/python3
"""The web console in a real headless Chromium, against a real local cluster (`trainyard up`).

What a person does in the console, checked as they would see it: log in with a token; the jobs
page lists a running job; its page shows charts whose points grow while it trains and logs that
follow; cancel asks first, then cancels; a user's token does not see another user's job; a log
line and an event message holding <script> and <img onerror> show as text and run nothing; no
page breaks the Content-Security-Policy. Jobs are held at a step (TRAINYARD_TEST_HOLD_DIR) where
the test needs them, never caught on the fly.

Screenshots of every page go to --out (CI keeps the build folder's test-output/). With
--readme-images DIR, the ones the README shows are also written there.

Usage: browser_test.py --bin-dir BUILD/bin --out DIR [--readme-images docs/images]
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
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

WAIT = 60  # seconds any one thing may take to show, on a loaded machine
PAYLOAD = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


# A small ASHA search: 4 trials, rungs ending at steps 10, 30 and 90.
SEARCH = """name: console-asha
searcher: {name: asha, metric: loss, max_trials: 4, max_concurrent_trials: 2, max_length: 90,
           divisor: 3, max_rungs: 3, seed: 3}
hyperparameters:
  optimizer.lr: {type: log, min: 1e-3, max: 1e-1}
template:
  model: {builtin: mlp, args: {inputs: 16, hidden: [16], classes: 4}}
  data: {synthetic: {samples: 512, features: 16, classes: 4, noise: 0.5}}
  batch_size: 32
  optimizer: {name: sgd}
"""


def job_yaml(name, max_steps):
    return f"""name: {name}
strategy: single
model:
  builtin: mlp
  args: {{inputs: 16, hidden: [32], classes: 4}}
data:
  synthetic: {{samples: 2048, features: 16, classes: 4, noise: 0.5}}
batch_size: 32
optimizer: {{name: adamw, lr: 0.01}}
log_every_steps: 1
seed: 7
max_steps: {max_steps}
"""


class Api:
    """The console's JSON API, as a script would call it."""

    def __init__(self, url, token):
        self.url = url
        self.token = token

    def call(self, method, body=None):
        request = urllib.request.Request(
            f"{self.url}api/v1/{method}", data=json.dumps(body or {}).encode(), method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{method}: HTTP {e.code}: {e.read().decode()}") from None


def wait_until(what, condition, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Cluster:
    """`trainyard up` in a folder of its own, with a hold folder its trainers read."""

    def __init__(self, bin_dir, root):
        self.state = os.path.join(root, "state")
        self.holds = os.path.join(root, "holds")
        os.makedirs(self.holds)
        env = dict(os.environ, TRAINYARD_TEST_HOLD_DIR=self.holds)
        self.output = open(os.path.join(root, "up.log"), "w+")
        self.process = subprocess.Popen(
            [os.path.join(bin_dir, "trainyard"), "up", "--port", "0", "--workers", "1",
             "--slots", "4", "--state-dir", self.state],
            stdout=self.output, stderr=subprocess.STDOUT, env=env)
        line = wait_until("the console's login link", self._console_line, timeout=120)
        self.login_link = line.split("Console: ", 1)[1].strip()
        self.url = self.login_link.split("#login=")[0]
        with open(os.path.join(self.state, "admin.token")) as f:
            self.admin = Api(self.url, f.read().strip())

    def _console_line(self):
        if self.process.poll() is not None:
            raise AssertionError("trainyard up ended:\n" + open(self.output.name).read())
        for line in open(self.output.name):
            if line.startswith("Console: "):
                return line
        return None

    def hold(self, job_name, updates):
        path = os.path.join(self.holds, job_name)
        with open(path + ".new", "w") as f:
            f.write(f"{updates}\n")
        os.rename(path + ".new", path)

    def release(self, job_name):
        os.remove(os.path.join(self.holds, job_name))

    def stop(self):
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Browser:
    def __init__(self, out):
        options = Options()
        options.binary_location = "/usr/bin/chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1400,1100"):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        self.out = out
        self.console_messages = []

    def shot(self, name):
        path = os.path.join(self.out, f"console-{name}.png")
        self.driver.save_screenshot(path)
        return path

    def find(self, css):
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def finds(self, css):
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def wait(self, what, condition, timeout=WAIT):
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.1).until(
                lambda d: condition(), message=f"timed out waiting for {what}")
        except Exception:
            self.shot("failure")
            print(f"browser_test: the page, waiting for {what}:\n" +
                  self.driver.find_element(By.TAG_NAME, "body").text, file=sys.stderr)
            raise

    def go(self, url):
        self.driver.get(url)

    def text(self, css):
        found = self.finds(css)
        return found[0].text if found else ""

    def log_in(self, url, token):
        self.go(url + "#/login")
        self.wait("the login form", lambda: self.finds("#token"))
        self.find("#token").clear()
        self.find("#token").send_keys(token)
        self.find("#login-button").click()
        self.wait("the jobs page", lambda: self.finds("#jobs table"))

    def pwned(self):
        return self.driver.execute_script("return window.__pwned === undefined ? null : window.__pwned")

    def take_console_messages(self):
        for entry in self.driver.get_log("browser"):
            self.console_messages.append(entry["message"])

    def quit(self):
        self.driver.quit()


def chart_points(browser):
    found = browser.finds("#charts")
    return int(found[0].get_attribute("data-points") or 0) if found else 0


def check_login_link(cluster, browser):
    # The link `trainyard up` printed logs in once, as the admin; used again, it says so.
    browser.go(cluster.login_link)
    browser.wait("the jobs page", lambda: browser.finds("#jobs table"))
    assert "#login=" not in browser.driver.current_url, "the code stayed in the address bar"
    browser.driver.execute_script("sessionStorage.clear()")
    browser.go("about:blank")
    browser.go(cluster.login_link)
    browser.wait("the refusal", lambda: "used already" in browser.text("#login-error"))
    assert not browser.finds("#jobs")


def check_login_and_jobs(cluster, browser, alice, demo):
    # Without a credential, only the login page.
    browser.go(cluster.url)
    browser.wait("the login page", lambda: browser.finds("#login"))
    assert not browser.finds("#jobs"), "the jobs page showed without a token"
    browser.shot("login")
    browser.find("#token").send_keys("not-a-token")
    browser.find("#login-button").click()
    browser.wait("the refusal", lambda: "not valid" in browser.text("#login-error"))
    browser.log_in(cluster.url, alice.token)
    browser.wait("the running job in the list",
                 lambda: browser.finds(f'tr[data-job="{demo}"]') and
                 "RUNNING" in browser.text(f'tr[data-job="{demo}"]'))
    browser.shot("jobs")


def check_job_page(cluster, browser, alice, demo):
    browser.go(f"{cluster.url}#/job/{demo}")
    browser.wait("the job's first points", lambda: chart_points(browser) >= 1)
    browser.wait("the job's log", lambda: "step" in browser.text("#log"))
    before_points = chart_points(browser)
    before_log = len(browser.text("#log"))
    # Trains on to update 40, where it is held again: the chart and the log grow, live.
    cluster.hold("console-demo", 40)
    browser.wait("more points", lambda: chart_points(browser) > before_points)
    browser.wait("more log", lambda: len(browser.text("#log")) > before_log)
    browser.wait("the step it is held at", lambda: "40 of" in browser.text("#job-facts"))
    browser.wait("a drawn chart", lambda: browser.finds("#charts canvas"))
    browser.shot("job")

    # Cancel asks first; saying no keeps the job running.
    browser.find("#cancel").click()
    browser.wait("the question", lambda: browser.find("#confirm").is_displayed())
    assert demo in browser.text("#confirm-text")
    browser.shot("cancel-question")
    browser.find("#confirm-no").click()
    browser.wait("the question to close", lambda: not browser.find("#confirm").is_displayed())
    assert alice.call("JobService/GetJob", {"id": demo})["state"] == "RUNNING"
    browser.find("#cancel").click()
    browser.wait("the question", lambda: browser.find("#confirm").is_displayed())
    browser.find("#confirm-yes").click()
    browser.wait("the job cancelled", lambda: "CANCELLED" in browser.text("#job-facts"))
    assert alice.call("JobService/GetJob", {"id": demo})["state"] == "CANCELLED"


def check_text_only(cluster, browser, alice, events_job, xss_job):
    # An event message (the cancel's reason) and a log line, both holding markup.
    browser.go(f"{cluster.url}#/job/{events_job}")
    browser.wait("the event", lambda: any("<script>" in e.text
                                          for e in browser.finds(".event-reason")))
    assert not browser.finds("main img"), "an event message became HTML"
    assert browser.pwned() is None, "an event message ran as script"
    browser.go(f"{cluster.url}#/job/{xss_job}")
    browser.wait("the job's page", lambda: "SUCCEEDED" in browser.text("#job-facts"))
    browser.wait("the program's log line", lambda: "<img src=x" in browser.text("#log"))
    assert not browser.finds("#log img") and not browser.finds("#log script"), \
        "a log line became HTML"
    assert not browser.finds("main img"), "markup from a job became an element"
    assert browser.pwned() is None, "a job's text ran as script"
    browser.shot("text-only")


def check_users_apart(cluster, browser, bob, demo, bob_job):
    browser.find("#logout").click()
    browser.wait("the login page", lambda: browser.finds("#login"))
    browser.log_in(cluster.url, bob.token)
    browser.wait("bob's job", lambda: browser.finds(f'tr[data-job="{bob_job}"]'))
    assert not browser.finds(f'tr[data-job="{demo}"]'), "a user saw another user's job"
    browser.go(f"{cluster.url}#/job/{demo}")
    browser.wait("the refusal", lambda: "belongs to another user" in browser.text("#banner"))
    assert browser.text("#job-facts") == "", "a user saw another user's job's page"


def check_other_pages(cluster, browser, search):
    browser.find("#logout").click()
    browser.log_in(cluster.url, cluster.admin.token)
    for page, css in (("workers", "#workers table"), ("queues", "#queues table"),
                      ("searches", "#searches table")):
        browser.go(f"{cluster.url}#/{page}")
        browser.wait(f"the {page} page", lambda: browser.finds(css))
        if page == "workers":
            browser.wait("the worker", lambda: "worker-1" in browser.text("#workers"))
        if page == "searches":
            browser.wait("the search", lambda: search in browser.text("#searches"))
        browser.shot(page)
    # The search, once its trials have ended: each trial's objective at each rung it reached.
    wait_until("the search to end", lambda: cluster.admin.call(
        "SearchService/GetSearch", {"id": search})["state"] != "SEARCH_RUNNING", timeout=240)
    trials = cluster.admin.call("SearchService/GetSearch", {"id": search})["trials"]
    browser.go(f"{cluster.url}#/search/{search}")
    browser.wait("every trial", lambda: len(browser.finds("#trials tbody tr")) == len(trials))
    browser.wait("the chart", lambda: browser.finds("#search-chart canvas"))
    assert "SUCCEEDED" in browser.text("main"), browser.text("main")
    browser.shot("search")


def run(args, root):
    cluster = Cluster(args.bin_dir, root)
    browser = None
    try:
        admin = cluster.admin
        alice = Api(cluster.url, admin.call("AdminService/CreateToken",
                                            {"name": "alice", "role": "TOKEN_USER"})["secret"])
        bob = Api(cluster.url, admin.call("AdminService/CreateToken",
                                          {"name": "bob", "role": "TOKEN_USER"})["secret"])
        cluster.hold("console-demo", 5)
        cluster.hold("console-events", 1)
        demo = alice.call("JobService/SubmitJob", {"specYaml": job_yaml("console-demo", 100000)})["id"]
        events_job = alice.call("JobService/SubmitJob",
                                {"specYaml": job_yaml("console-events", 100000)})["id"]
        xss_job = alice.call("JobService/SubmitJob", {"specYaml": f"""name: console-xss
program:
  command: [/usr/bin/python3, -c, {json.dumps(f"print({PAYLOAD!r}, flush=True)")}]
"""})["id"]
        bob_job = bob.call("JobService/SubmitJob", {"specYaml": job_yaml("bob-job", 20)})["id"]
        search = alice.call("SearchService/SubmitSearch", {"specYaml": SEARCH})["id"]
        wait_until("console-events to run",
                   lambda: alice.call("JobService/GetJob", {"id": events_job})["state"] == "RUNNING")
        alice.call("JobService/CancelJob", {"id": events_job, "reason": PAYLOAD})
        wait_until("console-demo to run",
                   lambda: alice.call("JobService/GetJob", {"id": demo})["state"] == "RUNNING")

        browser = Browser(args.out)
        check_login_link(cluster, browser)
        browser.driver.execute_script("sessionStorage.clear()")
        check_login_and_jobs(cluster, browser, alice, demo)
        check_job_page(cluster, browser, alice, demo)
        check_text_only(cluster, browser, alice, events_job, xss_job)
        check_users_apart(cluster, browser, bob, demo, bob_job)
        check_other_pages(cluster, browser, search)
        browser.take_console_messages()
        blocked = [m for m in browser.console_messages if "Content Security Policy" in m]
        assert not blocked, "the CSP blocked something:\n" + "\n".join(blocked)
        if args.readme_images:
            os.makedirs(args.readme_images, exist_ok=True)
            for name in ("jobs", "job", "workers", "search"):
                shutil.copy(os.path.join(args.out, f"console-{name}.png"), args.readme_images)
        print(f"browser_test: passed; screenshots in {args.out}")
    finally:
        if browser is not None:
            browser.quit()
        for name in ("console-demo", "console-events"):
            try:
                cluster.release(name)
            except FileNotFoundError:
                pass
        cluster.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--readme-images", default="")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    root = tempfile.mkdtemp(prefix="trainyard-console-")
    try:
        run(args, root)
    except Exception:
        log = os.path.join(root, "state", "logs", "coordinator.log")
        if os.path.exists(log):
            print("--- coordinator log (end) ---\n" + open(log).read()[-4000:], file=sys.stderr)
        raise
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
