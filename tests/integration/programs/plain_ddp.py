"""A torchrun-style DDP script that knows nothing of Trainyard: it meets its peers through
env://, trains a few steps of a tiny model with Gloo, and writes what its environment held to
$OUT/<job>-rank<RANK>.json for the test to check, and whether its own process served the ranks'
store (under Trainyard, as under torchrun's agent, rank 0's host serves it)."""

import json
import os
import signal

import torch
import torch.distributed as dist


def serves_port(port):
    """Whether this process holds the socket listening on `port` (the ranks' store)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            mine.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                listening = fields[3] == "0A"
                if listening and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    if f"socket:[{fields[9]}]" in mine:
                        return True
    return False


dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step * world + rank))
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
seen = {name: os.environ.get(name) for name in (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "TRAINYARD_JOB_ID",
    "TRAINYARD_ATTEMPT", "TRAINYARD_CHECKPOINT_DIR", "TRAINYARD_RESTORE_DIR", "TRAINYARD_SOCKET",
    "PYTHONPATH", "MY_SETTING", "AWS_SECRET_ACCESS_KEY", "TRAINYARD_TASK_CREDENTIAL")}
seen["all_reduce"] = total.item()
seen["TORCHELASTIC_USE_AGENT_STORE"] = os.environ.get("TORCHELASTIC_USE_AGENT_STORE")
seen["serves_store"] = serves_port(int(os.environ["MASTER_PORT"]))
seen["cwd"] = os.getcwd()
# Started as init would start it, whatever the agent's own start ignored or blocked: Python
# installs its SIGINT handler only over the default, and leaves the rest as it found them.
seen["signals_not_default"] = [s.name for s in (signal.SIGQUIT, signal.SIGUSR1, signal.SIGHUP)
                               if signal.getsignal(s) != signal.SIG_DFL]
if signal.getsignal(signal.SIGINT) != signal.default_int_handler:
    seen["signals_not_default"].append("SIGINT")
seen["signals_blocked"] = sorted(s.name for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
seen["weights"] = [float(v) for v in model.module.weight.flatten()]
out = os.path.join(os.environ["OUT"], f"{os.environ['TRAINYARD_JOB_ID']}-rank{rank}.json")
with open(out + ".tmp", "w") as f:
    json.dump(seen, f)
os.rename(out + ".tmp", out)
dist.destroy_process_group()
