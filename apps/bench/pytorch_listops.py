#!/usr/bin/env python3
"""The ListOps Tree-LSTM of a troupe job in PyTorch, and the race of troupe's settings against it.

The data are the job's own expressions, written by `troupe dataset` (listops_model.py has the
model: the same widths, gate math, initial ranges, Adam, learning rate, clipping and batch, with
one Tree-LSTM layer as apps/examples/listops_tree_lstm.toml or more, as
apps/examples/listops_stacked_tree_lstm.toml).

    pytorch_listops.py train [--job JOB] [--epochs E] [--implementation recursive|batched]
        trains E epochs (default: the job's training.epochs) and prints the test accuracy and
        wall time after each epoch, and a JSON last line.
    pytorch_listops.py check [--job JOB]
        one batch through both implementations from the same weights: the loss and every
        gradient must agree within 1e-5 (relative); exit status 0 when they do.
    pytorch_listops.py compare [--job JOB] [--steps 20]
        troupe exports the job's initial weights and trains `steps` steps on one stage in sync
        mode with data.shuffle = false; PyTorch loads the same weights and trains on the same
        batches: every step's loss must agree within --tolerance (relative, default 1e-4).
    pytorch_listops.py race [--epochs E] [--rounds 3] [--quick]
        in alternating rounds: PyTorch trains E epochs (final test accuracy A, wall time T),
        then each troupe setting trains up to E epochs with training.target_accuracy = A:
        async on 2 stages (the job as written), sync on 1 stage, sync on 2 stages with each of
        --micro-batches. Prints the medians of each setting's time to A and final accuracy,
        its ratios to PyTorch's T and to troupe's best sync setting, and whether the bars
        (async <= 0.7x PyTorch's T, <= 0.8x the best sync setting) are met.

PyTorch is tuned as tuning.py tunes every baseline: each implementation (recursive: each tree
walked in Python; batched: the parts of a batch at each height in one call) probes the CPU
settings (OMP_WAIT_POLICY x threads x OPENBLAS_NUM_THREADS), each candidate in a process of its
own, and the faster implementation in its best setting is the one that trains and races; the
output names both, and the default settings' rate. --implementation and --pytorch-setting skip
the probes. troupe's settings each probe parallelism.threads and spin_wait_ms
(tuning.troupe_candidates) unless --troupe-setting gives them. Times count from the start of
training to the end (PyTorch's T) or to the first evaluation at A (troupe's time_to_target_s),
evaluations after each epoch included on both sides.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import torch

import listops_model
import tuning
from gpt_model import read_safetensors

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_JOB = os.path.join(REPOSITORY, "apps", "examples", "listops_tree_lstm.toml")
QUICK = ["data.synthetic_train=256", "data.synthetic_test=64"]
PROBE_EXPRESSIONS = 2048  # a probe's child reads only this many training expressions
ASYNC_SETTING = "async-2-stages"
QUIET = ["checkpoint.interval_steps=0", "checkpoint.interval_s=0", "metrics.progress=false"]


# ---- the data and PyTorch's side ---------------------------------------------------------------

def troupe_binary(given):
    if given:
        return given
    built = os.path.join(REPOSITORY, "build", "apps", "troupe")
    return built if os.path.exists(built) else "troupe"


def run_troupe_command(args, arguments, overrides, env=None):
    """`troupe ARGUMENTS --set OVERRIDE ...`; its output, or an exit showing it when it fails."""
    command = [args.troupe] + arguments
    for override in overrides:
        command += ["--set", override]
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit("pytorch_listops: %s exited with %d:\n%s" % (" ".join(command), result.returncode,
                                                             result.stdout + result.stderr))
    return result.stdout


def write_data(args, directory):
    """`troupe dataset` of the job with every --set, into `directory`."""
    print(run_troupe_command(args, ["dataset", args.job, "--out", directory], args.set).strip(),
          flush=True)


def child_command(args, mode, implementation, setting, extra=()):
    return [sys.executable, os.path.abspath(__file__), mode, "--data", args.data,
            "--implementation", implementation, "--pytorch-setting",
            tuning.setting_text(setting)] + list(extra)


def pytorch_choice(args):
    """(implementation, Choice): each candidate implementation's best setting (a probe, or the
    setting given), then the faster of them by those settings' rates."""
    implementations = [args.implementation] if args.implementation else \
        list(listops_model.IMPLEMENTATIONS)
    found = {}
    for implementation in implementations:
        def measure(setting, implementation=implementation):
            command = child_command(args, "speed", implementation, setting,
                                    ["--probe-child", str(args.probe_seconds)])
            return tuning.child_result(command, setting, "the PyTorch probe")["instances_per_s"]

        choice = tuning.chosen(args.pytorch_setting, "pytorch %s" % implementation,
                               tuning.pytorch_candidates(), measure, args, "instances/s")
        rate = choice.rate_of(choice.setting)
        if rate is None and len(implementations) > 1:  # given, not probed: time it here
            rate = statistics.median(measure(choice.setting) for _ in range(args.probe_rounds))
        found[implementation] = (choice, rate)
    best = max(found, key=lambda name: found[name][1] or 0.0)
    if len(found) > 1:
        print("pytorch: the %s implementation is faster (%s)" % (best, ", ".join(
            "%s %.1f instances/s" % (name, rate) for name, (_, rate) in found.items())),
              flush=True)
    return best, found[best][0]


