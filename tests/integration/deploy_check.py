#!/usr/bin/python3
"""Checks the files in deploy/ with the real tools where this machine has them.

- promtool: check config (both scrape configurations), check rules, test rules;
- kubectl kustomize on deploy/kubernetes, and the structure of what it renders; the same for
  the two-coordinator overlays (deploy/kubernetes-ha, deploy/kubernetes-ha-try-postgres);
- metrics (which name jobs and searches) are protected wherever they are served beyond
  loopback: HTTP basic authentication from a mounted Secret, HTTPS where the pod has TLS
  material, and every scrape configuration presenting the credentials;
- yamllint on deploy/ (a python3-yaml check with duplicate keys, tabs and trailing spaces when
  yamllint is missing);
- the Dockerfile's targets are the ones documented in docs/operations.md;
- the Grafana dashboards and provisioning files are well formed;
- the Slurm agents' sbatch script passes bash -n and shellcheck and keeps its #SBATCH lines.

Usage: deploy_check.py SOURCE_DIR. Exits 0 when everything passes, 1 otherwise.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL:", message)
    return condition


def run(argv, cwd=None):
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    output = result.stdout + result.stderr
    return result.returncode, output


class UniqueKeyLoader(yaml.SafeLoader):
    """A loader that refuses duplicate keys, which plain YAML quietly accepts."""


def _construct_mapping(loader, node, deep=False):
    keys = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in keys:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        keys.add(key)
    return loader.construct_mapping(node, deep)


UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def yaml_files(root):
    for base, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith((".yml", ".yaml")) or name == ".yamllint":
                yield os.path.join(base, name)


def secret_mounts(pod, container):
    """The mount paths of `container` whose volume is a Secret."""
    secrets = {v["name"] for v in pod.get("volumes", []) if "secret" in v}
    return [m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in secrets]


def check_metrics_protected(what, pod, container, tls):
    """A daemon serving /metrics beyond loopback asks scrapes for the password of a mounted
    Secret, over HTTPS when `tls` (the pod has a certificate)."""
    args = dict(a.split("=", 1) for a in container.get("args", []) if "=" in a)
    listen = args.get("--metrics_listen", "127.0.0.1:0")
    if listen == "" or listen.startswith(("127.", "localhost:", "[::1]:")):
        return
    secrets = secret_mounts(pod, container)
    mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
    auth = args.get("--metrics_basic_auth_file", "")
    check(any(auth.startswith(m + "/") for m in secrets),
          f"{what} serves metrics on {listen} without --metrics_basic_auth_file from a mounted "
          f"Secret (got '{auth}'; Secret mounts {secrets})")
    if tls:
        for flag in ["--metrics_tls_cert", "--metrics_tls_key"]:
            check(any(args.get(flag, "").startswith(m + "/") for m in mounts),
                  f"{what} serves metrics on {listen} without {flag} (its TLS certificate is "
                  f"mounted: serve metrics over HTTPS with it)")


def check_scrape_protected(where, job, basic_auth, scheme, https):
    """A scrape configuration presents the metrics credentials, and uses HTTPS when `https`."""
    check(basic_auth and basic_auth.get("username") and
          (basic_auth.get("password_file") or basic_auth.get("password")),
          f"{where}: scrape job {job} presents no basic_auth user and password")
    if https:
        check(scheme == "https", f"{where}: scrape job {job} must use scheme https "
                                 f"(the coordinator serves metrics over TLS), got {scheme}")


def check_prometheus(deploy):
    prom = os.path.join(deploy, "prometheus")
    code, out = run(["promtool", "check", "config", "prometheus.yml"], cwd=prom)
    check(code == 0, f"promtool check config prometheus.yml:\n{out}")

    # Debian builds Prometheus without Kubernetes service discovery, so its promtool does not
    # know kubernetes_sd_configs. Check the file as it is first; if that is the only complaint,
    # check everything else (relabelling, rules) with the discovery swapped for a static target.
    code, out = run(["promtool", "check", "config", "prometheus-kubernetes.yml"], cwd=prom)
    if code != 0 and "field kubernetes_sd_configs not found" in out:
        with open(os.path.join(prom, "prometheus-kubernetes.yml")) as f:
            config = yaml.safe_load(f)
        for scrape in config["scrape_configs"]:
            sd = scrape.pop("kubernetes_sd_configs", None)
            check(sd and sd[0].get("role") == "pod",
                  f"{scrape['job_name']}: expected kubernetes_sd_configs with role pod")
            scrape["static_configs"] = [{"targets": ["127.0.0.1:1"]}]
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(os.path.join(prom, "alerts.yml"), tmp)
            path = os.path.join(tmp, "prometheus-kubernetes.yml")
            with open(path, "w") as f:
                yaml.safe_dump(config, f)
            code, out = run(["promtool", "check", "config", path])
        print("note: this promtool lacks Kubernetes service discovery; checked the rest of "
              "prometheus-kubernetes.yml with a static target in its place")
    check(code == 0, f"promtool check config prometheus-kubernetes.yml:\n{out}")

    for name in ["prometheus.yml", "prometheus-kubernetes.yml"]:
        with open(os.path.join(prom, name)) as f:
            config = yaml.safe_load(f)
        for scrape in config["scrape_configs"]:
            job = scrape["job_name"]
            check_scrape_protected(name, job, scrape.get("basic_auth"), scrape.get("scheme"),
                                   job == "trainyard-coordinator")

    code, out = run(["promtool", "check", "rules", "alerts.yml"], cwd=prom)
    check(code == 0, f"promtool check rules alerts.yml:\n{out}")
    code, out = run(["promtool", "test", "rules", "alerts_test.yml"], cwd=prom)
    check(code == 0, f"promtool test rules alerts_test.yml:\n{out}")

    with open(os.path.join(prom, "alerts.yml")) as f:
        alerts = {r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]}
    for wanted in ["TrainyardJobOverRuntime", "TrainyardJobStalled", "TrainyardJobRestartLoop",
                   "TrainyardWorkerLost", "TrainyardQueueBacklog", "TrainyardCheckpointTooOld",
                   "TrainyardGpusIdle", "TrainyardJobGpuIdle"]:
        check(wanted in alerts, f"alerts.yml has no {wanted}")
    return alerts


def check_kubernetes(deploy):
    kube = os.path.join(deploy, "kubernetes")
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("note: no kubectl here; checking the manifests listed in kustomization.yaml "
              "with python3-yaml only")
        with open(os.path.join(kube, "kustomization.yaml")) as f:
            kustomization = yaml.safe_load(f)
        docs = []
        for name in kustomization["resources"]:
            with open(os.path.join(kube, name)) as f:
                docs += [d for d in yaml.safe_load_all(f) if d]
    else:
        code, out = run([kubectl, "kustomize", kube])
        if not check(code == 0, f"kubectl kustomize {kube}:\n{out}"):
            return
        docs = [d for d in yaml.safe_load_all(out) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    for kind in ["Namespace", "Secret", "Service", "StatefulSet", "DaemonSet", "ServiceMonitor"]:
        check(kind in by_kind, f"kustomize output has no {kind}")
    if not all(k in by_kind for k in ["StatefulSet", "DaemonSet", "Service"]):
        return

    sts = by_kind["StatefulSet"][0]
    pod = sts["spec"]["template"]["spec"]
    coordinator = pod["containers"][0]
    check(sts["spec"]["replicas"] == 1, "the coordinator must have exactly one replica")
    check(sts["spec"].get("volumeClaimTemplates"), "coordinator StatefulSet has no volume")
    for probe in ["readinessProbe", "livenessProbe"]:
        check("grpc" in coordinator.get(probe, {}),
              f"coordinator {probe} is not a gRPC health probe")
    state_dir = next((a.split("=", 1)[1] for a in coordinator["args"]
                      if a.startswith("--state_dir=")), None)
    mounts = [m["mountPath"] for m in coordinator.get("volumeMounts", [])]
    check(state_dir in mounts, f"--state_dir {state_dir} is not on the volume ({mounts})")

    # TLS on the gRPC port from a mounted Secret; probes on the plaintext health port.
    args = dict(a.split("=", 1) for a in coordinator["args"] if "=" in a)
    for flag in ["--tls_cert", "--tls_key"]:
        check(any(args.get(flag, "").startswith(m + "/") for m in mounts),
              f"coordinator {flag} is not a file on a mounted volume")
    health = args.get("--health_listen", "")
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"]:
        port = coordinator.get(probe, {}).get("grpc", {}).get("port")
        check(port is not None and health.endswith(f":{port}"),
              f"coordinator {probe} (port {port}) is not on --health_listen ({health})")

    check_metrics_protected("coordinator", pod, coordinator, tls=True)

    ports = {p["name"] for s in by_kind["Service"] for p in s["spec"]["ports"]}
    check({"grpc", "metrics"} <= ports, f"Services lack grpc or metrics ports: {ports}")

    ds = by_kind["DaemonSet"][0]
    pod = ds["spec"]["template"]["spec"]
    agent = pod["containers"][0]
    check("nvidia.com/gpu" in agent["resources"].get("limits", {}),
          "worker DaemonSet does not ask for nvidia.com/gpu")
    tolerations = {t.get("key") for t in pod.get("tolerations", [])}
    check("nvidia.com/gpu" in tolerations, "worker DaemonSet does not tolerate GPU taints")
    check(any("spot" in (k or "").lower() or "preemptible" in (k or "").lower()
              or "scalesetpriority" in (k or "") or "capacityType" in (k or "")
              for k in tolerations), "worker DaemonSet does not tolerate spot node pools")
    grace = next((a.split("=", 1)[1] for a in agent["args"]
                  if a.startswith("--stop_grace_period=")), "10s")
    grace_s = int(re.fullmatch(r"(\d+)s", grace).group(1))
    check(pod.get("terminationGracePeriodSeconds", 30) > grace_s,
          f"terminationGracePeriodSeconds must be above the agent's grace period {grace}")
    agent_args = dict(a.split("=", 1) for a in agent["args"] if "=" in a)
    agent_mounts = [m["mountPath"] for m in agent.get("volumeMounts", [])]
    for flag in ["--ca_file", "--token_file"]:
        check(any(agent_args.get(flag, "").startswith(m + "/") for m in agent_mounts),
              f"agent {flag} is not a file on a mounted volume")
    for name, container in [("coordinator", coordinator), ("agent", agent)]:
        refs = [e.get("secretRef", {}).get("name") for e in container.get("envFrom", [])]
        check("trainyard-s3" in refs, f"{name} does not take S3 credentials from the Secret")
    # The agents have no certificate of their own: basic authentication only.
    check_metrics_protected("agent", pod, agent, tls=False)
    check(pod.get("securityContext", {}).get("fsGroup") is not None
          or agent.get("securityContext", {}).get("runAsUser") == 0,
          "the agent runs as the image's user 10001: without an fsGroup it cannot read the "
          "Secret files it is given (root's, mode 0400/0440)")
    scraped = set()
    for monitor in by_kind["ServiceMonitor"]:
        name = monitor["metadata"]["name"]
        check(all(e.get("honorLabels") for e in monitor["spec"]["endpoints"]),
              f"ServiceMonitor {name} must honour labels (per-job series carry `job`)")
        selector = monitor["spec"]["selector"]
        apps = set(selector.get("matchLabels", {}).values())
        for e in selector.get("matchExpressions", []):
            apps |= set(e.get("values", []))
        scraped |= apps
        for endpoint in monitor["spec"]["endpoints"]:
            auth = endpoint.get("basicAuth", {})
            check(auth.get("username", {}).get("name") and auth.get("password", {}).get("name"),
                  f"ServiceMonitor {name}: endpoint {endpoint.get('port')} has no basicAuth "
                  f"from a Secret")
            if "trainyard-coordinator" in apps:
                check(endpoint.get("scheme") == "https" and endpoint.get("tlsConfig"),
                      f"ServiceMonitor {name}: the coordinator's metrics are HTTPS "
                      f"(scheme https with a tlsConfig)")
    check({"trainyard-coordinator", "trainyard-worker"} <= scraped,
          f"the ServiceMonitors scrape {sorted(scraped)}, not both the coordinator and agents")


def check_kubernetes_ha(deploy):
    """The two-coordinator overlay: two replicas started together on PostgreSQL, the Service's
    readiness on the leader alone, the standby kept alive."""
    kubectl = shutil.which("kubectl")
    for overlay in ["kubernetes-ha", "kubernetes-ha-try-postgres"]:
        path = os.path.join(deploy, overlay)
        if kubectl is None:
            print(f"note: no kubectl here; {overlay} not rendered")
            return
        code, out = run([kubectl, "kustomize", path])
        if not check(code == 0, f"kubectl kustomize {path}:\n{out}"):
            continue
        docs = [d for d in yaml.safe_load_all(out) if d]
        sts = next(d for d in docs if d["kind"] == "StatefulSet"
                   and d["metadata"]["name"] == "trainyard-coordinator")
        check(sts["spec"]["replicas"] == 2, f"{overlay}: the coordinators are not two")
        check(sts["spec"].get("podManagementPolicy") == "Parallel",
              f"{overlay}: the standby would wait for the leader to be ready")
        coordinator = sts["spec"]["template"]["spec"]["containers"][0]
        args = dict(a.split("=", 1) for a in coordinator["args"] if "=" in a)
        env = {e["name"]: e for e in coordinator.get("env", [])}
        check_metrics_protected(f"{overlay}: coordinator", sts["spec"]["template"]["spec"],
                                coordinator, tls=True)
        check(args.get("--store") == "$(TRAINYARD_STORE)" and "TRAINYARD_STORE" in env,
              f"{overlay}: --store does not come from the Secret")
        check("PGPASSWORD" in env and "secretKeyRef" in env["PGPASSWORD"].get("valueFrom", {}),
              f"{overlay}: the database password does not come from a Secret")
        check("service" not in coordinator["readinessProbe"]["grpc"],
              f"{overlay}: readiness must ask for the whole server (only the leader serves)")
        for probe in ["startupProbe", "livenessProbe"]:
            check(coordinator[probe]["grpc"].get("service") == "liveness",
                  f"{overlay}: {probe} would restart the standby")
        secrets = [d for d in docs if d["kind"] == "Secret"
                   and d["metadata"]["name"] == "trainyard-postgres"]
        check(len(secrets) == 1 and "uri" in secrets[0].get("stringData", {}),
              f"{overlay}: no Secret trainyard-postgres with a uri")
    try_docs = [d for d in yaml.safe_load_all(run([kubectl, "kustomize", os.path.join(
        deploy, "kubernetes-ha-try-postgres")])[1]) if d]
    check(any(d["kind"] == "StatefulSet" and d["metadata"]["name"] == "trainyard-postgres"
              for d in try_docs), "kubernetes-ha-try-postgres has no PostgreSQL")


def check_yaml(deploy):
    files = list(yaml_files(deploy))
    yamllint = shutil.which("yamllint")
    if yamllint is not None:
        code, out = run([yamllint, "--strict", "-c", os.path.join(deploy, ".yamllint"), deploy])
        check(code == 0, f"yamllint:\n{out}")
    else:
        print("note: no yamllint here; checking YAML with python3-yaml")
    for path in files:
        with open(path) as f:
            text = f.read()
        try:
            list(yaml.load_all(text, Loader=UniqueKeyLoader))
        except yaml.YAMLError as e:
            check(False, f"{path}: {e}")
        check("\t" not in text, f"{path}: tab characters")
        check(not re.search(r"[ \t]+$", text, re.M), f"{path}: trailing spaces")


def check_dockerfile(source, deploy):
    with open(os.path.join(deploy, "Dockerfile")) as f:
        text = f.read()
    targets = re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", text, re.M | re.I)
    check("runtime" in targets and "dev" in targets,
          f"Dockerfile targets are {targets}; runtime and dev are documented")
    check(targets and targets[-1] == "runtime",
          "runtime should be the last stage, so that a plain `docker build` gives it")
    with open(os.path.join(source, "docs", "operations.md")) as f:
        docs = f.read()
    for target in re.findall(r"--target\s+(\S+)", docs):
        check(target in targets, f"docs/operations.md builds --target {target}, "
              f"which the Dockerfile lacks ({targets})")
    check("--target runtime" in docs and "--target dev" in docs,
          "docs/operations.md should show how to build both targets")
    cmd = re.search(r"^CMD\s+(\[.*?\])\s*$", text.replace("\\\n", " "), re.M | re.S)
    if check(cmd, "Dockerfile has no CMD in exec form"):
        check_metrics_protected("the Dockerfile's default command", {},
                                {"args": json.loads(cmd.group(1))}, tls=True)


def check_grafana(deploy):
    grafana = os.path.join(deploy, "grafana")
    dashboards = os.path.join(grafana, "dashboards")
    uids = {}
    for name in sorted(os.listdir(dashboards)):
        with open(os.path.join(dashboards, name)) as f:
            board = json.load(f)
        uids[board["uid"]] = board
        ids = [p["id"] for p in board["panels"]]
        check(len(ids) == len(set(ids)), f"{name}: panel ids repeat")
        for p in board["panels"]:
            check(p.get("targets"), f"{name}: panel {p['title']} has no query")
            for t in p.get("targets", []):
                check(t.get("expr"), f"{name}: panel {p['title']} has an empty query")
    check({"trainyard-cluster", "trainyard-job"} <= set(uids), f"dashboards: {sorted(uids)}")
    job = uids.get("trainyard-job")
    if job:
        variables = {v["name"] for v in job["templating"]["list"]}
        check("job" in variables, "the job dashboard has no `job` variable")
        check(all("$job" in t["expr"] for p in job["panels"] for t in p["targets"]),
              "every panel of the job dashboard should select $job")
    for sub in ["datasources", "dashboards"]:
        for path in yaml_files(os.path.join(grafana, "provisioning", sub)):
            with open(path) as f:
                check(yaml.safe_load(f).get("apiVersion") == 1, f"{path}: apiVersion 1")


def check_slurm(deploy):
    """The agents' sbatch script: bash's syntax check and shellcheck, and the #SBATCH lines the
    operations guide counts on."""
    script = os.path.join(deploy, "slurm", "trainyard-agents.sbatch")
    code, out = run(["bash", "-n", script])
    check(code == 0, f"bash -n {script}:\n{out}")
    code, out = run(["shellcheck", script])
    check(code == 0, f"shellcheck {script}:\n{out}")
    with open(script) as f:
        directives = {line.split()[1] for line in f if line.startswith("#SBATCH ")}
    for d in ("--ntasks-per-node=1", "--exclusive", "--signal=TERM@120", "--requeue"):
        check(d in directives, f"{script}: no #SBATCH {d}")


def main():
    source = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TRAINYARD_SOURCE_DIR", ".")
    deploy = os.path.join(source, "deploy")
    check_prometheus(deploy)
    check_kubernetes(deploy)
    check_kubernetes_ha(deploy)
    check_yaml(deploy)
    check_dockerfile(source, deploy)
    check_grafana(deploy)
    check_slurm(deploy)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("deploy/: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
