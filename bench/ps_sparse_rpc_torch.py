"""The sparse parameter server PyTorch users write with torch.distributed.rpc, on the model and data
of bench/ps_sparse.py: one embedding table of ROWS x 16 and an MLP over the row's embedding and
13 dense features (29 -> 64 -> 2), plain SGD, a global batch split over 2 trainers. One server
process holds the table and the MLP. Each step a trainer asks the server for the rows its batch
touches (rpc_sync), looks its ids up in them, and sends the gradients of the MLP and of those rows
(rpc_sync of an @rpc.functions.async_execution function); once both trainers' gradients of the
step are in, the server applies the mean to the rows touched and to the MLP and answers both with
the MLP's new parameters. TensorPipe over loopback, one thread per process, placed by the kernel.

  python3 ps_sparse_rpc_torch.py [STEPS BATCH ROWS]

Prints {"system": "torch_rpc", "samples_per_second": S, "steps_per_second": S / BATCH,
"bytes_per_step": B}: S is trainer 1's median rate over 20-step windows after the first two; B
the tensor bytes both trainers sent and received per step (ids, rows, gradients, parameters).
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
DIM = 16
FEATURES = 13
LR = 0.05


def make_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM + FEATURES, 64), nn.ReLU(), nn.Linear(64, 2))


class Server:
    """The table, the MLP, and the gradients of the step being gathered."""

    def __init__(self, rows):
        torch.manual_seed(1)
        self.table = torch.randn(rows, DIM)
        self.mlp = make_mlp()
        self.params = list(self.mlp.parameters())
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.ids = []
        self.rows = []
        self.lock = threading.Lock()
        self.pending = 0
        self.future = torch.futures.Future()


SERVER = None


def get_parameters():
    with SERVER.lock:
        return [p.detach().clone() for p in SERVER.params]


def pull_rows(ids):
    with SERVER.lock:
        return SERVER.table.index_select(0, ids)


@rpc.functions.async_execution
def push(gradients, ids, rows):
    with SERVER.lock:
        for p, g in zip(SERVER.params, gradients):
            p.grad.add_(g)
        SERVER.ids.append(ids)
        SERVER.rows.append(rows)
        SERVER.pending += 1
        future = SERVER.future
        if SERVER.pending == TRAINERS:
            with torch.no_grad():
                # Plain SGD on the mean gradient: the rows touched, then the MLP.
                SERVER.table.index_add_(0, torch.cat(SERVER.ids), torch.cat(SERVER.rows),
                                        alpha=-LR / TRAINERS)
                for p in SERVER.params:
                    p.add_(p.grad, alpha=-LR / TRAINERS)
                    p.grad.zero_()
            SERVER.ids, SERVER.rows = [], []
            SERVER.pending = 0
            future.set_result([p.detach().clone() for p in SERVER.params])
            SERVER.future = torch.futures.Future()
    return future


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def run(rank, steps, batch, rows, port, out):
    global SERVER
    torch.set_num_threads(1)
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=120,
                                              init_method=f"tcp://127.0.0.1:{port}")
    if rank == 0:
        SERVER = Server(rows)
    rpc.init_rpc("ps" if rank == 0 else f"trainer{rank}", rank=rank, world_size=TRAINERS + 1,
                 rpc_backend_options=options)
    if rank > 0:
        mlp = make_mlp()
        params = list(mlp.parameters())
        with torch.no_grad():
            for p, v in zip(params, rpc.rpc_sync("ps", get_parameters)):
                p.copy_(v)
        # The synthetic data of bench/ps_sparse.py: half of the ids are the class's, half uniform.
        generator = torch.Generator().manual_seed(rank)
        n = 65536
        y = torch.randint(0, 2, (n,), generator=generator)
        uniform = torch.randint(0, rows, (n,), generator=generator)
        ids_all = torch.where(torch.rand(n, generator=generator) < 0.5, y * 7919, uniform)
        x = torch.randn(n, FEATURES, generator=generator)
        per_rank = batch // TRAINERS
        loss_fn = nn.CrossEntropyLoss()
        rates, moved = [], []
        start = time.perf_counter()
        for step in range(steps):
            lo = (step * per_rank) % (n - per_rank)
            ids = ids_all[lo:lo + per_rank]
            unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
            pulled = rpc.rpc_sync("ps", pull_rows, args=(unique,))
            leaf = pulled.requires_grad_(True)
            mlp.zero_grad(set_to_none=False)
            inputs = torch.cat([leaf[inverse], x[lo:lo + per_rank]], dim=1)
            loss_fn(mlp(inputs), y[lo:lo + per_rank]).backward()
            grads = [p.grad for p in params]
            fresh = rpc.rpc_sync("ps", push, args=(grads, unique, leaf.grad))
            with torch.no_grad():
                for p, v in zip(params, fresh):
                    p.copy_(v)
            moved.append(nbytes([unique, pulled]) + nbytes(grads + [unique, leaf.grad]) +
                         nbytes(fresh))
            if (step + 1) % WINDOW == 0:
                now = time.perf_counter()
                rates.append(WINDOW * batch / (now - start))
                start = now
        if rank == 1:
            out.put((statistics.median(rates[2:]) if len(rates) > 2 else float("nan"),
                     statistics.mean(moved) * TRAINERS))
    rpc.shutdown()


def main():
    values = [200, 2048, 1000000]  # STEPS BATCH ROWS
    for i, arg in enumerate(sys.argv[1:4]):
        values[i] = int(arg)
    steps, batch, rows = values
    rate, moved = run_processes(run, (steps, batch, rows), TRAINERS + 1)
    print(json.dumps({"system": "torch_rpc", "samples_per_second": round(rate, 1),
                      "steps_per_second": round(rate / batch, 2),
                      "bytes_per_step": round(moved)}))


if __name__ == "__main__":
    main()
