"""Programs that end in the ways a program can, for the tests of how Trainyard reads each end.

Argument: the way.
  exit2        exits with code 2 (the program's own verdict: a user error)
  raise        raises an exception (a failure, retried by the restart policy)
  grow         allocates memory until the task's limit stops it
  quiet        never reports, and takes longer than the job's stall_timeout
  early        rank 1 exits 0 at once; rank 0 reports steps (a test holds it) and then exits 0
  mismatch     rank 0 commits step 5, rank 1 step 6
  stall        reports step 1, then stops reporting
"""

import os
import sys
import time

import trainyard

way = sys.argv[1]
rank = int(os.environ["RANK"])

if way == "exit2":
    print("bad arguments: --lr must be > 0", file=sys.stderr, flush=True)
    sys.exit(2)
elif way == "raise":
    raise ValueError("the loss diverged")
elif way == "grow":
    held = []
    while True:
        held.append(bytearray(32 << 20))  # touched: every page is written
elif way == "quiet":
    time.sleep(float(sys.argv[2]))
elif way == "early":
    if rank == 1:
        sys.exit(0)
    for step in range(1, 4):
        trainyard.report(step)
elif way == "mismatch":
    with open(os.path.join(trainyard.checkpoint_dir, f"rank{rank}.txt"), "w") as f:
        f.write("x")
    trainyard.commit_checkpoint(5 + rank)
elif way == "stall":
    trainyard.report(1)
    time.sleep(3600)
