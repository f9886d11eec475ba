"""Rank 0 joins the process group and ends at once; rank 1 waits for rank 0's program to be gone
and only then uses the ranks' store, as a program's last barrier or checkpoint may: the store
that rank 0's host serves outlives rank 0's program, as torchrun's agent's does. Rank 1 writes
what it read back from the store to $OUT/<job>-rank1.txt. Both ranks on one machine (the test's)."""

import os
import select
import sys

import torch.distributed as dist

rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
store = dist.distributed_c10d._get_default_store()
if rank == 0:
    store.set("rank0-pid", str(os.getpid()))
    sys.exit(0)

rank0 = os.pidfd_open(int(store.get("rank0-pid")))
select.select([rank0], [], [])  # readable once that process has ended
store.set("late", "written after rank 0's program ended")
out = os.path.join(os.environ["OUT"], f"{os.environ['TRAINYARD_JOB_ID']}-rank1")
with open(out + ".tmp", "w") as f:
    f.write(store.get("late").decode())
os.rename(out + ".tmp", out + ".txt")
