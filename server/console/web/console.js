// The Trainyard console: one page, its views drawn from the JSON API (/api/v1/SERVICE/METHOD).
//
// Every string that comes from the API (names, reasons, log lines, spec values) reaches the page
// through text nodes (el() below), never as HTML. The token lives in this tab's sessionStorage and
// travels only in the Authorization header.
"use strict";

const TOKEN_KEY = "trainyard.token";
const FINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const JOB_STATES = ["PENDING", "SCHEDULED", "RUNNING", "RESTARTING", "SUCCEEDED", "FAILED",
                    "CANCELLED"];
const PAGE_SIZE = 50;
const POLL_MS = 2000;

// ---- Elements, as text only -------------------------------------------------------------------

// el("td", {class: "num"}, "text", child, ...): an element whose string children are text nodes.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function table(headers, rows) {
  return el("table", {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {class: h.num ? "num" : null},
                                                        h.label || h)))),
    el("tbody", {}, rows));
}

function stateBadge(state) {
  return el("span", {class: `state state-${state}`},
            String(state).replace(/^(TRIAL|SEARCH|TASK)_/, ""));
}

const num = (v) => Number(v || 0);

function fmtTime(ms) {
  ms = num(ms);
  return ms ? new Date(ms).toLocaleString() : "";
}

function fmtAge(ms) {
  ms = num(ms);
  if (!ms) return "";
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return `${Math.floor(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

function fmtDuration(seconds) {
  if (!isFinite(seconds) || seconds < 0) return "";
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function fmtBytes(b) {
  b = num(b);
  if (!b) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return `${b.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function progressBar(step, total) {
  const fraction = total > 0 ? Math.min(1, step / total) : 0;
  const fill = el("span", {});
  fill.style.width = `${(fraction * 100).toFixed(1)}%`;
  return el("span", {class: "bar", title: `${step} of ${total}`}, fill);
}

// ---- The API ----------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = {"Content-Type": "application/json"};
  if (token) headers.Authorization = `Bearer ${token}`;
  return headers;
}

async function errorOf(response) {
  let code = "UNKNOWN";
  let message = `HTTP ${response.status}`;
  try {
    const body = await response.json();
    code = body.code || code;
    message = body.message || message;
  } catch (e) { /* not JSON */ }
  if (response.status === 401 && !current.login) {
    sessionStorage.removeItem(TOKEN_KEY);
    location.hash = "#/login";
  }
  return new ApiError(response.status, code, message);
}

async function api(method, body, signal) {
  const response = await fetch(`/api/v1/${method}`, {
    method: "POST", headers: authHeaders(), body: JSON.stringify(body || {}), signal});
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

// Calls a streaming method: each message to onMessage until the stream ends or `signal` aborts.
async function stream(method, body, onMessage, signal) {
  const response = await fetch(`/api/v1/${method}`, {
    method: "POST", headers: authHeaders(), body: JSON.stringify(body || {}), signal});
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let pending = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    pending += decoder.decode(value, {stream: true});
    let newline;
    while ((newline = pending.indexOf("\n")) >= 0) {
      const line = pending.slice(0, newline);
      pending = pending.slice(newline + 1);
      if (!line.trim()) continue;  // the server's heartbeat
      const message = JSON.parse(line);
      if (message.error) throw new ApiError(500, message.error.code, message.error.message);
      onMessage(message);
    }
  }
}

function showBanner(text) {
  const banner = document.getElementById("banner");
  banner.textContent = text || "";
  banner.hidden = !text;
}

// ---- Views ------------------------------------------------------------------------------------

// The view now shown: its teardown stops its polls and streams.
let current = {stop() {}};

// Repeats `work` every POLL_MS while the tab is visible, until stopped.
function poller(work) {
  let timer = null;
  let stopped = false;
  const run = async () => {
    if (stopped) return;
    if (!document.hidden) {
      try {
        await work();
        showBanner("");
      } catch (e) {
        if (e.name !== "AbortError") showBanner(e.message);
      }
    }
    if (!stopped) timer = setTimeout(run, POLL_MS);
  };
  run();
  return () => { stopped = true; clearTimeout(timer); };
}

function setMain(...children) {
  const main = document.getElementById("main");
  main.replaceChildren(...children);
  return main;
}

function confirmDialog(text, yes, no) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-yes").textContent = yes;
  document.getElementById("confirm-no").textContent = no;
  return new Promise((resolve) => {
    const done = (answer) => () => { dialog.close(); resolve(answer); };
    document.getElementById("confirm-yes").onclick = done(true);
    document.getElementById("confirm-no").onclick = done(false);
    dialog.oncancel = done(false);
    dialog.showModal();
  });
}