def train(args):
    """PyTorch's run of E epochs: per-epoch lines, then a JSON line."""
    if args.data is None:
        args.data = tempfile.mkdtemp(prefix="troupe_listops_data_")
        write_data(args, args.data)
        sys.argv += ["--data", args.data, "--remove-data"]
        args.remove_data = True
    if args.pytorch_setting is None or args.implementation is None:
        implementation, choice = pytorch_choice(args)
        sys.argv += ["--implementation", implementation]
        tuning.restart_with(choice)
    tuning.enter_pytorch(args.pytorch_setting, torch)
    config = listops_model.read_job(args.data)
    trees = [listops_model.read_trees(os.path.join(args.data, name + ".tsv"))
             for name in ("train", "test")]
    epochs = args.epochs or config["training"]["epochs"]
    seed = config["training"]["seed"] if args.seed is None else args.seed
    print("pytorch %s: %d epoch(s) of %d training expressions, %d test, batch %d, seed %d" % (
        args.implementation, epochs, len(trees[0]), len(trees[1]),
        config["training"]["batch_size"], seed), flush=True)
    history, trained_s = listops_model.train(config, args.implementation, trees[0], trees[1],
                                             epochs, seed,
                                             report=lambda line: print(line, flush=True))
    wall_s = history[-1][1]
    rate = epochs * len(trees[0]) / trained_s
    choice = tuning.Choice(args.pytorch_setting, probed=args.default_rate is not None)
    print(tuning.summary_line("pytorch " + args.implementation, choice, rate, "instances/s",
                              args.default_rate, args.chosen_rate))
    print(json.dumps({"framework": "pytorch %s" % torch.__version__,
                      "implementation": args.implementation,
                      "setting": tuning.setting_text(args.pytorch_setting), "epochs": epochs,
                      "test_accuracy": history[-1][0], "wall_s": wall_s, "train_s": trained_s,
                      "instances_per_s": rate, "accuracies": [h[0] for h in history],
                      "epoch_wall_s": [h[1] for h in history]}))
    if args.remove_data:
        shutil.rmtree(args.data, ignore_errors=True)
    return 0


def prepare_data(args, directory):
    path = os.path.join(directory, "data")
    write_data(args, path)
    return path


def speed(args):
    """A probe's child: training instances per second with --pytorch-setting, as a JSON line."""
    tuning.enter_pytorch(args.pytorch_setting, torch)
    config = listops_model.read_job(args.data)
    trees = listops_model.read_trees(os.path.join(args.data, "train.tsv"), PROBE_EXPRESSIONS)
    trainer = listops_model.Trainer(config, args.implementation, 1)
    batches = [trees[first:first + trainer.batch_size]
               for first in range(0, len(trees), trainer.batch_size)]
    counter = iter(range(10 ** 9))
    rate = tuning.timed_rate(lambda: trainer.step(batches[next(counter) % len(batches)]),
                             seconds=args.probe_child)
    print(json.dumps({"instances_per_s": rate * trainer.batch_size}))
    return 0


