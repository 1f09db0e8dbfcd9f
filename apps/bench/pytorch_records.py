#!/usr/bin/env python3
"""The models of a troupe job over whole records (fortunes), in PyTorch: checked and raced.

Two jobs, each a graph over the records of a text-records dataset, one instance per fortune:
- the LSTM language model (apps/examples/fortunes_lstm.toml): an embedding, an lstm_cell looped
  over each fortune's bytes (each visit's row [h | c]) and a linear head over every position's
  [h | c]. PyTorch runs it on each batch padded to its longest fortune and packed
  (pack_padded_sequence), so that its LSTM computes the real positions only. nn.LSTM hands back
  h at every position but c only at the last, so the cell is LSTMCell's arithmetic over the
  packed time steps (the input projection of every position in one GEMM, as nn.LSTM does on the
  CPU, then one addmm per step: about nn.LSTM's own speed on these shapes) (lstm_model.py);
- the GPT over whole fortunes (apps/examples/gpt_fortunes_whole.toml): troupe attends within
  each fortune of a packed key; PyTorch runs the same blocks on each batch padded to its longest
  fortune, the pads' labels ignored (gpt_records_model.py).
Both load troupe's safetensors files as they are (records_data.py names the parameters as the
job's nodes do). A job whose nodes hold a transformer_block is the GPT, any other the LSTM.

    pytorch_records.py compare JOB [--steps 20] [--padding longest]
        troupe exports the job's initial weights and trains `steps` steps on one stage in sync
        mode (log_interval 1); PyTorch loads the same weights and trains on the same batches (the
        same instances, troupe's seeded order) with the same Adam and clipping; every step's loss
        (the mean over its real tokens) must agree within --tolerance (relative, default 1e-4).
        --padding longest runs troupe on padded batches: the same losses again.
    pytorch_records.py speed JOB [--rounds 3] [--steps 100] [--quick]
        in alternating rounds, trains troupe unpadded (the job's own stages and mode, and one
        stage in sync mode), troupe on padded batches (data.padding = "longest", each layout)
        and PyTorch padded (and packed, for the LSTM), all from the same initial weights over
        the same batches; prints each one's real (unpadded) tokens per second over `steps` steps after 3 warm-up
        steps and its validation loss after those same real tokens (medians), the ratios, and
        whether the bars hold: troupe unpadded >= 1.3x troupe padded and >= 1.0x PyTorch, at a
        validation loss within 1 % of PyTorch's. Each side is tuned first as its users tune it
        (tuning.py); --quick is a short smoke run of the whole thing (1 round, 3 steps, short
        probes).

Both read the job's instances as troupe does: `troupe dataset JOB --out DIR` writes them.

PyTorch's OMP_WAIT_POLICY, threads and OpenBLAS threads are chosen by tuning.py's probe before
any rate is taken (tuning.chosen; each timed child enters the choice with tuning.enter_pytorch),
and the report names the setting beside the default's rate.
"""

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import tuning
import gpt_records_model
import lstm_model
from gpt_model import learning_rate_at, make_optimizer
from records_data import batches, read_dataset, total_steps

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WARMUP_STEPS = tuning.WARMUP_STEPS
# The issue's bars: troupe's real tokens/s over its padded runs' and over PyTorch's, and the
# validation losses' largest relative distance from PyTorch's.
PADDED_BAR, PYTORCH_BAR, LOSS_BAR = 1.3, 1.0, 0.01
failed = False


def family_of(config):
    """The module of the job's model: gpt_records_model where a node holds a transformer
    block, lstm_model otherwise (each exits naming what it needs when the job differs)."""
    kinds = {layer["type"] for node in config["model"].get("nodes") or []
             for layer in node["layers"]}
    return gpt_records_model if "transformer_block" in kinds else lstm_model


def pytorch_run(config, data, initial, steps, seconds=None):
    """Trains WARMUP_STEPS + `steps` steps (or the warm-up and then `seconds`) from `initial`:
    {"tokens_per_s": real tokens/s of the timed steps, "validation_loss": after them}."""
    training = config["training"]
    total = total_steps(config, len(data["train"]),
                        WARMUP_STEPS + (steps if steps is not None else 10 ** 9))
    family = family_of(config)
    model = family.Model(config)
    model.load_troupe(initial)
    optimizer = make_optimizer(model, training)
    plan = batches(config, data["train"], total)
    timed_tokens, start = 0, None
    for step, instances in enumerate(plan):
        if step == WARMUP_STEPS:
            start = time.perf_counter()
        family.train_step(model, optimizer, training, instances,
                          learning_rate_at(training, step, total))
        if start is not None:
            timed_tokens += sum(len(tokens) for tokens, _ in instances)
            if seconds is not None and time.perf_counter() - start >= seconds and \
                    step > WARMUP_STEPS:
                break
    elapsed = time.perf_counter() - start
    result = {"tokens_per_s": timed_tokens / elapsed}
    if seconds is None:
        result["validation_loss"] = family.validation_loss(model, data["validation"])
    return result