function loginView(params) {
  const input = el("input", {type: "password", id: "token", autocomplete: "off",
                             placeholder: "a token from trainyard token create"});
  const error = el("p", {class: "error", id: "login-error"});
  const form = el("form", {class: "login", id: "login"},
    el("h1", {}, "Log in to Trainyard"),
    el("p", {class: "muted"}, "Paste your API token, or open a link that ",
       el("code", {}, "trainyard console"), " prints (each logs in once)."),
    input, el("button", {type: "submit", id: "login-button"}, "Log in"), error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    try {
      await api("JobService/ListJobs", {pageSize: 1});
      location.hash = params.get("next") || "#/jobs";
    } catch (e) {
      sessionStorage.removeItem(TOKEN_KEY);
      error.textContent = e.status === 401 ? "That token is not valid." : e.message;
    }
  });
  setMain(form);
  input.focus();
  return {login: true, stop() {}};
}

function jobsView(params) {
  const filters = {
    state: el("select", {id: "filter-state"}, el("option", {value: ""}, "every state"),
              JOB_STATES.map((s) => el("option", {value: s}, s))),
    name: el("input", {id: "filter-name", placeholder: "name contains"}),
    owner: el("input", {id: "filter-owner", placeholder: "owner"}),
    queue: el("input", {id: "filter-queue", placeholder: "queue"}),
  };
  filters.state.value = params.get("state") || "";
  filters.name.value = params.get("name") || "";
  filters.owner.value = params.get("owner") || "";
  filters.queue.value = params.get("queue") || "";
  const body = el("div", {id: "jobs"});
  const pageInfo = el("span", {class: "muted"});
  const prev = el("button", {type: "button", id: "prev"}, "Newer");
  const next = el("button", {type: "button", id: "next"}, "Older");
  const tokens = [""];  // the page tokens of the pages seen, newest first
  let page = 0;
  let nextToken = "";
  const apply = () => {
    const q = new URLSearchParams();
    for (const [k, input] of Object.entries(filters)) if (input.value) q.set(k, input.value);
    location.hash = `#/jobs?${q}`;
  };
  for (const input of Object.values(filters)) input.addEventListener("change", apply);
  const load = async () => {
    const request = {pageSize: PAGE_SIZE, pageToken: tokens[page],
                     nameContains: filters.name.value, owner: filters.owner.value,
                     queue: filters.queue.value};
    if (filters.state.value) request.states = [filters.state.value];
    const list = await api("JobService/ListJobs", request);
    nextToken = list.nextPageToken || "";
    prev.disabled = page === 0;
    next.disabled = !nextToken;
    pageInfo.textContent = `page ${page + 1}`;
    body.replaceChildren(table(
      ["Job", "Name", "State", "Progress", {label: "Step", num: true}, "Queue", "Owner", "Age",
       {label: "Restarts", num: true}],
      (list.jobs || []).map((job) => {
        const step = num(job.progress && job.progress.step);
        const total = num(job.progress && job.progress.totalSteps) ||
                      num(job.spec && job.spec.maxSteps);
        return el("tr", {"data-job": job.id},
          el("td", {}, el("a", {href: `#/job/${encodeURIComponent(job.id)}`}, job.id)),
          el("td", {}, job.name), el("td", {}, stateBadge(job.state)),
          el("td", {}, progressBar(step, total)), el("td", {class: "num"}, `${step} / ${total}`),
          el("td", {}, (job.spec && job.spec.queue) || "default"), el("td", {}, job.owner),
          el("td", {title: fmtTime(job.createdUnixMs)}, fmtAge(job.createdUnixMs)),
          el("td", {class: "num"}, (job.restarts || []).length));
      })));
    if (!(list.jobs || []).length) body.append(el("p", {class: "muted"}, "No jobs."));
  };
  prev.addEventListener("click", () => { if (page > 0) { page--; load(); } });
  next.addEventListener("click", () => {
    if (!nextToken) return;
    tokens[page + 1] = nextToken;
    page++;
    load();
  });
  setMain(el("h1", {}, "Jobs"),
          el("div", {class: "filters"}, filters.state, filters.name, filters.owner, filters.queue),
          body, el("div", {class: "pager"}, prev, next, pageInfo));
  return {stop: poller(load)};
}

