"""A DDP script with Trainyard's module: it reports every step, saves where Trainyard says
(every checkpoint.every_steps, and at the step every rank stops at on a notice), resumes from
what Trainyard restored, and at the end writes its parameters to $OUT/<name>.bin, so that a run
stopped and resumed can be compared bit for bit with one that was not.

Arguments: total steps."""

import os
import sys

import torch
import torch.distributed as dist

import trainyard

total = int(sys.argv[1])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
model = torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
if trainyard.restore_dir:
    state = torch.load(os.path.join(trainyard.restore_dir, "state.pt"))
    net.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    assert state["step"] == trainyard.start_step, (state["step"], trainyard.start_step)
    print(f"rank {rank}: resumed at step {trainyard.start_step}", flush=True)

for step in range(trainyard.start_step + 1, total + 1):
    # Each step's batch depends on the step alone: a resumed run sees the same data.
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 16, generator=g)
    y = torch.randint(0, 4, (16,), generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    trainyard.report(step, loss=loss.item(), total_steps=total, lr=0.05)
    if trainyard.should_checkpoint(step):
        if rank == 0:
            torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step},
                       os.path.join(trainyard.checkpoint_dir, "state.pt"))
        trainyard.commit_checkpoint(step)
    if trainyard.should_stop(step):
        print(f"rank {rank}: stopping at step {step}", flush=True)
        sys.exit(0)

if rank == 0:
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    out = os.path.join(os.environ["OUT"], os.environ["NAME"] + ".bin")
    with open(out + ".tmp", "wb") as f:
        f.write(flat.numpy().tobytes())
    os.rename(out + ".tmp", out)
dist.destroy_process_group()