def check(args):
    """Both implementations on one batch from the same weights: loss and gradients agree."""
    with tempfile.TemporaryDirectory(prefix="troupe_listops_check_") as work:
        data = args.data or prepare_data(args, work)
        config = listops_model.read_job(data)
        trees = listops_model.read_trees(os.path.join(data, "train.tsv"),
                                         config["training"]["batch_size"])
    results = {}
    for implementation in listops_model.IMPLEMENTATIONS:
        trainer = listops_model.Trainer(config, implementation, 1)
        loss = trainer.loss(trees)
        loss.backward()
        results[implementation] = [loss.detach()] + [p.grad for p in trainer.model.parameters()]
    worst = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                for a, b in zip(*results.values()))
    verdict = "PASS" if worst <= 1e-5 else "FAIL"
    print("recursive and batched on %d expressions: loss %.6f and %.6f, worst relative "
          "difference of the loss and every gradient %.2e: %s" % (
              len(trees), results["recursive"][0], results["batched"][0], worst, verdict))
    return 0 if verdict == "PASS" else 1


def compare(args):
    """troupe and PyTorch from the same weights on the same batches: every step's loss."""
    work = tempfile.mkdtemp(prefix="troupe_listops_compare_")
    data = prepare_data(args, work)
    overrides = args.set + QUIET + [
        "parallelism.stages=1", 'parallelism.mode="sync"', "parallelism.micro_batches=1",
        "data.shuffle=false", "metrics.log_interval=1", "training.epochs=1",
        "training.max_steps=%d" % args.steps]
    initial = os.path.join(work, "initial.safetensors")
    run_troupe_command(args, ["export", args.job, initial, "--initial"], overrides)
    run_troupe_command(args, ["train", args.job, "--quiet", "--out", os.path.join(work, "run")],
                       overrides + ['model.init_from="%s"' % initial])
    theirs = {}
    with open(os.path.join(work, "run", "metrics.jsonl")) as file:
        for record in map(json.loads, file):
            if "loss" in record and "test_loss" not in record and "event" not in record:
                theirs[record["step"]] = record["loss"]
    config = listops_model.read_job(data)
    trainer = listops_model.Trainer(config, "batched", 1)
    trainer.model.load_troupe_weights(read_safetensors(initial))
    trees = listops_model.read_trees(os.path.join(data, "train.tsv"))
    shutil.rmtree(work, ignore_errors=True)
    batch, worst = trainer.batch_size, 0.0
    steps = min(args.steps, len(trees) // batch)
    print(" step    troupe loss   PyTorch loss   relative difference")
    for step in range(1, steps + 1):
        mine = trainer.step(trees[(step - 1) * batch:step * batch])
        if step not in theirs:
            sys.exit("pytorch_listops: troupe logged no loss for step %d" % step)
        difference = abs(theirs[step] - mine) / abs(mine)
        worst = max(worst, difference)
        print("%5d   %12.7f   %12.7f   %.2e" % (step, theirs[step], mine, difference))
    verdict = "PASS" if worst <= args.tolerance else "FAIL"
    print("worst relative difference %.3e over %d steps (tolerance %g): %s" % (
        worst, steps, args.tolerance, verdict))
    return 0 if verdict == "PASS" else 1


# ---- the race ----------------------------------------------------------------------------------

def troupe_settings(args):
    """[(name, stages, overrides)]: async on 2 stages (the job as written), sync on one stage,
    sync on --stages stages at each of --micro-batches."""
    settings = [(ASYNC_SETTING, 2, ['parallelism.mode="async"', "parallelism.stages=2"]),
                ("sync-1-stage", 1, ["parallelism.stages=1", 'parallelism.mode="sync"',
                                     "parallelism.micro_batches=1"])]
    for micro in args.micro_batches:
        settings.append(("sync-%d-stages-m%d" % (args.stages, micro), args.stages,
                         ["parallelism.stages=%d" % args.stages, 'parallelism.mode="sync"',
                          "parallelism.micro_batches=%d" % micro]))
    return settings


def run_pytorch(args, implementation, choice, epochs, seed):
    """One PyTorch run in a process of its own, its lines shown as they come; its JSON line."""
    command = child_command(args, "train", implementation, choice.setting,
                            ["--epochs", str(epochs), "--seed", str(seed)])
    process = subprocess.Popen(command, env=tuning.environment(choice.setting),
                               stdout=subprocess.PIPE, text=True)
    last = ""
    for line in process.stdout:
        if line.startswith("epoch "):
            print("    pytorch " + line.rstrip(), flush=True)
        last = line
    if process.wait() != 0:
        sys.exit("pytorch_listops: the PyTorch run failed (%d)" % process.returncode)
    return json.loads(last)


def run_troupe(args, overrides, choice, out):
    """One `troupe train` of the race; its summary.json."""
    run_troupe_command(args, ["train", args.job, "--quiet", "--out", out],
                       args.set + overrides + tuning.job_overrides(choice.setting) + QUIET,
                       tuning.environment(choice.setting))
    with open(os.path.join(out, "summary.json")) as file:
        return json.load(file)


def median_time(times):
    """The median of times to A, a run that never reached it counting as endless."""
    value = statistics.median(float("inf") if t is None else t for t in times)
    return None if value == float("inf") else value


def race(args):
    work = tempfile.mkdtemp(prefix="troupe_listops_race_")
    args.data = prepare_data(args, work)
    config = listops_model.read_job(args.data)
    epochs = args.epochs or config["training"]["epochs"]
    batch, seed = config["training"]["batch_size"], config["training"]["seed"]
    implementation, pytorch = pytorch_choice(args)
    settings = troupe_settings(args)
    out = os.path.join(work, "run")
    choices = {name: tuning.troupe_choice(args, name, args.troupe, args.job, args.set + overrides,
                                          stages, out, batch, "instances/s")
               for name, stages, overrides in settings}
    rounds = []
    for index in range(args.rounds):
        print("round %d: pytorch %s, %d epoch(s)" % (index + 1, implementation, epochs), flush=True)
        mine = run_pytorch(args, implementation, pytorch, epochs, seed + index)
        target = mine["test_accuracy"]
        print("  pytorch: accuracy A = %.4f in T = %.1f s" % (target, mine["wall_s"]), flush=True)
        runs = {}
        order = settings if index % 2 == 0 else settings[::-1]
        for name, _, overrides in order:
            summary = run_troupe(args, overrides + [
                "training.epochs=%d" % epochs, "training.max_steps=0",
                "training.seed=%d" % (seed + index), "training.target_accuracy=%r" % target],
                choices[name], out)
            runs[name] = (summary["time_to_target_s"], summary["final_test_accuracy"],
                          summary["wall_s"])
            reached = "%.1f s" % runs[name][0] if runs[name][0] is not None else "not reached"
            print("  %-22s time to A %-12s final accuracy %.4f  (%.1f s in all)" % (
                name, reached, runs[name][1], runs[name][2]), flush=True)
        rounds.append((mine, runs))
    report = print_race(args, epochs, implementation, pytorch, choices, settings, rounds)
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report))
    return 0


