"""A trial of a search over a program: gradient descent on w^2 from w = 5 with the learning rate
the search gives it (--lr, and LR in its environment: both substituted from {lr}), for 9 steps.
It reports its own figure, `score` (-w^2, larger is better), saves where Trainyard says (the end
of an ASHA rung) and goes on from what Trainyard restored."""

import os
import sys

import trainyard

lr = float(sys.argv[sys.argv.index("--lr") + 1])
assert float(os.environ["LR"]) == lr, (os.environ["LR"], lr)
total = 9
w = 5.0
if trainyard.restore_dir:
    with open(os.path.join(trainyard.restore_dir, "w.txt")) as f:
        w = float(f.read())
for step in range(trainyard.start_step + 1, total + 1):
    w -= lr * 2 * w
    trainyard.report(step, loss=w * w, score=-w * w, total_steps=total)
    if trainyard.should_checkpoint(step):
        with open(os.path.join(trainyard.checkpoint_dir, "w.txt"), "w") as f:
            f.write(repr(w))
        trainyard.commit_checkpoint(step)
    if trainyard.should_stop(step):
        break
