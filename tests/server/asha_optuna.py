#!/usr/bin/python3
"""Replays a search's rung results through Optuna's SuccessiveHalvingPruner.

Reads JSON on stdin: {"divisor", "min_resource", "rung_steps" (the last is the trial's full
length), "direction", "trials", "events": [{"trial", "rung", "value"}, ...]} in the order the
results arrived, and prints {"pruned_at": [...]}: per trial, the rung at whose end the pruner
stopped it, -1 when it ran to the end, null when it never reported.
"""
import json
import sys

import optuna


def main():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    config = json.load(sys.stdin)
    pruner = optuna.pruners.SuccessiveHalvingPruner(
        min_resource=config["min_resource"],
        reduction_factor=config["divisor"],
        min_early_stopping_rate=0,
        bootstrap_count=0,
    )
    study = optuna.create_study(direction=config["direction"], pruner=pruner)
    steps = config["rung_steps"]
    trials = {}
    pruned_at = [None] * config["trials"]
    for event in config["events"]:
        number, rung, value = event["trial"], event["rung"], event["value"]
        if number not in trials:
            trials[number] = study.ask()
        trial = trials[number]
        trial.report(value, steps[rung])
        if rung == len(steps) - 1:
            # A trial that reached its full length is complete, as in Trainyard.
            study.tell(trial, value)
            pruned_at[number] = -1
        elif trial.should_prune():
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            pruned_at[number] = rung
    print(json.dumps({"pruned_at": pruned_at, "optuna": optuna.__version__}))


if __name__ == "__main__":
    main()
