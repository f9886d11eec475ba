"""The `trainyard` module's own cost a step, timed alone (bench/program_vs_torchrun.sh runs it
under a Trainyard host and with none): N steps of report + should_checkpoint + should_stop with
no training between them, then M reports each sent to the host (the socket round trip that
report() makes at most every 50 ms). One rank: the ranks' agreement, one small all-reduce every
few steps, is the same under torchrun and is measured by the steps/s tables.

    python3 program_module_cost.py N M OUT      (writes JSON to OUT)
"""

import json
import sys
import time

import trainyard


def main():
    steps, sends, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    started = time.perf_counter()
    for step in range(1, steps + 1):
        trainyard.report(step, loss=0.5, total_steps=steps)
        if trainyard.should_checkpoint(step):
            trainyard.commit_checkpoint(step)
        if trainyard.should_stop(step):
            break
    per_step = (time.perf_counter() - started) / steps
    started = time.perf_counter()
    for i in range(sends):
        trainyard.report(steps + i, loss=0.5)
        trainyard._send_report()  # what report() does once 50 ms have passed
    per_send = (time.perf_counter() - started) / sends
    with open(out, "w") as f:
        json.dump({"per_step_us": per_step * 1e6, "per_send_us": per_send * 1e6,
                   "under_a_host": bool(trainyard._socket_path)}, f)


if __name__ == "__main__":
    main()