// ---- Charts -----------------------------------------------------------------------------------

// The series a job's history is drawn as: [title, [[label, value-of-progress], ...]].
// (A metric history's points leave out fields at their defaults: an absent time is 0 s, an
// absent loss or rate is not drawn.)
const CHARTS = [
  ["Loss", [["loss", (p) => p.loss ?? null],
            ["validation loss", (p) => (p.hasValLoss ? p.valLoss ?? 0 : null)]]],
  ["Validation accuracy", [["accuracy", (p) => (p.hasValAccuracy ? p.valAccuracy ?? 0 : null)]]],
  ["Samples/s", [["samples/s", (p) => p.samplesPerSecond ?? null]]],
  ["Step time (s)", [["data wait", (p) => p.dataWaitSeconds || 0],
                     ["compute", (p) => p.computeSeconds || 0],
                     ["communication", (p) => p.communicationSeconds || 0],
                     ["checkpoint", (p) => p.checkpointSeconds || 0]]],
];
const COLORS = ["#2f6fde", "#d9822b", "#2a8a4a", "#b63f9a", "#6b7385"];

// An axis's numbers, short: 1.2M, 350k, 0.0042.
function fmtAxis(v) {
  if (v === null || v === undefined) return "";
  const a = Math.abs(v);
  if (a >= 1e6) return `${+(v / 1e6).toPrecision(3)}M`;
  if (a >= 1e4) return `${+(v / 1e3).toPrecision(3)}k`;
  if (a === 0) return "0";
  return String(+v.toPrecision(3));
}
const AXES = [{}, {size: 64, values: (u, values) => values.map(fmtAxis)}];

class JobCharts {
  constructor(container, xAxis) {
    this.container = container;
    this.xAxis = xAxis;  // "step" or "time"
    this.points = [];
    this.custom = new Set();
    this.plots = [];
  }

  add(points) {
    for (const p of points) {
      this.points.push(p);
      p.progress = p.progress || {};
      for (const name of Object.keys(p.progress.metrics || {})) this.custom.add(name);
    }
  }

  // The charts that have something to show.
  specs() {
    const specs = CHARTS.slice();
    if (this.custom.size) {
      specs.push(["The program's figures", [...this.custom].sort().map(
        (name) => [name, (p) => (p.metrics && name in p.metrics ? p.metrics[name] : null)])]);
    }
    return specs.filter(([, series]) => series.some(([, f]) => this.points.some((p) => {
      const v = f(p.progress);
      return v !== null && v !== undefined;
    })));
  }

  data(series) {
    const byStep = this.xAxis === "step";
    const rows = this.points.map((p) => ({
      x: byStep ? num(p.progress && p.progress.step) : num(p.unixMs) / 1000, p: p.progress || {}}));
    if (byStep) rows.sort((a, b) => a.x - b.x);
    return [rows.map((r) => r.x), ...series.map(([, f]) => rows.map((r) => {
      const v = f(r.p);
      return v === null || v === undefined ? null : Number(v);
    }))];
  }

