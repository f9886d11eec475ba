"""The program of bench/program_vs_torchrun.sh: a small GPT-style model trained data-parallel
(Gloo) by its own loop, the same whether torchrun or Trainyard starts it. Rank 0 writes what it
measured as JSON to --out: when its process started, when `import torch` was done, when the
process group was up, when its first step ended (all unix seconds), the steps per second after
--warmup steps, and over those steps the CPU seconds a step of the ranks' processes.

--module uses Trainyard's module at every step (report, should_checkpoint, should_stop: one
socket round trip and one one-integer all-reduce); without it the script knows nothing of
Trainyard.
"""

import argparse
import json
import os
import sys
import time


def process_start():
    """When this process started, in unix seconds: its start in clock ticks after boot
    (/proc/self/stat) against the time since boot now (/proc/uptime)."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


started = process_start()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

imported = time.time()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--module", action="store_true")
    parser.add_argument("--out", required=True)
    parser.add_argument("--submitted", type=float, default=0.0)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    if args.module:
        import trainyard
    dist.init_process_group("gloo")
    grouped = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(
        nn.Linear(args.width, 4 * args.width), nn.GELU(), nn.Linear(4 * args.width, args.width),
        nn.GELU(), nn.Linear(args.width, 16)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    first_step = steady_start = None
    for step in range(1, args.steps + 1):
        g = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(64, args.width, generator=g)
        y = torch.randint(0, 16, (64,), generator=g)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.module:
            trainyard.report(step, loss=loss.item(), total_steps=args.steps)
            if trainyard.should_checkpoint(step):
                trainyard.commit_checkpoint(step)
            if trainyard.should_stop(step):
                break
        else:
            loss.item()  # what the module's report reads; the same in both
        if step == 1:
            first_step = time.time()
        if step == args.warmup:
            steady_start = time.perf_counter()
            steady_cpu = time.process_time()
    steady = (args.steps - args.warmup) / (time.perf_counter() - steady_start)
    # The CPU this rank's process (all its threads) spent a step: unlike steps/s, barely moved
    # by what else the machine runs, so a launcher's cost to the program itself shows in it.
    cpu = (time.process_time() - steady_cpu) / (args.steps - args.warmup)
    # Every rank's start: the job's program has started when its last rank has.
    starts = [None] * world
    dist.all_gather_object(starts, started)
    cpus = [None] * world
    dist.all_gather_object(cpus, cpu)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"submitted": args.submitted, "started": started,
                       "last_started": max(starts), "imported": imported,
                       "grouped": grouped, "first_step": first_step, "steps_per_second": steady,
                       "cpu_seconds_per_step": sum(cpus)},
                      f)
    # Out at once: Gloo's teardown (destroy_process_group, or its threads at exit) now and then
    # waits on a peer that has gone, or aborts.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
