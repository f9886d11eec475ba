#!/usr/bin/python3
"""Does the data path show in a rank's step time? The scaling MLP (ddp_scaling.cc's: 256 inputs,
two hidden layers of 1024) trained from uint8 shards through a shuffle window on a local cluster,
on 1 and 2 ranks (data_parallel, one CPU slot each): the trainer's own split of its step time,
sampled from `trainyard describe -o json` every half second after the first 100 steps.

    bench/data_wait.py BUILD_DIR [STEPS] [SAMPLES]
"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import LocalCluster  # noqa: E402

PHASES = ["dataWaitSeconds", "computeSeconds", "communicationSeconds", "checkpointSeconds",
          "validationSeconds"]


def main():
    build = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    samples = int(sys.argv[3]) if len(sys.argv) > 3 else 400000
    shards = tempfile.mkdtemp(prefix="data_wait.")
    subprocess.run([os.path.join(build, "bin", "data_bench"), "--mode=gen", f"--dir={shards}",
                    f"--samples={samples}", "--width=256", "--shards=8"], check=True,
                   stdout=subprocess.DEVNULL)
    print("| ranks | samples/s (rank 0) | data wait | compute | communication | samples of the split |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    with LocalCluster(build, workers=2, slots=1, prefix="data_wait.") as cluster:
        for ranks in (1, 2):
            name = f"wait{ranks}"
            spec = os.path.join(cluster.state, f"{name}.yaml")
            with open(spec, "w") as f:
                f.write(f"""name: {name}
strategy: data_parallel
workers: {ranks}
model:
  builtin: mlp
  args: {{inputs: 256, hidden: [1024, 1024], classes: 10}}
data:
  train: {shards}/train-*.safetensors
  features: x
  labels: y
  feature_scale: 0.00392156862745098
  shuffle_window: {samples // 8}
batch_size: 64
optimizer: {{name: sgd, lr: 0.01}}
max_steps: {steps}
log_every_steps: 100
seed: 1
""")
            submitted = cluster.call("submit", spec)
            if submitted.returncode != 0:
                sys.exit(submitted.stderr)
            job_id = submitted.stdout.split()[0]
            totals = dict.fromkeys(PHASES, 0.0)
            seen, rates = 0, []
            while True:
                job = json.loads(cluster.call("describe", job_id, "-o", "json").stdout)
                progress = job.get("progress", {})
                if job.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    break
                if int(progress.get("step", 0)) > 100:
                    for p in PHASES:
                        totals[p] += float(progress.get(p, 0))
                    rates.append(float(progress.get("samplesPerSecond", 0)))
                    seen += 1
                time.sleep(0.5)
            if job.get("state") != "SUCCEEDED":
                sys.exit(f"{job_id}: {job.get('state')} {job.get('reason')}")
            whole = sum(totals.values()) or 1
            rates.sort()
            print(f"| {ranks} | {rates[len(rates) // 2]:.0f} | "
                  f"{totals['dataWaitSeconds'] / whole:.1%} | "
                  f"{totals['computeSeconds'] / whole:.1%} | "
                  f"{totals['communicationSeconds'] / whole:.1%} | {seen} |")
    subprocess.run(["rm", "-rf", shards])


if __name__ == "__main__":
    main()