  draw() {
    this.container.dataset.points = String(this.points.length);  // what a test can read
    if (!this.points.length) {
      if (!this.container.childElementCount) {
        this.container.append(el("p", {class: "muted"}, "No progress reported yet."));
      }
      return;
    }
    const specs = this.specs();
    if (this.plots.length !== specs.length) {
      for (const plot of this.plots) plot.destroy();
      this.container.replaceChildren();
      this.plots = specs.map(([title, series]) => {
        const box = el("div", {class: "chart", "data-chart": title}, el("h3", {}, title));
        this.container.append(box);
        return new uPlot({
          width: 440, height: 220,
          scales: {x: {time: this.xAxis === "time"}},
          series: [{label: this.xAxis}, ...series.map(([label], i) => ({
            label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true}))],
          axes: AXES,
        }, this.data(series), box);
      });
      return;
    }
    specs.forEach(([, series], i) => this.plots[i].setData(this.data(series)));
  }

  destroy() {
    for (const plot of this.plots) plot.destroy();
  }
}

// ---- One job ----------------------------------------------------------------------------------

function facts(pairs) {
  return el("div", {class: "facts"},
            pairs.filter(([, v]) => v !== "" && v !== undefined).map(
              ([k, v]) => el("div", {}, el("b", {}, k), v)));
}

function jobFacts(job, rate) {
  const p = job.progress || {};
  const step = num(p.step);
  const total = num(p.totalSteps) || num(job.spec && job.spec.maxSteps);
  let eta = "";
  if (rate > 0 && total > step && !FINAL.has(job.state)) eta = fmtDuration((total - step) / rate);
  return facts([
    ["State", stateBadge(job.state)], ["Step", `${step} of ${total}`],
    ["ETA", eta], ["Samples/s", p.samplesPerSecond ? Number(p.samplesPerSecond).toFixed(1) : ""],
    ["Owner", job.owner], ["Queue", (job.spec && job.spec.queue) || "default"],
    ["Submitted", fmtTime(job.createdUnixMs)], ["Attempt", job.generation],
    ["Reason", job.reason || ""], ["Committed step", num(job.committedStep) >= 0 ? job.committedStep : ""],
  ]);
}

function eventsTable(job) {
  return table(["Time", "From", "To", "Reason"], (job.events || []).slice().reverse().map((e) =>
    el("tr", {}, el("td", {}, fmtTime(e.timeUnixMs)), el("td", {}, e.from), el("td", {}, e.to),
       el("td", {class: "event-reason"}, e.reason))));
}

function restartsTable(job) {
  return table(["Attempt", "Reason", "Message", {label: "Steps lost", num: true},
                {label: "Recovery (s)", num: true}, "Split (detect / schedule / start / meet / load / first step)"],
    (job.restarts || []).map((r) => el("tr", {},
      el("td", {}, r.generation), el("td", {}, r.reason), el("td", {}, r.message),
      el("td", {class: "num"}, r.stepsLostUnknown ? "unknown" : r.stepsLost),
      el("td", {class: "num"}, r.recovered ? Number(r.recoverySeconds).toFixed(1) : "recovering"),
      el("td", {}, [r.detectionSeconds, r.schedulingSeconds, r.startSeconds, r.rendezvousSeconds,
                    r.checkpointLoadSeconds, r.firstStepSeconds].map(
        (s) => Number(s || 0).toFixed(1)).join(" / ")))));
}

