"""All-reduce bus bandwidth of torch.distributed with the Gloo backend, one process per rank.

Same sizes, iteration choice and output as allreduce_bench.cc:
  python3 allreduce_torch.py RANK WORLD DIR [MIN_BYTES MAX_BYTES SECONDS_PER_SIZE]
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    rank, world, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    min_bytes = int(sys.argv[4]) if len(sys.argv) > 4 else 4096
    max_bytes = int(sys.argv[5]) if len(sys.argv) > 5 else 256 << 20
    budget = float(sys.argv[6]) if len(sys.argv) > 6 else 2.0
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(folder, "torch-store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    size = min_bytes
    while size <= max_bytes:
        t = torch.ones(size // 4, dtype=torch.float32)
        for _ in range(2):
            dist.all_reduce(t)
        start = time.perf_counter()
        dist.all_reduce(t)
        probe = time.perf_counter() - start
        iters_t = torch.tensor([min(max(budget / max(probe, 1e-6), 5.0), 2000.0)],
                               dtype=torch.float64)
        dist.broadcast(iters_t, 0)
        iters = int(iters_t.item())
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        per_iter = (time.perf_counter() - start) / iters
        busbw = size * 2.0 * (world - 1) / world / per_iter / 1e9
        if rank == 0:
            print(json.dumps({"bytes": size, "iters": iters, "seconds_per_iter": per_iter,
                              "busbw_gbps": busbw}), flush=True)
        size *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
