"""Trainyard's side of a job's own program: report steps, save when asked, commit checkpoints.

Imported by a program that Trainyard runs (a job spec with ``program:``); Trainyard puts this
module on the program's PYTHONPATH. Standard library only: torch is used when the program has
imported it and initialised torch.distributed, and never imported here otherwise.

A training loop with it::

    import trainyard

    start = trainyard.start_step              # 0, or the step of the checkpoint restored
    if trainyard.restore_dir:                 # that checkpoint's files, verified
        state = torch.load(os.path.join(trainyard.restore_dir, "state.pt"))
    for step in range(start + 1, total + 1):
        loss = train_one_step(...)
        trainyard.report(step, loss=loss.item(), total_steps=total)
        if trainyard.should_checkpoint(step):  # every checkpoint.every_steps, or a stop here
            if rank == 0:
                torch.save(state, os.path.join(trainyard.checkpoint_dir, "state.pt"))
            trainyard.commit_checkpoint(step)  # every rank, at the same step
        if trainyard.should_stop(step):        # the step every rank stops at
            break

should_checkpoint and should_stop agree among the ranks (one small all-reduce over the
program's own torch.distributed group at each step), so that a preemption notice, which reaches
the ranks at different moments, becomes one step at which every rank saves and stops: the job
then resumes from that step elsewhere, with no step lost. See docs/user-guide.md, "Your own
program", for the whole contract.
"""

import json
import math
import os
import signal
import socket
import threading

__all__ = [
    "CommitError",
    "attempt",
    "checkpoint_dir",
    "commit_checkpoint",
    "job_id",
    "report",
    "restore_dir",
    "should_checkpoint",
    "should_stop",
    "start_step",
]


class CommitError(RuntimeError):
    """A checkpoint could not be committed; the message says why."""


def _int_env(name, default=0):
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        return default


#: The job's id and this attempt's number (1 on the first start, one more on every restart).
job_id = os.environ.get("TRAINYARD_JOB_ID", "")
attempt = _int_env("TRAINYARD_ATTEMPT", 1)
#: Where this rank writes the files of a checkpoint before commit_checkpoint (emptied after).
checkpoint_dir = os.environ.get("TRAINYARD_CHECKPOINT_DIR", "")
#: The last committed checkpoint's files, fetched and verified before the program started;
#: None on a first start.
restore_dir = os.environ.get("TRAINYARD_RESTORE_DIR") or None
#: The step of that checkpoint; 0 on a first start.
start_step = _int_env("TRAINYARD_RESTORE_STEP", 0)

_every = _int_env("TRAINYARD_CHECKPOINT_EVERY_STEPS", 0)
_stop_at = _int_env("TRAINYARD_STOP_AT_STEP", 0)
_world = _int_env("WORLD_SIZE", 1)
_socket_path = os.environ.get("TRAINYARD_SOCKET", "")

_lock = threading.Lock()
_conn = None
_reader = None
_stop_requested = False  # SIGTERM arrived: the agent asks this rank to save and stop
_asked = False  # the program has asked should_stop / should_checkpoint at least once
_agreed = (None, False)  # (step, stop) of the last agreement
_committed = set()


def _on_sigterm(signo, frame):
    global _stop_requested
    if not _asked:
        # A program that never asks when to stop cannot act on the request: end as it would
        # without this module.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _stop_requested = True


if _socket_path and threading.current_thread() is threading.main_thread():
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main interpreter
        pass


def _call(request):
    """One request to the rank's host; its reply (a dict). Raises OSError if the host is gone."""
    global _conn, _reader
    if not _socket_path:
        return {"ok": True}
    with _lock:
        if _conn is None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(_socket_path)
            _conn, _reader = conn, conn.makefile("rb")
        _conn.sendall(json.dumps(request, separators=(",", ":")).encode() + b"\n")
        line = _reader.readline()
    if not line:
        raise OSError("the trainyard host closed its socket")
    return json.loads(line)


def _number(name, value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"trainyard.report: {name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        return None  # a diverged loss is reported as missing rather than as a broken number
    return number


def report(step, **metrics):
    """Records that this rank completed `step` (an int), with any figures by name.

    loss, val_loss, val_accuracy, samples_per_second and epoch have their own places in
    `trainyard describe`, the job list and the metrics; total_steps (the step the program ends
    at) gives the progress bar its end; any other name is kept as the job's own metric. Every
    rank may report; rank 0's figures are the job's. Cheap: call it every step.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise TypeError(f"trainyard.report: step must be an int >= 0, got {step!r}")
    figures = {}
    for name, value in metrics.items():
        number = _number(name, value)
        if number is not None:
            figures[name] = number
    _call({"op": "report", "step": step, "metrics": figures})


def _agree(step):
    """Whether every rank stops at `step`: the same answer on every rank."""
    global _asked, _agreed
    _asked = True
    if _agreed[0] == step:
        return _agreed[1]
    local = _stop_requested
    if _world > 1:
        local = _all_ranks_any(local)
    stop = local or (_stop_at > 0 and step >= _stop_at)
    _agreed = (step, stop)
    if stop:
        _call({"op": "stopping", "step": step})
    return stop


def _all_ranks_any(flag):
    import sys

    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "trainyard.should_stop and should_checkpoint agree among the ranks over "
            "torch.distributed: call torch.distributed.init_process_group first "
            f"(WORLD_SIZE is {_world})"
        )
    device = "cpu"
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def should_stop(step):
    """Whether the program stops after `step`: the same answer on every rank.

    True at the step the ranks agree on after the agent asked them to stop (a preemption
    notice, a cancel, the scheduler making room), and at the step a search's rung ends. Save
    at that step first: should_checkpoint(step) is then True too. Call it at every step, on
    every rank, after the step's update.
    """
    return _agree(step)


def should_checkpoint(step):
    """Whether to save a checkpoint of `step`: every checkpoint.every_steps, and where the
    ranks stop. The same answer on every rank; call it at every step, on every rank."""
    stop = _agree(step)
    return stop or (_every > 0 and step % _every == 0)


def commit_checkpoint(step):
    """Commits the files every rank wrote into checkpoint_dir for `step`.

    Call it on every rank at the same step, after writing (rank 0 may write everything, or each
    rank its own files; two ranks may not write the same name). Returns when the checkpoint is
    committed under this attempt: it is then what a restart restores. The folder is emptied.
    Raises CommitError when the checkpoint cannot be committed.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise TypeError(f"trainyard.commit_checkpoint: step must be an int >= 0, got {step!r}")
    reply = _call({"op": "commit", "step": step})
    if not reply.get("ok"):
        raise CommitError(reply.get("error", "the checkpoint was not committed"))
    _committed.add(step)