function tasksTable(job) {
  return table(["Task", "Rank", "Worker", "State", {label: "Memory peak", num: true}, "Exit"],
    (job.tasks || []).slice().reverse().map((t) => el("tr", {},
      el("td", {}, t.taskId), el("td", {}, t.role === "TASK_ROLE_SHARD" ? `shard ${t.shard}` : t.rank),
      el("td", {}, t.workerId), el("td", {}, stateBadge(t.state)),
      el("td", {class: "num"}, fmtBytes(t.memoryPeakBytes)),
      el("td", {}, t.outOfMemory ? "out of memory" : t.signal ? `signal ${t.signal}` :
                   t.state === "TASK_EXITED" ? `exit ${t.exitCode}` : "", t.message ? ` ${t.message}` : ""))));
}

// Follows one rank's log (-1: every rank) into `pre`, until aborted.
function followLogs(jobId, rank, pre, signal) {
  pre.replaceChildren();
  stream("JobService/GetJobLogs", {id: jobId, rank, follow: true}, (chunk) => {
    const text = atob(chunk.data || "");
    const bytes = Uint8Array.from(text, (c) => c.charCodeAt(0));
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(document.createTextNode(new TextDecoder().decode(bytes)));
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }, signal).catch((e) => {
    if (e.name !== "AbortError") pre.append(document.createTextNode(`\n[${e.message}]\n`));
  });
}

function jobView(id) {
  const abort = new AbortController();
  const head = el("div", {id: "job-facts"});
  const chartBox = el("div", {class: "charts", id: "charts"});
  const xAxis = el("select", {id: "x-axis"}, el("option", {value: "step"}, "against step"),
                   el("option", {value: "time"}, "against time"));
  let charts = new JobCharts(chartBox, "step");
  xAxis.addEventListener("change", () => {
    const points = charts.points;
    charts.destroy();
    charts = new JobCharts(chartBox, xAxis.value);
    charts.add(points);
    charts.draw();
  });
  const cancel = el("button", {type: "button", id: "cancel", class: "danger", disabled: true},
                    "Cancel");
  const resume = el("button", {type: "button", id: "resume", disabled: true},
                    "Resume from this job");
  const sections = {events: el("div", {}), restarts: el("div", {}), tasks: el("div", {}),
                    checkpoints: el("div", {}), spec: el("pre", {class: "spec", id: "spec"})};
  const rankSelect = el("select", {id: "log-rank"}, el("option", {value: "-1"}, "every rank"));
  const log = el("pre", {class: "log", id: "log"});
  let logAbort = new AbortController();
  let job = null;
  let lastMs = 0;
  let ranks = 0;
  cancel.addEventListener("click", async () => {
    if (!(await confirmDialog(`Cancel job ${id}? Its ranks stop; committed checkpoints stay.`,
                              "Cancel job", "Keep it running"))) return;
    try {
      await api("JobService/CancelJob", {id, reason: "cancelled from the console"});
    } catch (e) { showBanner(e.message); }
  });
  resume.addEventListener("click", async () => {
    try {
      const submitted = await api("JobService/SubmitJob", {spec: job.spec, resumeFrom: id});
      location.hash = `#/job/${encodeURIComponent(submitted.id)}`;
    } catch (e) { showBanner(e.message); }
  });
  rankSelect.addEventListener("change", () => {
    logAbort.abort();
    logAbort = new AbortController();
    followLogs(id, Number(rankSelect.value), log, logAbort.signal);
  });
  setMain(el("h1", {}, "Job ", el("span", {id: "job-id"}, id)), el("div", {class: "actions"}, cancel, resume),
          head, el("h2", {}, "Charts ", xAxis), chartBox,
          el("h2", {}, "Logs ", rankSelect), log,
          el("h2", {}, "Events"), sections.events, el("h2", {}, "Restarts"), sections.restarts,
          el("h2", {}, "Tasks"), sections.tasks, el("h2", {}, "Checkpoints"), sections.checkpoints,
          el("h2", {}, "Spec as submitted"), sections.spec);
  followLogs(id, -1, log, logAbort.signal);
  let checkpointsAt = -2;
  const load = async () => {
    if (job && FINAL.has(job.state) && lastMs && charts.plots.length) return;  // nothing changes
    job = await api("JobService/GetJob", {id}, abort.signal);
    const history = await api("JobService/GetJobMetrics", {id, afterUnixMs: String(lastMs)},
                              abort.signal);
    const points = history.points || [];
    if (points.length) lastMs = num(points[points.length - 1].unixMs);
    charts.add(points);
    charts.draw();
    const recent = charts.points.slice(-20);
    let rate = 0;
    if (recent.length > 1) {
      const a = recent[0];
      const b = recent[recent.length - 1];
      const seconds = (num(b.unixMs) - num(a.unixMs)) / 1000;
      if (seconds > 0) rate = (num(b.progress.step) - num(a.progress.step)) / seconds;
    }
    head.replaceChildren(jobFacts(job, rate));
    cancel.disabled = FINAL.has(job.state);
    resume.disabled = !FINAL.has(job.state);
    sections.events.replaceChildren(eventsTable(job));
    sections.restarts.replaceChildren(job.restarts && job.restarts.length ? restartsTable(job) :
                                      el("p", {class: "muted"}, "No restarts."));
    sections.tasks.replaceChildren(tasksTable(job));
    const world = num(job.spec && job.spec.workers && job.spec.workers.max) || 1;
    for (; ranks < world; ranks++) rankSelect.append(el("option", {value: ranks}, `rank ${ranks}`));
    if (!sections.spec.textContent) sections.spec.textContent = JSON.stringify(job.spec, null, 2);
    if (num(job.committedStep) !== checkpointsAt) {
      checkpointsAt = num(job.committedStep);
      const list = await api("JobService/ListCheckpoints", {jobId: id}, abort.signal);
      sections.checkpoints.replaceChildren(table(
        [{label: "Step", num: true}, "Attempt", {label: "Size", num: true}, "Written", "URI"],
        (list.checkpoints || []).map((c) => el("tr", {},
          el("td", {class: "num"}, c.step), el("td", {}, c.generation),
          el("td", {class: "num"}, fmtBytes(c.sizeBytes)), el("td", {}, fmtTime(c.createdUnixMs)),
          el("td", {}, c.uri)))));
    }
  };
  const stopPoll = poller(load);
  return {stop() { stopPoll(); abort.abort(); logAbort.abort(); charts.destroy(); }};
}