def print_race(args, epochs, implementation, pytorch, choices, settings, rounds):
    accuracy = statistics.median(mine["test_accuracy"] for mine, _ in rounds)
    seconds = statistics.median(mine["wall_s"] for mine, _ in rounds)
    rate = statistics.median(mine["instances_per_s"] for mine, _ in rounds)
    rows = {name: {"reached": sum(runs[name][0] is not None for _, runs in rounds),
                   "time_to_target_s": median_time([runs[name][0] for _, runs in rounds]),
                   "final_accuracy": statistics.median(runs[name][1] for _, runs in rounds)}
            for name, _, _ in settings}
    sync = [name for name, _, _ in settings if name != ASYNC_SETTING]
    reached = [name for name in sync if rows[name]["time_to_target_s"] is not None]
    best = min(reached, key=lambda name: rows[name]["time_to_target_s"], default=None)
    print("\nListOps Tree-LSTM, %d epoch(s); medians of %d alternating round(s)" % (epochs,
                                                                            len(rounds)))
    print("PyTorch %s (%s): accuracy A %.4f, wall time T %.1f s" % (
        implementation, pytorch.label(), accuracy, seconds))
    print("  " + tuning.summary_line("pytorch " + implementation, pytorch, rate, "instances/s"))
    print("%-22s %8s %12s %10s %14s %14s" % ("troupe setting", "reached", "time to A",
                                             "accuracy", "vs PyTorch T", "vs best sync"))
    for name, _, _ in settings:
        row = rows[name]
        time_to = row["time_to_target_s"]
        row["vs_pytorch"] = time_to / seconds if time_to is not None else None
        row["vs_best_sync"] = (time_to / rows[best]["time_to_target_s"]
                               if time_to is not None and best else None)
        print("%-22s %8s %12s %10.4f %14s %14s%s" % (
            name, "%d/%d" % (row["reached"], len(rounds)),
            "%.1f s" % time_to if time_to is not None else "not reached", row["final_accuracy"],
            ratio_text(row["vs_pytorch"]), ratio_text(row["vs_best_sync"]),
            "  <- best sync" if name == best else ""))
        row["setting"] = choices[name].label()
    print("ratios: a setting's median time to A over PyTorch's median T (%.1f s), and over the "
          "best sync setting's median time to A (%s)" % (seconds, best or "none reached A"))
    bars = bar_lines(rows[ASYNC_SETTING], best)
    for line in bars["lines"]:
        print(line)
    for name, _, _ in settings:
        print("  %s (%s)" % (name, choices[name].label()))
    return {"epochs": epochs, "rounds": len(rounds), "implementation": implementation,
            "pytorch_setting": tuning.setting_text(pytorch.setting),
            "pytorch_accuracy": accuracy, "pytorch_wall_s": seconds, "best_sync": best,
            "troupe": rows, "bars_met": bars["met"]}


