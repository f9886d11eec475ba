"""What the torch.distributed.rpc peers (ps_rpc_torch.py, ps_sparse_rpc_torch.py) share: one
process per RPC rank, spawned, joined and checked. Import it after setting OMP_NUM_THREADS."""
import sys

import torch.multiprocessing as mp

from local_cluster import free_port


def run_processes(target, args, world):
    """Runs target(rank, *args, port, out) in `world` spawned processes (rank 0 the server) that
    meet on a free loopback port; returns what the reporting trainer put in `out`. Exits the
    script if a process fails."""
    port = free_port()
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=target, args=(rank, *args, port, out)) for rank in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        sys.exit("a process failed")
    return out.get()