// ---- Workers, queues, searches ----------------------------------------------------------------

function workersView() {
  const body = el("div", {id: "workers"});
  setMain(el("h1", {}, "Workers"), body);
  return {stop: poller(async () => {
    const list = await api("JobService/ListWorkers", {});
    body.replaceChildren(table(
      ["Worker", "State", {label: "Slots used", num: true}, {label: "GPUs used", num: true},
       {label: "Memory", num: true}, "LibTorch", "Tasks", "Last lease"],
      (list.workers || []).map((w) => el("tr", {},
        el("td", {title: w.address}, w.id), el("td", {title: w.stateReason}, stateBadge(w.state)),
        el("td", {class: "num"}, `${num(w.slotsUsed)} / ${num(w.slots)}`),
        el("td", {class: "num"}, `${num(w.gpusUsed)} / ${num(w.gpus)}`),
        el("td", {class: "num"}, `${fmtBytes(w.memoryUsedBytes) || 0} / ${fmtBytes(w.memoryBytes)}`),
        el("td", {}, w.libtorchVersion), el("td", {}, (w.taskIds || []).join(", ")),
        el("td", {}, fmtAge(w.lastSeenUnixMs) ? `${fmtAge(w.lastSeenUnixMs)} ago` : "")))));
  })};
}