# ---- running troupe ----------------------------------------------------------------------------

def run_troupe(binary, arguments):
    result = subprocess.run([binary] + arguments, capture_output=True, text=True)
    if result.returncode != 0:
        global failed
        failed = True
        sys.exit("pytorch_records: troupe %s exited with %d:\n%s" % (
            " ".join(arguments), result.returncode, result.stdout + result.stderr))
    return result.stdout


def settings(pairs):
    return [item for pair in pairs for item in ("--set", pair)]


def scratch_directory(prefix):
    """A fresh directory, removed when this program ends well (kept, for its logs, otherwise)."""
    work = tempfile.mkdtemp(prefix=prefix)
    atexit.register(lambda: shutil.rmtree(work, ignore_errors=True) if not failed else None)
    return work


QUIET = ["checkpoint.interval_steps=0", "checkpoint.interval_s=0", "metrics.progress=false"]


def job_data(args, work):
    """The job's data as troupe reads it (`troupe dataset` into WORK/data: the resolved job and
    its instances), the data read, and the job's initial weights (`troupe export --initial`)."""
    directory = os.path.join(work, "data")
    run_troupe(args.troupe, ["dataset", args.job, "--out", directory] + settings(args.set))
    initial = os.path.join(work, "initial.safetensors")
    run_troupe(args.troupe, ["export", args.job, initial, "--initial"] + settings(args.set))
    config, data = read_dataset(directory)
    return directory, config, data, initial


def metrics_of(out):
    """(step losses {step: loss}, the last validation loss) of a troupe run's metrics.jsonl."""
    losses, validation = {}, None
    with open(os.path.join(out, "metrics.jsonl")) as file:
        for line in file:
            record = json.loads(line)
            if "test_loss" in record:
                validation = record["test_loss"]
            elif "loss" in record and "event" not in record:
                losses[record["step"]] = record["loss"]
    return losses, validation


# ---- compare -----------------------------------------------------------------------------------

def compare(args):
    work = scratch_directory("troupe_records_compare_")
    _, config, data, initial = job_data(args, work)
    layout = ["parallelism.stages=1", "parallelism.mode=sync", "parallelism.micro_batches=1",
              'data.padding="%s"' % args.padding, "metrics.log_interval=1",
              "training.max_steps=%d" % args.steps, 'model.init_from="%s"' % initial]
    out = os.path.join(work, "run")
    run_troupe(args.troupe, ["train", args.job, "--quiet", "--out", out] + settings(
        args.set + QUIET + layout))
    theirs, their_validation = metrics_of(out)
    training = config["training"]
    family = family_of(config)
    model = family.Model(config)
    model.load_troupe(initial)
    optimizer = make_optimizer(model, training)
    steps = total_steps(config, len(data["train"]), args.steps)
    print("troupe 1 stage sync, data.padding %s, against PyTorch %s: %d steps of %d fortunes"
          % (args.padding, torch.__version__, steps, training["batch_size"]))
    print(" step    troupe loss   PyTorch loss   relative difference")
    worst = 0.0
    for step, instances in enumerate(batches(config, data["train"], steps)):
        loss = family.train_step(model, optimizer, training, instances,
                                 learning_rate_at(training, step, steps))
        if step + 1 not in theirs:
            sys.exit("pytorch_records: troupe logged no loss for step %d" % (step + 1))
        difference = abs(theirs[step + 1] - loss) / abs(loss)
        worst = max(worst, difference)
        print("%5d   %12.7f   %12.7f   %.2e" % (step + 1, theirs[step + 1], loss, difference))
    # The validation split read alike: the same loss over it after the same steps.
    ours = family.validation_loss(model, data["validation"])
    difference = abs(their_validation - ours) / abs(ours)
    worst = max(worst, difference)
    print("validation %12.7f   %12.7f   %.2e   (%d instances)" % (
        their_validation, ours, difference, len(data["validation"])))
    verdict = "PASS" if worst <= args.tolerance else "FAIL"
    print("worst relative difference %.3e over %d steps and the validation loss (tolerance %g): %s"
          % (worst, steps, args.tolerance, verdict))
    return 0 if verdict == "PASS" else 1


# ---- speed -------------------------------------------------------------------------------------