def ratio_text(value):
    return "%.2fx" % value if value is not None else "-"


def bar_lines(row, best):
    """The issue's two bars for the async setting, each as met or not."""
    checks = [("<= 0.7x PyTorch's T", row["vs_pytorch"], 0.7),
              ("<= 0.8x the best sync setting (%s)" % best, row["vs_best_sync"], 0.8)]
    lines, met = [], True
    for text, value, bar in checks:
        ok = value is not None and value <= bar
        met = met and ok
        lines.append("bar: %s time to A %s: %s (%s)" % (ASYNC_SETTING, text,
                                                        "met" if ok else "NOT met",
                                                        ratio_text(value)))
    return {"lines": lines, "met": met}


# ---- the command line --------------------------------------------------------------------------

def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["train", "check", "compare", "race", "speed"])
    parser.add_argument("--job", default=DEFAULT_JOB, help="troupe ListOps job (TOML)")
    parser.add_argument("--set", action="append", default=[], help="job override KEY=VALUE")
    parser.add_argument("--troupe", default="", help="troupe binary (default: build/apps/troupe)")
    parser.add_argument("--data", default=None,
                        help="a `troupe dataset` directory (default: written from the job)")
    parser.add_argument("--epochs", type=tuning.positive(int), default=None,
                        help="epochs of every run (default: the job's training.epochs)")
    parser.add_argument("--implementation", choices=listops_model.IMPLEMENTATIONS, default=None,
                        help="PyTorch's implementation (default: the faster in a probe)")
    parser.add_argument("--seed", type=int, default=None,
                        help="PyTorch's seed (default: the job's training.seed)")
    parser.add_argument("--steps", type=tuning.positive(int), default=20, help="compare: steps")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="compare: largest relative difference of a step's loss")
    parser.add_argument("--rounds", type=tuning.positive(int), default=3, help="race: rounds")
    parser.add_argument("--stages", type=tuning.positive(int), default=2,
                        help="race: stages of the sync pipelines")
    parser.add_argument("--micro-batches", type=counts, default=[1, 2, 4],
                        help="race: micro-batch counts of the sync pipelines, M1,M2,...")
    # train: --data is a directory of this run's own, removed at its end.
    parser.add_argument("--remove-data", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true",
                        help="small counts: 256 training and 64 test expressions, 1 epoch, 1 "
                             "round, probes of 0.2 s in 1 round")
    tuning.add_arguments(parser)
    args = parser.parse_args()
    args.troupe = troupe_binary(args.troupe)
    if args.quick:
        args.set = QUICK + args.set
        args.epochs = args.epochs or 1
        args.rounds, args.probe_seconds, args.probe_rounds = 1, 0.2, 1
    return args


def counts(text):
    try:
        values = [int(value) for value in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("%s: expected counts M1,M2,... of 1 or more" % text)
    return values


def main():
    args = parse_arguments()
    if args.mode == "speed":
        return speed(args)
    if args.mode == "check":
        return check(args)
    if args.mode == "compare":
        return compare(args)
    if args.mode == "race":
        return race(args)
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
