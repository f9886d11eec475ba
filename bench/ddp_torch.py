"""PyTorch's data-parallel scaling on the model and data of ddp_scaling.cc: an MLP
(inputs -> hidden -> hidden -> 10, ReLU), SGD with momentum, the same global batch on 1 process
(no DDP) and on 2 processes (DistributedDataParallel, Gloo, default 25 MiB buckets), one thread
and one CPU each.

  python3 ddp_torch.py WORLD [STEPS BATCH INPUTS HIDDEN]

Prints {"world": W, "samples_per_second": S, "cpu_per_wall": C}: S is rank 0's median rate over
20-step windows after the first two (as ddp_scaling.cc reads the trainer's progress lines), C is
rank 0's CPU time over its wall time (about 1 when it keeps to its one core).
"""
import os

# Before torch loads: OpenBLAS sizes its thread pool when it is loaded, from OMP_NUM_THREADS
# (else from the CPUs it may use), and torch.set_num_threads() does not change it. Without this
# a rank would multiply matrices on a second core, which the trainer (started with
# OMP_NUM_THREADS=1 by ddp_scaling.cc) does not do.
os.environ["OMP_NUM_THREADS"] = "1"

import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402

WINDOW = 20  # the trainer's log_every_steps in ddp_scaling.cc


def run(rank, world, steps, batch, inputs, hidden, store_path, out):
    began, cpu_began = time.perf_counter(), time.process_time()
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                          nn.ReLU(), nn.Linear(hidden, 10))
    if world > 1:
        store = dist.FileStore(store_path, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    per_rank = batch // world
    x = torch.randn(8192, inputs)
    y = torch.randint(0, 10, (8192,))
    rates = []
    window_start = time.perf_counter()
    for step in range(steps):
        i = (step * batch + rank * per_rank) % (8192 - batch)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i:i + per_rank]), y[i:i + per_rank])
        loss.backward()
        opt.step()
        if (step + 1) % WINDOW == 0:
            now = time.perf_counter()
            rates.append(WINDOW * batch / (now - window_start))
            window_start = now
    if rank == 0:
        steady = sorted(rates[2:])
        cpu = time.process_time() - cpu_began  # all threads of the process
        out.put((steady[len(steady) // 2], cpu / (time.perf_counter() - began)))
    if world > 1:
        dist.destroy_process_group()


def main():
    world = int(sys.argv[1])
    defaults = [200, 64, 256, 1024]
    given = [int(a) for a in sys.argv[2:6]]
    steps, batch, inputs, hidden = given + defaults[len(given):]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        procs = [ctx.Process(target=run, args=(r, world, steps, batch, inputs, hidden, store, out))
                 for r in range(world)]
        for p in procs:
            p.start()
        rate, cpu_per_wall = out.get()
        for p in procs:
            p.join()
    print(json.dumps({"world": world, "samples_per_second": round(rate, 1),
                      "cpu_per_wall": round(cpu_per_wall, 2)}), flush=True)


if __name__ == "__main__":
    main()