def layouts_of(config):
    """{name: overrides}: the job's own stages and mode, and one stage in sync mode; each unpadded
    and on padded batches."""
    p = config["parallelism"]
    own = "%d stage%s %s" % (p["stages"], "s" if p["stages"] > 1 else "", p["mode"])
    layouts = {own: []}
    if own != "1 stage sync":
        layouts["1 stage sync"] = ["parallelism.stages=1", "parallelism.mode=sync",
                                   "parallelism.micro_batches=1"]
    result = {}
    for name, overrides in layouts.items():
        result["troupe " + name] = overrides + ['data.padding="none"']
        result["troupe %s padded" % name] = overrides + ['data.padding="longest"']
    return result


def pytorch_command(args, directory, initial, setting):
    return [sys.executable, os.path.abspath(__file__), "pytorch-speed", args.job, "--data",
            directory, "--initial", initial, "--steps", str(args.steps), "--pytorch-setting",
            tuning.setting_text(setting)]


def pytorch_speed(args):
    """A child process of `speed`: PyTorch's real tokens/s (and validation loss) as JSON."""
    tuning.enter_pytorch(args.pytorch_setting or {}, torch)
    config, data = read_dataset(args.data)
    print(json.dumps(pytorch_run(config, data, args.initial,
                                 None if args.probe_child else args.steps,
                                 seconds=args.probe_child)))
    return 0


def real_tokens_per_step(plan):
    return [sum(len(tokens) for tokens, _ in instances) for instances in plan]


def speed(args):
    work = scratch_directory("troupe_records_speed_")
    directory, config, data, initial = job_data(args, work)
    steps = WARMUP_STEPS + args.steps
    if steps > total_steps(config, len(data["train"]), steps):
        sys.exit("pytorch_records: %d steps are more than the job's training.epochs allow (%d)"
                 % (steps, total_steps(config, len(data["train"]), steps)))
    plan = batches(config, data["train"], steps)
    real = real_tokens_per_step(plan)
    timed_tokens = sum(real[WARMUP_STEPS:])
    padded_tokens = sum(len(instances) * max(len(t) for t, _ in instances) for instances in plan)
    layouts = layouts_of(config)
    common = args.set + ['model.init_from="%s"' % initial]
    # A probe's runs evaluate a few validation instances only; the timed runs all of them.
    keys = {name: common + overrides for name, overrides in layouts.items()}
    probe_keys = {name: value + ["data.test_samples=16"] for name, value in keys.items()}
    out = os.path.join(work, "run")
    pytorch = tuning.chosen(
        args.pytorch_setting, "pytorch", tuning.pytorch_candidates(),
        lambda setting: tuning.child_result(
            pytorch_command(args, directory, initial, setting) +
            ["--probe-child", str(args.probe_seconds)], setting, "the PyTorch probe")[
                "tokens_per_s"], args, "tokens/s")
    mean_tokens = timed_tokens / args.steps
    stages = {name: 1 if "parallelism.stages=1" in overrides else config["parallelism"]["stages"]
              for name, overrides in layouts.items()}
    troupe = {name: tuning.troupe_choice(args, name, args.troupe, args.job, probe_keys[name],
                                         stages[name], out, mean_tokens, "tokens/s")
              for name in layouts}
    pytorch_name = family_of(config).PYTORCH_NAME
    rates = {name: [] for name in [pytorch_name] + list(layouts)}
    losses = {name: [] for name in rates}
    for round_index in range(args.rounds):
        names = list(rates) if round_index % 2 == 0 else list(reversed(list(rates)))
        for name in names:
            if name == pytorch_name:
                result = tuning.child_result(pytorch_command(args, directory, initial,
                                                             pytorch.setting),
                                             pytorch.setting, "the PyTorch run")
                rate, loss = result["tokens_per_s"], result["validation_loss"]
            else:
                setting = troupe[name].setting
                steps_per_s = tuning.troupe_rate(
                    args.troupe, args.job, keys[name] + tuning.job_overrides(setting),
                    args.steps, out, 1.0, env=tuning.environment(setting))
                rate, loss = steps_per_s * mean_tokens, metrics_of(out)[1]
            rates[name].append(rate)
            losses[name].append(loss)
        print("round %d: " % (round_index + 1) + "  ".join(
            "%s %.0f" % (name, values[-1]) for name, values in rates.items()), flush=True)
    report(args, config, pytorch_name, rates, losses, pytorch, troupe,
           {"timed_tokens": timed_tokens, "tokens": sum(real), "padded_tokens": padded_tokens})
    return 0


def median_of(values):
    return statistics.median(values) if None not in values else float("nan")


def verdict(met):
    return "met" if met else "NOT met"