function queuesView() {
  const body = el("div", {id: "queues"});
  const pending = el("div", {id: "pending"});
  setMain(el("h1", {}, "Queues"), body, el("h2", {}, "Pending jobs, in order"), pending);
  const limit = (v) => (num(v) < 0 ? "∞" : num(v));
  return {stop: poller(async () => {
    const list = await api("JobService/ListQueues", {});
    body.replaceChildren(table(
      ["Queue", {label: "Quota (slots / GPUs)", num: true}, {label: "Used", num: true},
       {label: "Borrowed", num: true}, {label: "Weight", num: true}, {label: "Pending", num: true},
       {label: "Running", num: true}],
      (list.queues || []).map((q) => {
        const s = q.status || {};
        return el("tr", {}, el("td", {}, q.name),
          el("td", {class: "num"}, `${limit(s.quotaSlots)} / ${limit(s.quotaGpus)}`),
          el("td", {class: "num"}, `${num(s.usedSlots)} / ${num(s.usedGpus)}`),
          el("td", {class: "num"}, `${num(s.borrowedSlots)} / ${num(s.borrowedGpus)}`),
          el("td", {class: "num"}, q.weight || 1), el("td", {class: "num"}, num(s.pendingJobs)),
          el("td", {class: "num"}, num(s.runningJobs)));
      })));
    const jobs = await api("JobService/ListJobs", {states: ["PENDING"], pageSize: 200});
    const waiting = (jobs.jobs || []).slice().sort((a, b) => num(a.position) - num(b.position));
    pending.replaceChildren(table(
      [{label: "Place", num: true}, "Job", "Queue", "Priority", "Waits because", "Estimated start"],
      waiting.map((j) => el("tr", {}, el("td", {class: "num"}, num(j.position) || ""),
        el("td", {}, el("a", {href: `#/job/${encodeURIComponent(j.id)}`}, j.id)),
        el("td", {}, (j.spec && j.spec.queue) || "default"), el("td", {}, num(j.spec && j.spec.priority)),
        el("td", {}, j.reason), el("td", {}, fmtTime(j.estimatedStartUnixMs))))));
  })};
}

function searchesView() {
  const body = el("div", {id: "searches"});
  setMain(el("h1", {}, "Searches"), body);
  return {stop: poller(async () => {
    const list = await api("SearchService/ListSearches", {});
    body.replaceChildren(table(["Search", "Name", "State", "Trials", "Best", "Owner", "Age"],
      (list.searches || []).map((s) => el("tr", {},
        el("td", {}, el("a", {href: `#/search/${encodeURIComponent(s.id)}`}, s.id)),
        el("td", {}, s.name), el("td", {}, stateBadge(s.state)),
        el("td", {}, `${num(s.trialsCreated)} (${num(s.trialsRunning)} running)`),
        el("td", {}, s.bestTrial >= 0 && s.trialsCreated ? `trial ${s.bestTrial}: ${s.bestMetric}` : ""),
        el("td", {}, s.owner), el("td", {}, fmtAge(s.createdUnixMs))))));
  })};
}

// The step each ASHA rung ends at (as the coordinator computes it).
function rungEnds(searcher) {
  const rungs = Math.max(1, num(searcher.maxRungs));
  const divisor = Math.max(2, num(searcher.divisor));
  let first = num(searcher.maxLength);
  for (let k = 1; k < rungs; k++) first = Math.floor(first / divisor);
  const ends = [];
  let step = Math.max(1, first);
  for (let k = 0; k + 1 < rungs; k++, step *= divisor) ends.push(step);
  ends.push(num(searcher.maxLength));
  return ends;
}

