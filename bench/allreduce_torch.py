"""All-reduce bus bandwidth of torch.distributed with the Gloo backend, or its point-to-point
round trip (dist.isend and dist.recv between ranks 0 and 1, as torch.distributed.pipelining's
stages send each other), one process per rank.

Same sizes, iteration choice and output as allreduce_bench.cc:
  python3 allreduce_torch.py RANK WORLD DIR [MIN_BYTES MAX_BYTES SECONDS_PER_SIZE [p2p]]
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
    point_to_point = len(sys.argv) > 7 and sys.argv[7] == "p2p"
    if point_to_point and world != 2:
        sys.exit("p2p: a round trip between ranks 0 and 1 needs WORLD 2")
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(folder, "torch-store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    def round_trip(t, back):
        if rank == 0:
            sent = dist.isend(t, 1)
            dist.recv(back, 1)
            sent.wait()
        else:
            dist.recv(back, 0)
            dist.isend(back, 0).wait()

    size = min_bytes
    while size <= max_bytes:
        t = torch.ones(size // 4, dtype=torch.float32)
        back = torch.empty_like(t)
        once = (lambda: round_trip(t, back)) if point_to_point else (lambda: dist.all_reduce(t))
        for _ in range(2):
            once()
        start = time.perf_counter()
        once()
        probe = time.perf_counter() - start
        iters_t = torch.tensor([min(max(budget / max(probe, 1e-6), 5.0), 2000.0)],
                               dtype=torch.float64)
        dist.broadcast(iters_t, 0)
        iters = int(iters_t.item())
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            once()
        per_iter = (time.perf_counter() - start) / iters
        moved = 2.0 if point_to_point else 2.0 * (world - 1) / world
        if rank == 0:
            print(json.dumps({"bytes": size, "iters": iters, "seconds_per_iter": per_iter,
                              "gbps": size * moved / per_iter / 1e9}), flush=True)
        size *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
