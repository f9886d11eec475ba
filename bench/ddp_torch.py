"""PyTorch's data-parallel scaling on the model and data of ddp_scaling.cc: an MLP
(inputs -> hidden -> hidden -> 10, ReLU), SGD with momentum, the same global batch on 1 process
(no DDP) and on 2 processes (DistributedDataParallel, Gloo, default 25 MiB buckets), one thread
and one CPU each.

  python3 ddp_torch.py WORLD [STEPS BATCH INPUTS HIDDEN]

Prints {"world": W, "samples_per_second": S} measured by rank 0 after 40 warm-up steps.
"""
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def run(rank, world, steps, batch, inputs, hidden, store_path, out):
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
    warmup = 40
    start = None
    for step in range(steps):
        if step == warmup:
            start = time.perf_counter()
        i = (step * batch + rank * per_rank) % (8192 - batch)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i:i + per_rank]), y[i:i + per_rank])
        loss.backward()
        opt.step()
    elapsed = time.perf_counter() - start
    if rank == 0:
        out.put((steps - warmup) * batch / elapsed)
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
        rate = out.get()
        for p in procs:
            p.join()
    print(json.dumps({"world": world, "samples_per_second": round(rate, 1)}), flush=True)


if __name__ == "__main__":
    main()
