#!/usr/bin/env python3
"""The GPU check's precision item: a TorchScript MLP written by this machine's PyTorch, trained for
25 steps on one GPU by a Trainyard job (through the local cluster the check started) and by the
same loop in PyTorch (tests/integration/reference_train.py: torch.autocast and, for fp16,
torch.amp.GradScaler), at fp32, bf16 and fp16. Prints `figure KEY VALUE` lines and exits 1 when a
precision's per-step losses differ from PyTorch's by more than its tolerance, or when bf16 or
fp16 computed exactly what fp32 did (autocast did not run).

Tolerances: both sides run the same LibTorch kernels, so what differs is how the TorchScript graph
executor groups ops (the trainer runs the default executor, the reference the simple one). The
tolerance is a few units of each format's rounding (2^-8 for bf16, 2^-11 for fp16) on losses of
about 1, left to grow over 25 steps: bf16 2e-2, fp16 5e-3, fp32 1e-4.

usage: precision_parity.py TRAINYARD_CLI WORK_DIR"""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 5e-3}
STEPS = 25


def losses(text):
    return {int(m.group(1)): float(m.group(2))
            for m in re.finditer(r"step=(\d+) (?:total=\d+ )?loss=([0-9.eE+-]+)", text)}


def run(argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout


def main():
    cli, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    model, data = f"{work}/model.pt", f"{work}/data"
    run([sys.executable, f"{ROOT}/examples/write_torchscript_model.py", "--out", model,
         "--inputs", "64", "--hidden", "256", "256", "--classes", "8", "--seed", "5"])
    run([sys.executable, f"{ROOT}/examples/write_dataset.py", "--out-dir", data, "--samples",
         "2560", "--features", "64", "--classes", "8", "--files", "2", "--seed", "9",
         "--trainyard", cli])
    ok = True
    curves = {}
    for precision in ("fp32", "bf16", "fp16"):
        spec = f"""name: parity-{precision}
resources: {{gpus_per_worker: 1}}
model: {{torchscript: {model}}}
data: {{train: "{data}/*.safetensors", shuffle: false}}
batch_size: 32
optimizer: {{name: sgd, lr: 0.05, momentum: 0.9}}
loss: cross_entropy
precision: {precision}
max_steps: {STEPS}
log_every_steps: 1
"""
        path = f"{work}/{precision}.yaml"
        with open(path, "w") as f:
            f.write(spec)
        submitted = subprocess.run([cli, "submit", path, "--wait"], capture_output=True,
                                   text=True, timeout=600)
        job = submitted.stdout.splitlines()[0] if submitted.stdout else ""
        logs = run([cli, "logs", job]) if job else ""
        ours = losses(logs)
        reference = losses(run([sys.executable, f"{ROOT}/tests/integration/reference_train.py",
                                "--model", model, "--data", f"{data}/*.safetensors", "--batch",
                                "32", "--steps", str(STEPS), "--lr", "0.05", "--momentum", "0.9",
                                "--precision", precision, "--device", "cuda"]))
        if submitted.returncode != 0 or len(ours) != STEPS or len(reference) != STEPS:
            print(f"figure {precision}_error job {job or '?'} exit {submitted.returncode}, "
                  f"{len(ours)} of our steps, {len(reference)} reference steps")
            print(submitted.stdout[-2000:], submitted.stderr[-2000:], logs[-3000:], sep="\n")
            ok = False
            continue
        gap = max(abs(ours[s] - reference[s]) for s in reference)
        curves[precision] = reference
        print(f"figure {precision}_max_gap {gap:.3e}")
        print(f"figure {precision}_final_loss ours {ours[STEPS]:.6f} pytorch {reference[STEPS]:.6f}")
        if gap > TOLERANCE[precision]:
            print(f"{precision}: per-step losses differ from PyTorch's by up to {gap:.3e} "
                  f"(tolerance {TOLERANCE[precision]:g})")
            ok = False
    for precision in ("bf16", "fp16"):
        if precision in curves and "fp32" in curves:
            effect = max(abs(curves[precision][s] - curves["fp32"][s]) for s in curves["fp32"])
            print(f"figure {precision}_vs_fp32 {effect:.3e}")
            if effect == 0:
                print(f"{precision}: identical to fp32: autocast did not run")
                ok = False
    print(json.dumps({"ok": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
