"""The parameter server PyTorch users write with torch.distributed.rpc, on the model and data of
bench/ddp_scaling.cc: an MLP (inputs -> hidden -> hidden -> 10, ReLU), SGD with momentum, a global
batch split over 2 trainers. One server process holds the parameters and the optimizer; each
step every trainer sends its gradients with rpc_sync, the server averages the trainers' gradients
of that step (the batch-update pattern of PyTorch's parameter-server tutorial, with
@rpc.functions.async_execution), steps the optimizer and answers every trainer with the new
parameters, which it copies into its model. TensorPipe over loopback, one thread per process,
placed by the kernel.

  python3 ps_rpc_torch.py [STEPS BATCH INPUTS HIDDEN]

Prints {"system": "torch_rpc", "workers": 2, "shards": 1, "samples_per_second": S,
"steps_per_second": S / BATCH}: S is trainer 1's median rate over 20-step windows after the first
two, as the trainer's progress lines give it.
"""
import os

# Before torch loads (see ddp_torch.py): one BLAS thread per process, as the trainer uses.
os.environ["OMP_NUM_THREADS"] = "1"

import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed.rpc as rpc  # noqa: E402
import torch.nn as nn  # noqa: E402

from rpc_peer import run_processes  # noqa: E402

WINDOW = 20
TRAINERS = 2


def make_model(inputs, hidden):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, 10))


class Server:
    """The parameters, their optimizer, and the gradients of the step being gathered."""

    def __init__(self, inputs, hidden):
        self.model = make_model(inputs, hidden)
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.SGD(self.params, lr=0.01, momentum=0.9)
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.lock = threading.Lock()
        self.pending = 0
        self.future = torch.futures.Future()


SERVER = None


def get_parameters():
    with SERVER.lock:
        return [p.detach().clone() for p in SERVER.params]


@rpc.functions.async_execution
def push(gradients):
    with SERVER.lock:
        for p, g in zip(SERVER.params, gradients):
            p.grad.add_(g)
        SERVER.pending += 1
        future = SERVER.future
        if SERVER.pending == TRAINERS:
            for p in SERVER.params:
                p.grad.div_(TRAINERS)
            SERVER.optimizer.step()
            for p in SERVER.params:
                p.grad.zero_()
            SERVER.pending = 0
            future.set_result([p.detach().clone() for p in SERVER.params])
            SERVER.future = torch.futures.Future()
    return future


def run(rank, steps, batch, inputs, hidden, port, out):
    global SERVER
    # No pinning: the kernel places the processes, as it places the trainer's ranks and shards
    # on a local cluster.
    torch.set_num_threads(1)
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=120,
                                              init_method=f"tcp://127.0.0.1:{port}")
    if rank == 0:
        SERVER = Server(inputs, hidden)
    rpc.init_rpc("ps" if rank == 0 else f"trainer{rank}", rank=rank, world_size=TRAINERS + 1,
                 rpc_backend_options=options)
    if rank > 0:
        model = make_model(inputs, hidden)
        params = list(model.parameters())
        with torch.no_grad():
            for p, v in zip(params, rpc.rpc_sync("ps", get_parameters)):
                p.copy_(v)
        generator = torch.Generator().manual_seed(rank)
        x = torch.randn(8192, inputs, generator=generator)
        y = torch.randint(0, 10, (8192,), generator=generator)
        per_rank = batch // TRAINERS
        loss_fn = nn.CrossEntropyLoss()
        rates = []
        start = time.perf_counter()
        for step in range(steps):
            lo = (step * per_rank) % (8192 - per_rank)
            model.zero_grad(set_to_none=False)
            loss_fn(model(x[lo:lo + per_rank]), y[lo:lo + per_rank]).backward()
            fresh = rpc.rpc_sync("ps", push, args=([p.grad for p in params],))
            with torch.no_grad():
                for p, v in zip(params, fresh):
                    p.copy_(v)
            if (step + 1) % WINDOW == 0:
                now = time.perf_counter()
                rates.append(WINDOW * batch / (now - start))
                start = now
        if rank == 1:
            out.put(statistics.median(rates[2:]) if len(rates) > 2 else float("nan"))
    rpc.shutdown()


def main():
    values = [200, 64, 256, 1024]  # STEPS BATCH INPUTS HIDDEN
    for i, arg in enumerate(sys.argv[1:5]):
        values[i] = int(arg)
    steps, batch, inputs, hidden = values
    rate = run_processes(run, (steps, batch, inputs, hidden), TRAINERS + 1)
    print(json.dumps({"system": "torch_rpc", "workers": TRAINERS, "shards": 1,
                      "samples_per_second": round(rate, 1),
                      "steps_per_second": round(rate / batch, 2)}))


if __name__ == "__main__":
    main()
