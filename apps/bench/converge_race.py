"""`cpu_pipeline.py race`: async pipelines against the best sync setting, to a target accuracy.

Runs `troupe converge` on one stage (sync, every core), on --stages stages sync 1F1B at each of
--sync-micro-batches micro-batch counts, and on the async rows (--async-setting
NAME:KEY=VALUE,...; default plain async and the nesterov correction, two keys in flight), seeds
1 ... --seeds in alternating order. Then prints each sync row's median seconds to the target,
marks the best --stages-stage sync row (most runs at the target, then the soonest), and gives
each async row's median as a ratio to that row and to one stage, naming both:

    nesterov-mak2    12.9 s: 0.83x best 4-stage sync (1f1b M=4), 1.08x one stage

Without --job the race is the README's: apps/examples/fashion_mlp.toml with 3 epochs, lr 0.05,
200 warm-up steps and target 0.85 (each --set after them).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

RACE_OVERRIDES = ["training.epochs=3", "training.lr=0.05", "training.warmup_steps=200",
                  "training.target_accuracy=0.85"]
RACE_ASYNC = [
    'async-mak2:parallelism.mode="async",parallelism.staleness_correction="none",'
    'parallelism.max_active_keys=2',
    'nesterov-mak2:parallelism.mode="async",parallelism.staleness_correction="nesterov",'
    'parallelism.max_active_keys=2',
]
ONE_STAGE = "sync-1-stage"


def add_arguments(parser):
    group = parser.add_argument_group("race")
    group.add_argument("--job", help="race: the job (default: apps/examples/fashion_mlp.toml "
                                     "with the README's race keys)")
    group.add_argument("--set", action="append", default=[],
                       help="race: a job key for every setting, KEY=VALUE")
    group.add_argument("--seeds", type=int, default=3, help="race: runs per setting")
    group.add_argument("--stages", type=int, default=4,
                       help="race: stages of the pipelines, sync and async")
    group.add_argument("--sync-micro-batches", type=count_list, default=[1, 2, 4, 8],
                       help="race: micro-batch counts of the sync 1F1B pipelines, M1,M2,...")
    group.add_argument("--async-setting", action="append", default=[],
                       help="race: an async row NAME:KEY=VALUE,... (default: plain async and "
                            "nesterov, 2 keys in flight)")
    group.add_argument("--prediction", action="store_true",
                       help="race: keep troupe converge's simulated prediction of every run")
    group.add_argument("--out", default="runs/race", help="race: troupe converge's output")


def count_list(text):
    try:
        values = [int(value) for value in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("%s: expected counts M1,M2,... of 1 or more" % text)
    return values


def rows_of(args):
    """(name, overrides, label) of every setting: one stage sync, the sync pipelines (label:
    their schedule and M), then the async rows."""
    stages = "parallelism.stages=%d" % args.stages
    rows = [(ONE_STAGE, ["parallelism.stages=1", 'parallelism.mode="sync"',
                         "parallelism.micro_batches=1"], "one stage")]
    for micro in args.sync_micro_batches:
        rows.append(("sync-%d-stages-1f1b-m%d" % (args.stages, micro),
                     [stages, 'parallelism.mode="sync"', 'parallelism.schedule="1f1b"',
                      "parallelism.micro_batches=%d" % micro], "1f1b M=%d" % micro))
    for text in args.async_setting or RACE_ASYNC:
        name, colon, keys = text.partition(":")
        if not colon or not name or not keys:
            sys.exit("cpu_pipeline: --async-setting %s: expected NAME:KEY=VALUE[,KEY=VALUE...]"
                     % text)
        rows.append((name, [stages] + keys.split(","), name))
    return rows


def medians_of(path):
    """{setting: (median seconds of the runs that reached the target or None, how many reached
    it, runs)} of troupe converge's convergence.json."""
    with open(path) as file:
        table = json.load(file)
    medians = {}
    for row in table:
        seconds = [run["time_to_target_s"] for run in row["runs"]
                   if run.get("time_to_target_s") is not None]
        medians[row["setting"]] = (statistics.median(seconds) if seconds else None, len(seconds),
                                   len(row["runs"]))
    return medians


def converge_command(args, rows):
    job = args.job or os.path.normpath(os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "examples", "fashion_mlp.toml"))
    command = [args.troupe, "converge", job, "--seeds", str(args.seeds), "--out", args.out]
    for override in ([] if args.job else RACE_OVERRIDES) + args.set:
        command += ["--set", override]
    for name, keys, _ in rows:
        command += ["--setting", "%s:%s" % (name, ",".join(keys))]
    return command + ([] if args.prediction else ["--no-prediction"])


def race(args):
    rows = rows_of(args)
    command = converge_command(args, rows)
    print(" ".join(command), flush=True)
    status = subprocess.run(command).returncode
    if status not in (0, 1):  # 1: some run failed; the table holds the others
        sys.exit("cpu_pipeline: troupe converge exited with %d" % status)
    print_ratios(args, rows, medians_of(os.path.join(args.out, "convergence.json")))
    return status


def print_ratios(args, rows, medians):
    sync_rows = rows[:1 + len(args.sync_micro_batches)]
    # The best sync pipeline: the most runs at the target, then the soonest median.
    reached = [name for name, _, _ in sync_rows[1:] if medians[name][0] is not None]
    best = min(reached, key=lambda name: (-medians[name][1], medians[name][0]), default=None)
    labels = {name: label for name, _, label in rows}

    def seconds_of(name):
        value, _, runs = medians[name]
        return "%.1f s" % value if value is not None else "none of %d runs reached it" % runs

    print("\nmedian seconds to the target (of the runs that reached it); each ratio is to the "
          "sync setting it names (below 1: sooner)")
    for name, _, _ in sync_rows:
        mark = "  <- best %d-stage sync" % args.stages if name == best else ""
        print("  %-28s %s%s" % (name, seconds_of(name), mark))
    references = [(best, "best %d-stage sync (%s)" % (args.stages, labels.get(best))),
                  (ONE_STAGE, "one stage")]
    for name, _, _ in rows[len(sync_rows):]:
        value = medians[name][0]
        ratios = ["%.2fx %s" % (value / medians[reference][0], text)
                  for reference, text in references
                  if value is not None and reference and medians[reference][0] is not None]
        print("  %-28s %s%s" % (name, seconds_of(name), ": " + ", ".join(ratios) if ratios else ""))
