#!/usr/bin/env python3
"""The peer of bench/pipeline.py: torch.distributed.pipelining (PyTorch 2.4 and later; Debian 13's
python3-torch 2.6) training examples/transformer/transformer.py's model split into stages, one
process per stage, Gloo on CPU, one thread each, AdamW, no dropout, untied head (the pipelining
API has no tied weights across stages).

  python3 bench/pipeline_torch.py --stages 2 --counts 3,3 --microbatches 8 --schedule 1f1b
      [--batch 16 --context 128 --layers 4 --dim 128 --heads 4 --steps 40 --warmup 10]

Prints one JSON line: samples/s over the timed steps (rank 0, between barriers) and each stage's
peak resident memory in MB.
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "transformer"))
import transformer  # noqa: E402


class Stage(nn.Module):
    """Layers [first, end) of the model (0 the embeddings, 1..L the blocks, L+1 the head)."""

    def __init__(self, model, first, end):
        super().__init__()
        layers = len(model.h)
        self.embed = first == 0
        self.head = end == layers + 2
        if self.embed:
            self.wte, self.wpe = model.wte, model.wpe
        self.h = nn.ModuleList(model.h[max(first, 1) - 1:min(end, layers + 1) - 1])
        if self.head:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x):
        if self.embed:
            positions = torch.arange(x.size(1), device=x.device)
            x = self.wte(x) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        if self.head:
            x = self.lm_head(self.ln_f(x))
        return x


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))


class _AllWork:
    """Every Work of one batch_isend_irecv: waiting for it waits for each."""

    def __init__(self, works):
        self.works = works

    def wait(self):
        for work in self.works:
            work.wait()


def _batch_p2p(p2p_ops, desc=None):
    return _AllWork(dist.batch_isend_irecv(p2p_ops)) if p2p_ops else None


def run(rank, args, port, queue):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.distributed.pipelining import schedules

    # PyTorch 2.6 (Debian 13) waits for only the last of the sends and receives batch_isend_irecv
    # returns, which are several on Gloo (one per operation), and so deadlocks on CPU
    # (pytorch/pytorch#132644, fixed upstream in #152938): wait for all of them, as the fix does.
    schedules._batch_p2p = _batch_p2p

    torch.set_num_threads(1)
    # Debian's PyTorch is built without libuv, which its TCP store asks for by default.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}?use_libuv=0",
                            rank=rank, world_size=args.stages)
    counts = [int(c) for c in args.counts.split(",")]
    first = sum(counts[:rank])
    model = transformer.TransformerLM(256, args.context, args.layers, args.dim, args.heads,
                                      tie_embeddings=False).initialise(1)
    stage_module = Stage(model, first, first + counts[rank])
    del model
    mb = args.batch // args.microbatches
    dim = args.dim
    example = (torch.zeros(mb, args.context, dtype=torch.long) if rank == 0
               else torch.zeros(mb, args.context, dim))
    out_example = (torch.zeros(mb, args.context, 256) if rank == args.stages - 1
                   else torch.zeros(mb, args.context, dim))
    stage = PipelineStage(stage_module, rank, args.stages, torch.device("cpu"),
                          input_args=(example,), output_args=(out_example,))
    kind = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    schedule = kind(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(stage_module.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (args.batch, args.context + 1), generator=gen)
    inputs, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step():
        opt.zero_grad()
        if rank == 0:
            schedule.step(inputs)
        elif rank == args.stages - 1:
            schedule.step(target=targets, losses=[])
        else:
            schedule.step()
        opt.step()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    began = time.perf_counter()
    for _ in range(args.steps):
        step()
    dist.barrier()
    seconds = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    peaks = [None] * args.stages
    dist.all_gather_object(peaks, peak)
    if rank == 0:
        queue.put({"samples_per_s": args.batch * args.steps / seconds, "peak_rss_mb": peaks})
        queue.close()
        queue.join_thread()
    dist.barrier()
    # PyTorch 2.6's destroy_process_group can hang on Gloo after point-to-point traffic (seen on 4
    # stages): every rank is done here, so the process ends without it.
    os._exit(0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--counts", required=True, help="layers per stage, comma-separated")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="1f1b")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, args, port, queue)) for r in range(args.stages)]
    for proc in procs:
        proc.start()
    result = None
    while result is None:
        try:
            result = queue.get(timeout=1)
        except Exception:  # queue.Empty: go on waiting while every stage is alive
            if any(proc.exitcode not in (None, 0) for proc in procs):
                for proc in procs:
                    proc.kill()
                sys.exit("a stage failed (its error is above)")
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            sys.exit(f"a stage exited with {proc.exitcode}")
    result["torch"] = torch.__version__
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