def report(args, config, pytorch_name, rates, losses, pytorch, troupe, tokens):
    rate = {name: statistics.median(values) for name, values in rates.items()}
    loss = {name: median_of(values) for name, values in losses.items()}
    print("\n%s over whole fortunes, batch %d fortunes of at most %d bytes, PyTorch %s; padded "
          "batches hold %.2fx the real tokens; median of %d alternating rounds of %d steps after "
          "%d warm-up steps; validation loss after the same %d real tokens"
          % (family_of(config).describe(config), config["training"]["batch_size"],
             config["data"]["context"], torch.__version__, tokens["padded_tokens"] /
             tokens["tokens"], args.rounds, args.steps, WARMUP_STEPS, tokens["tokens"]))
    print("%-36s %16s %16s" % ("configuration", "real tokens/s", "validation loss"))
    for name in rates:
        print("%-36s %16.0f %16.4f" % (name, rate[name], loss[name]))
    unpadded = [name for name in rates if name.startswith("troupe") and "padded" not in name]
    best = max(unpadded, key=lambda name: rate[name])
    best_padded = max((name + " padded" for name in unpadded), key=lambda name: rate[name])
    print("ratios of real tokens/s:")
    for name in unpadded:
        print("  %-72s %6.2f" % ("%s / %s padded" % (name, name), rate[name] /
                                 rate[name + " padded"]))
    padded_ratio, pytorch_ratio = rate[best] / rate[best_padded], rate[best] / rate[pytorch_name]
    print("  %-72s %6.2f   bar >= %.1f: %s" % ("troupe unpadded (%s) / troupe padded (%s)" % (
        best[len("troupe "):], best_padded[len("troupe "):]), padded_ratio, PADDED_BAR,
        verdict(padded_ratio >= PADDED_BAR)))
    print("  %-72s %6.2f   bar >= %.1f: %s" % ("troupe unpadded (%s) / %s" % (
        best[len("troupe "):], pytorch_name), pytorch_ratio, PYTORCH_BAR,
        verdict(pytorch_ratio >= PYTORCH_BAR)))
    print("validation loss after the same real tokens, relative to PyTorch's:")
    distances = {}
    for name in rates:
        if name != pytorch_name:
            distances[name] = (loss[name] - loss[pytorch_name]) / loss[pytorch_name]
            print("  %-72s %+6.2f %%" % (name, 100 * distances[name]))
    within = all(abs(distances[name]) <= LOSS_BAR for name in (best, best_padded))
    print("  %-72s bar within %.0f %%: %s" % ("the fastest unpadded and padded", 100 * LOSS_BAR,
                                             verdict(within)))
    print("settings:")
    print("  " + tuning.summary_line("pytorch", pytorch, rate[pytorch_name], "tokens/s"))
    for name, choice in troupe.items():
        print("  %s (%s)" % (name, choice.label()))
    print(json.dumps({"real_tokens_per_s": rate, "validation_loss": loss,
                      "padded_over_real_tokens": tokens["padded_tokens"] / tokens["tokens"],
                      "unpadded_over_padded": padded_ratio, "unpadded_over_pytorch": pytorch_ratio,
                      "bars_met": padded_ratio >= PADDED_BAR and pytorch_ratio >= PYTORCH_BAR and
                      within}))


# ---- the command line --------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["compare", "speed", "pytorch-speed"])
    parser.add_argument("job", help="troupe job file (TOML), e.g. apps/examples/fortunes_lstm.toml")
    parser.add_argument("--set", action="append", default=[], help="job override KEY=VALUE")
    parser.add_argument("--troupe", default="", help="troupe binary (default: build/apps/troupe)")
    parser.add_argument("--steps", type=tuning.positive(int), default=None,
                        help="compare: steps (20); speed: timed steps after the warm-up (100)")
    parser.add_argument("--rounds", type=tuning.positive(int), default=3)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--padding", choices=["none", "longest"], default="none",
                        help="compare: troupe's data.padding")
    parser.add_argument("--quick", action="store_true",
                        help="speed: 1 round of 3 steps with short probes (a smoke run)")
    # pytorch-speed (a child process of speed): the `troupe dataset` directory.
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--initial", help=argparse.SUPPRESS)
    tuning.add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.probe_seconds, args.probe_rounds = 1, 0.05, 1
        args.steps = args.steps or 3
    args.steps = args.steps or (20 if args.mode == "compare" else 100)
    if not args.troupe:
        built = os.path.join(REPOSITORY, "build", "apps", "troupe")
        args.troupe = built if os.path.exists(built) else "troupe"
    if args.mode == "pytorch-speed":
        return pytorch_speed(args)
    if args.mode == "compare" and args.pytorch_setting is not None:
        tuning.enter_pytorch(args.pytorch_setting, torch)
    try:
        return compare(args) if args.mode == "compare" else speed(args)
    except SystemExit as failure:
        global failed
        failed = failed or failure.code not in (0, None)  # keep the runs' logs
        raise


if __name__ == "__main__":
    sys.exit(main())