function searchView(id) {
  const head = el("div", {});
  const chartBox = el("div", {class: "chart", id: "search-chart"});
  const trials = el("div", {id: "trials"});
  let plot = null;
  setMain(el("h1", {}, "Search ", id), head, el("h2", {}, "Objective of each trial at each rung"),
          chartBox, el("h2", {}, "Trials"), trials);
  const stop = poller(async () => {
    const s = await api("SearchService/GetSearch", {id});
    const searcher = (s.spec && s.spec.searcher) || {};
    head.replaceChildren(facts([["State", stateBadge(s.state)], ["Searcher", searcher.name],
      ["Metric", `${searcher.metric} (${searcher.smallerIsBetter ? "smaller" : "larger"} is better)`],
      ["Best", s.trialsCreated ? `trial ${s.bestTrial}: ${s.bestMetric}` : ""], ["Owner", s.owner],
      ["Reason", s.reason]]));
    const list = s.trials || [];
    const ends = searcher.name === "asha" ? rungEnds(searcher) : [num(searcher.maxLength)];
    const xs = ends.slice();
    const data = [xs, ...list.map((t) => xs.map((_, r) =>
      (t.rungMetrics && r < t.rungMetrics.length ? Number(t.rungMetrics[r]) : null)))];
    if (plot && plot.series.length !== list.length + 1) { plot.destroy(); plot = null; }
    if (!plot) {
      chartBox.replaceChildren();
      plot = new uPlot({width: 720, height: 280, scales: {x: {time: false}},
        series: [{label: "step"}, ...list.map((t, i) => ({label: `trial ${t.number}`,
          stroke: COLORS[i % COLORS.length], width: 1.5, points: {show: true, size: 6}}))],
        axes: AXES}, data, chartBox);
    } else {
      plot.setData(data);
    }
    trials.replaceChildren(table(["Trial", "State", "Hyperparameters", "Rung",
                                  {label: "Objective", num: true}, "Job", "Message"],
      list.map((t) => el("tr", {}, el("td", {}, t.number), el("td", {}, stateBadge(t.state)),
        el("td", {}, Object.entries(t.hyperparameters || {}).map(([k, v]) => `${k}=${v}`).join(", ")),
        el("td", {}, t.rung), el("td", {class: "num"}, t.hasMetric ? t.metric : ""),
        el("td", {}, t.jobId ? el("a", {href: `#/job/${encodeURIComponent(t.jobId)}`}, t.jobId) : ""),
        el("td", {}, t.message)))));
  });
  return {stop() { stop(); if (plot) plot.destroy(); }};
}

// ---- Routing ----------------------------------------------------------------------------------

// A login link (#login=CODE, from `trainyard console`) logs this tab in once: the code is traded
// for a token of the person it was made for, which expires; the code leaves the address bar and
// the history at once (browsers never send what follows # to a server).
async function redeem(code) {
  history.replaceState(null, "", `${location.pathname}#/login`);
  current = {login: true, stop() {}};
  try {
    const session = await api("JobService/RedeemConsoleLogin", {code});
    sessionStorage.setItem(TOKEN_KEY, session.token);
    history.replaceState(null, "", `${location.pathname}#/jobs`);
    route();
  } catch (e) {
    route();
    const error = document.getElementById("login-error");
    if (error) error.textContent = e.message;
    else showBanner(e.message);
  }
}

function route() {
  current.stop();
  showBanner("");
  const hash = location.hash || "#/jobs";
  if (hash.startsWith("#login=")) {
    redeem(decodeURIComponent(hash.slice(7)));
    return;
  }
  const [path, query] = hash.slice(1).split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const loggedIn = Boolean(sessionStorage.getItem(TOKEN_KEY));
  document.getElementById("logout").hidden = !loggedIn;
  for (const a of document.querySelectorAll("#nav a")) {
    const page = parts[0] === "job" ? "jobs" : parts[0] === "search" ? "searches" : parts[0];
    a.classList.toggle("current", a.dataset.page === (page || "jobs"));
  }
  if (!loggedIn || parts[0] === "login") {
    current = loginView(params);
    return;
  }
  const views = {
    jobs: () => jobsView(params), job: () => jobView(parts[1]), workers: workersView,
    queues: queuesView, searches: searchesView, search: () => searchView(parts[1]),
  };
  current = (views[parts[0]] || views.jobs)();
}

document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  location.hash = "#/login";
});
window.addEventListener("hashchange", route);
route();
