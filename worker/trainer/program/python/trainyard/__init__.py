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

should_checkpoint and should_stop agree among the ranks (a small all-reduce over the program's
own torch.distributed group every few steps: at most about 0.5 % of the step time, and within
about a second), so that a preemption notice, which reaches the ranks at different moments,
becomes one step at which every rank saves and stops: the job
then resumes from that step elsewhere, with no step lost. See docs/user-guide.md, "Your own
program", for the whole contract.
"""

import atexit
import json
import math
import os
import signal
import socket
import threading
import time

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

_step_file = os.environ.get("TRAINYARD_STEP_FILE", "")
_REPORT_INTERVAL = 0.05  # seconds between reports sent to the host
_CHECK_SHARE = 0.005  # of the step time, what comparing stop requests may cost
_STOP_WITHIN = 1.0  # seconds of steps between two comparisons, at most
_MAX_INTERVAL = 1000

_lock = threading.Lock()
_conn = None
_reader = None
_stop_requested = False  # SIGTERM arrived: the agent asks this rank to save and stop
_asked = False  # the program has asked should_stop / should_checkpoint at least once
_agreed = (None, False)  # (step, stop) of the last agreement
_pending = None  # the report not yet sent
_last_sent = float("-inf")
_every_step = False  # the host wants every report (a test holds the program at a step)
_step_fd = None
_next_check = 1  # the next step at which the ranks compare their stop requests
_checked_at = 0.0
_checked_step = 0
_check_cost = 0.0  # seconds one comparison takes, smoothed


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


def _send_report():
    global _pending, _last_sent
    if _pending is None:
        return
    request, _pending = _pending, None
    _last_sent = time.monotonic()
    reply = _call(request)
    global _every_step
    _every_step = bool(reply.get("every_step", _every_step))


def _write_step(step):
    """The rank's last completed step, where its host reads it however the program ends."""
    global _step_fd
    if _step_fd is None:
        if not _step_file:
            return
        try:
            _step_fd = os.open(_step_file, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            _step_fd = -1
    if _step_fd >= 0:
        os.pwrite(_step_fd, b"%-20d\n" % step, 0)


def report(step, **metrics):
    """Records that this rank completed `step` (an int), with any figures by name.

    loss, val_loss, val_accuracy, samples_per_second and epoch have their own places in
    `trainyard describe`, the job list and the metrics; total_steps (the step the program ends
    at) gives the progress bar its end; any other name is kept as the job's own metric. Every
    rank may report; rank 0's figures are the job's. Cheap: call it every step (the step is
    recorded at once; the figures go to the host at most every 50 ms, the latest of each name).
    """
    global _pending
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise TypeError(f"trainyard.report: step must be an int >= 0, got {step!r}")
    figures = dict(_pending["metrics"]) if _pending is not None else {}
    for name, value in metrics.items():
        number = _number(name, value)
        if number is not None:
            figures[name] = number
    _write_step(step)
    _pending = {"op": "report", "step": step, "metrics": figures}
    if _every_step or time.monotonic() - _last_sent >= _REPORT_INTERVAL:
        _send_report()


def _agree(step):
    """Whether every rank stops at `step`: the same answer on every rank.

    The ranks compare their stop requests at check steps only, every `_interval` steps, the
    interval chosen (the same on every rank: the largest any rank asks for) so that the
    comparison, one small all-reduce, costs at most about 0.5 % of the steps between two, and a
    stop is acted on within about a second of steps.
    """
    global _asked, _agreed, _next_check
    _asked = True
    if _agreed[0] == step:
        return _agreed[1]
    stop = _stop_at > 0 and step >= _stop_at
    if _world > 1 and step >= _next_check:
        stop = _check_ranks(step) or stop
    elif _world <= 1:
        stop = stop or _stop_requested
    _agreed = (step, stop)
    if stop:
        _send_report()
        _call({"op": "stopping", "step": step})
    return stop


def _check_ranks(step):
    global _next_check, _checked_at, _checked_step
    import sys

    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "trainyard.should_stop and should_checkpoint agree among the ranks over "
            "torch.distributed: call torch.distributed.init_process_group first "
            f"(WORLD_SIZE is {_world})"
        )
    now = time.perf_counter()
    # The steps since the last check, each without the check's own time.
    step_time = (now - _checked_at) / max(1, step - _checked_step) if _checked_at else 0.0
    device = "cpu"
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([1 if _stop_requested else 0, 0], dtype=torch.int64, device=device)
    if step_time > 0 and _check_cost > 0:
        cheap = math.ceil(_check_cost / (_CHECK_SHARE * step_time))
        prompt = max(1, int(_STOP_WITHIN / step_time))
        t[1] = max(1, min(cheap, prompt, _MAX_INTERVAL))
    started = time.perf_counter()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    flag, interval = (int(v) for v in t.tolist())
    _note_check_cost(time.perf_counter() - started)
    # A test holding the program at a step (the host wants every report) compares every step.
    _next_check = step + (1 if _every_step else max(1, interval))
    _checked_at, _checked_step = time.perf_counter(), step
    return flag > 0


def _note_check_cost(seconds):
    global _check_cost
    _check_cost = seconds if _check_cost == 0 else 0.8 * _check_cost + 0.2 * seconds


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
    _send_report()
    reply = _call({"op": "commit", "step": step})
    if not reply.get("ok"):
        raise CommitError(reply.get("error", "the checkpoint was not committed"))


@atexit.register
def _flush():
    """The last figures reach the host when the program ends."""
    try:
        _send_report()
    except OSError:
        pass
