#!/usr/bin/env python3
"""troupe's CPU pipelines against one stage and against PyTorch, in alternating rounds.

Each comparison prints every round's figures, the medians and the ratios:

  fashion   The Fashion-MNIST MLP 784-1024-1024-1024-10 (ReLU, no dropout), plain SGD lr 0.05,
            batch 64, 3 epochs, test accuracy after every epoch, trained by PyTorch (Debian's
            python3-torch, the same model, batch and data standardization) and by troupe in
            several configurations. Reports training samples/s (time spent training) and the
            seconds until the first evaluation at or above 0.85 test accuracy (wall time,
            evaluations included, as troupe's time_to_target_s counts it). Each side first
            runs with the setting a short probe found fastest (tuning.py: PyTorch's
            OMP_WAIT_POLICY, threads and OPENBLAS_NUM_THREADS; each troupe configuration's
            parallelism.threads and spin_wait_ms), and the report names it beside the rate
            PyTorch's default settings had in the probe.
  pytorch-fashion  PyTorch's side of `fashion` alone (probed first, unless --pytorch-setting).
  pipeline  The MLP 784-2048-2048-2048-2048-10 on synthetic data, batch 64: one stage on one
            core, one stage on both cores, and two asynchronous stages with one core each, cut
            between whole blocks ("balanced") and where "measured" cuts (inside a layer).
  schedules apps/examples/fashion_mlp_sync.toml (4 stages) under the sync schedules gpipe,
            1f1b and zb-h1, --steps steps each, batch --batch in --micro-batches micro-batches;
            then calibrates this machine for that job and simulates the same three schedules
            (apps/examples/cluster_this_machine.toml), printing both orders.
  race      The time-to-accuracy race of async pipelines against the best sync setting (one
            stage, and the pipeline's 1F1B at each micro-batch count), through `troupe
            converge`, each ratio naming what it is against (converge_race.py).

    python3 apps/bench/cpu_pipeline.py fashion [--rounds 3] [--epochs 3] [--troupe PATH]
        [--probe-seconds 3] [--probe-rounds 2] [--pytorch-setting S] [--troupe-setting S]
    python3 apps/bench/cpu_pipeline.py pytorch-fashion [--epochs 3] [--pytorch-setting S]
    (the PyTorch side needs Debian's python3-torch: run it with /usr/bin/python3 where another
    python3 comes first on the PATH; a setting S is KEY=VALUE,... as tuning.py reads it, e.g.
    OMP_WAIT_POLICY=PASSIVE,threads=2 or threads=2,spin_wait_ms=10, or 'default')
    python3 apps/bench/cpu_pipeline.py pipeline [--rounds 5] [--steps 600] [--troupe PATH]
    python3 apps/bench/cpu_pipeline.py schedules [--rounds 5] [--steps 600] [--batch 64]
        [--micro-batches 4] [--no-simulation] [--troupe PATH]
    python3 apps/bench/cpu_pipeline.py race [--job JOB] [--set KEY=VALUE ...] [--seeds 3]
        [--stages 4] [--sync-micro-batches 1,2,4,8] [--async-setting NAME:KEY=V,... ...]
        [--prediction] [--out runs/race] [--troupe PATH]

Rounds alternate the contenders (A B C A B C ...), since this machine's speed drifts within
seconds; medians of the rounds are compared.
"""

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import converge_race
import tuning

FASHION = "/usr/share/datasets/fashion-mnist"
TARGET_ACCURACY = 0.85

FASHION_JOB = """
[model]
input_shape = [1, 28, 28]
layers = [
  { type = "flatten" },
  { type = "linear", out = 1024 }, { type = "relu" },
  { type = "linear", out = 1024 }, { type = "relu" },
  { type = "linear", out = 1024 }, { type = "relu" },
  { type = "linear", out = 10 },
]
[data]
dataset = "fashion-mnist"
path = "%(path)s"
[parallelism]
stages = 1
[training]
batch_size = 64
epochs = %(epochs)d
optimizer = "sgd"
lr = 0.05
target_accuracy = %(target)s
seed = 1
[metrics]
log_interval = 100000
"""

PIPELINE_JOB = """
[model]
input_shape = [784]
layers = [
  { type = "linear", out = 2048 }, { type = "relu" },
  { type = "linear", out = 2048 }, { type = "relu" },
  { type = "linear", out = 2048 }, { type = "relu" },
  { type = "linear", out = 2048 }, { type = "relu" },
  { type = "linear", out = 10 },
]
[data]
dataset = "synthetic"
synthetic_train = 65536
synthetic_test = 256
[training]
batch_size = 64
epochs = 1
max_steps = %(steps)d
lr = 0.01
[metrics]
log_interval = 100000
"""

# troupe configurations of the Fashion-MNIST race: name -> --set overrides.
FASHION_CONFIGS = {
    "troupe 1 stage": ["parallelism.stages=1"],
    "troupe 2 stages async": ["parallelism.stages=2", "parallelism.mode=\"async\"",
                              "parallelism.max_active_keys=2"],
    "troupe 2 stages async, measured cut": ["parallelism.stages=2", "parallelism.mode=\"async\"",
                                            "parallelism.max_active_keys=2",
                                            "parallelism.partition=\"measured\""],
    "troupe 2 stages sync 1f1b M=2": ["parallelism.stages=2", "parallelism.schedule=\"1f1b\"",
                                      "parallelism.micro_batches=2"],
}

PIPELINE_CONFIGS = {
    "1 stage, 1 core": ["parallelism.stages=1", "parallelism.threads=1"],
    "1 stage, 2 cores": ["parallelism.stages=1", "parallelism.threads=2"],
    "2 stages async, 1 core each": ["parallelism.stages=2", "parallelism.threads=2",
                                    "parallelism.mode=\"async\""],
    "2 stages async, measured cut, 1 core each": ["parallelism.stages=2", "parallelism.threads=2",
                                                  "parallelism.mode=\"async\"",
                                                  "parallelism.partition=\"measured\""],
}


def default_troupe():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "build", "apps", "troupe"))


def set_flags(overrides):
    """troupe's --set flags for `overrides`."""
    return [flag for override in overrides for flag in ("--set", override)]


def run_checked(command, env=None):
    """Runs `command`, or exits naming it and showing its stderr when it fails."""
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit("cpu_pipeline: %s failed (%d):\n%s" % (" ".join(command), result.returncode,
                                                        result.stderr))


def run_troupe(troupe, job_path, overrides, out_dir, env=None):
    run_checked([troupe, "train", job_path, "--quiet", "--out", out_dir] + set_flags(overrides),
                env)
    with open(os.path.join(out_dir, "summary.json")) as file:
        return json.load(file)


def read_idx(path):
    import numpy
    with gzip.open(path, "rb") as file:
        data = file.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return numpy.frombuffer(data, dtype=numpy.uint8, offset=4 + 4 * dims).reshape(shape)


def fashion_tensors(path):
    import torch
    images = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        pixels = read_idx(os.path.join(path, prefix + "-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(path, prefix + "-labels-idx1-ubyte.gz"))
        x = torch.tensor(pixels.reshape(len(pixels), -1), dtype=torch.float32) / 255.0
        images[split] = (x, torch.tensor(labels, dtype=torch.int64))
    mean = images["train"][0].mean()
    deviation = images["train"][0].std()
    for split in images:
        x, y = images[split]
        images[split] = ((x - mean) / deviation, y)
    return images


def pytorch_fashion_model():
    """The MLP, its SGD and its loss, seeded as troupe's job is."""
    import torch
    from torch import nn
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss()


def sgd_step(model, optimizer, loss_function, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss_function(model(x), y).backward()
    optimizer.step()


def pytorch_fashion(data, epochs):
    """Trains the MLP as troupe's job does; returns the figures troupe's summary has."""
    import torch
    model, optimizer, loss_function = pytorch_fashion_model()
    train_x, train_y = data["train"]
    test_x, test_y = data["test"]
    start = time.perf_counter()
    train_s = 0.0
    samples = 0
    time_to_target = None
    accuracy = 0.0
    for epoch in range(epochs):
        order = torch.randperm(len(train_x))
        epoch_start = time.perf_counter()
        for first in range(0, len(order) - 63, 64):
            batch = order[first:first + 64]
            sgd_step(model, optimizer, loss_function, train_x[batch], train_y[batch])
            samples += len(batch)
        train_s += time.perf_counter() - epoch_start
        with torch.no_grad():
            correct = sum(int((model(test_x[i:i + 256]).argmax(1) == test_y[i:i + 256]).sum())
                          for i in range(0, len(test_x), 256))
        accuracy = correct / len(test_x)
        if time_to_target is None and accuracy >= TARGET_ACCURACY:
            time_to_target = time.perf_counter() - start
    return {"samples_per_s": samples / train_s, "time_to_target_s": time_to_target,
            "final_test_accuracy": accuracy}


def pytorch_fashion_probe(data, seconds):
    """samples/s of the same training steps over `seconds`: one candidate of the probe."""
    import torch
    model, optimizer, loss_function = pytorch_fashion_model()
    train_x, train_y = data["train"]
    order = torch.randperm(len(train_x))
    batches = iter(range(0, 10 ** 9, 64))

    def step():
        first = next(batches) % (len(order) - 63)
        batch = order[first:first + 64]
        sgd_step(model, optimizer, loss_function, train_x[batch], train_y[batch])

    return {"samples_per_s": 64 * tuning.timed_rate(step, seconds=seconds)}


def pytorch_choice(args):
    """PyTorch's setting for `fashion`: --pytorch-setting, or the fastest in a probe whose
    candidates each train in a `pytorch-fashion` process of their own."""
    def measure(setting):
        command = [sys.executable, os.path.abspath(__file__), "pytorch-fashion", "--probe-child",
                   str(args.probe_seconds), "--pytorch-setting", tuning.setting_text(setting)]
        return tuning.child_result(command, setting, "the PyTorch probe")["samples_per_s"]

    return tuning.chosen(args.pytorch_setting, "pytorch", tuning.pytorch_candidates(), measure,
                         args, "samples/s")


def pytorch_fashion_command(args):
    """`pytorch-fashion`: one PyTorch run of `fashion` (or one probe candidate), a JSON line last;
    without --pytorch-setting, probed first and started again with the fastest setting."""
    if args.pytorch_setting is None:
        tuning.restart_with(pytorch_choice(args))
    import torch
    tuning.enter_pytorch(args.pytorch_setting, torch)
    data = fashion_tensors(FASHION)
    if args.probe_child is not None:
        print(json.dumps(pytorch_fashion_probe(data, args.probe_child)))
        return 0
    result = pytorch_fashion(data, args.epochs)
    choice = tuning.Choice(args.pytorch_setting, probed=args.default_rate is not None)
    print(tuning.summary_line("pytorch", choice, result["samples_per_s"], "samples/s",
                              args.default_rate, args.chosen_rate))
    result["setting"] = tuning.setting_text(args.pytorch_setting)
    print(json.dumps(result))
    return 0


def median_of(values):
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def report(results, baseline, fields):
    print("\nmedians over %d rounds:" % len(results[baseline]))
    for name, rounds in results.items():
        parts = []
        for field, label, higher_is_better in fields:
            value = median_of([r.get(field) for r in rounds])
            base = median_of([r.get(field) for r in results[baseline]])
            text = "%s %s" % (label, "-" if value is None else "%.1f" % value if value > 10
                              else "%.3f" % value)
            if value is not None and base and name != baseline:
                text += " (%.2fx %s)" % (value / base, baseline)
            parts.append(text)
        print("  %-32s %s" % (name, "  ".join(parts)))


def stages_of(overrides):
    """The parallelism.stages an override list sets (1 where none does)."""
    values = [o.split("=", 1)[1] for o in overrides if o.startswith("parallelism.stages=")]
    return int(values[-1]) if values else 1


def fashion(args):
    results = {"pytorch": []}
    results.update({name: [] for name in FASHION_CONFIGS})
    with tempfile.TemporaryDirectory() as directory:
        job = os.path.join(directory, "fashion_mlp_race.toml")
        with open(job, "w") as file:
            file.write(FASHION_JOB % {"path": FASHION, "epochs": args.epochs,
                                      "target": TARGET_ACCURACY})
        # Each side as its users would run it: the fastest setting of a short probe.
        pytorch = pytorch_choice(args)
        troupe = {name: tuning.troupe_choice(args, name, args.troupe, job, overrides,
                                             stages_of(overrides),
                                             os.path.join(directory, "probe"), 64, "samples/s")
                  for name, overrides in FASHION_CONFIGS.items()}
        pytorch_run = [sys.executable, os.path.abspath(__file__), "pytorch-fashion", "--epochs",
                       str(args.epochs), "--pytorch-setting", tuning.setting_text(pytorch.setting)]
        for round_index in range(args.rounds):
            # A process of its own, gone before troupe runs: PyTorch's OpenMP threads keep
            # spinning on the cores for a while after their last parallel region.
            results["pytorch"].append(tuning.child_result(pytorch_run, pytorch.setting,
                                                          "the PyTorch run"))
            for name, overrides in FASHION_CONFIGS.items():
                setting = troupe[name].setting
                results[name].append(run_troupe(
                    args.troupe, job, overrides + tuning.job_overrides(setting),
                    os.path.join(directory, "run"), tuning.environment(setting)))
            for name, rounds in results.items():
                r = rounds[-1]
                print("round %d  %-32s samples/s %8.1f  time to %.2f: %s s  accuracy %.4f" % (
                    round_index + 1, name, r["samples_per_s"], TARGET_ACCURACY,
                    "-" if r["time_to_target_s"] is None else "%.1f" % r["time_to_target_s"],
                    r["final_test_accuracy"]), flush=True)
    report(results, "pytorch", [("samples_per_s", "samples/s", True),
                                ("time_to_target_s", "s to 0.85", False),
                                ("final_test_accuracy", "accuracy", True)])
    print("settings:")
    rate = median_of([r["samples_per_s"] for r in results["pytorch"]])
    print("  " + tuning.summary_line("pytorch", pytorch, rate, "samples/s"))
    for name in FASHION_CONFIGS:
        print("  %s (%s)" % (name, troupe[name].label()))


def pipeline(args):
    results = {name: [] for name in PIPELINE_CONFIGS}
    with tempfile.TemporaryDirectory() as directory:
        job = os.path.join(directory, "mlp_2048.toml")
        with open(job, "w") as file:
            file.write(PIPELINE_JOB % {"steps": args.steps})
        for round_index in range(args.rounds):
            for name, overrides in PIPELINE_CONFIGS.items():
                summary = run_troupe(args.troupe, job, overrides, os.path.join(directory, "run"))
                results[name].append(summary)
                print("round %d  %-30s samples/s %8.1f" % (round_index + 1, name,
                                                           summary["samples_per_s"]), flush=True)
    report(results, "1 stage, 1 core", [("samples_per_s", "samples/s", True)])
    two = median_of([r["samples_per_s"] for r in results["2 stages async, 1 core each"]])
    both = median_of([r["samples_per_s"] for r in results["1 stage, 2 cores"]])
    print("  2 stages async / 1 stage on both cores: %.2fx" % (two / both))
    cut = median_of([r["samples_per_s"] for r in
                     results["2 stages async, measured cut, 1 core each"]])
    print("  2 stages async, measured cut / 1 stage on both cores: %.2fx" % (cut / both))


def schedules(args):
    here = os.path.dirname(os.path.abspath(__file__))
    job = os.path.normpath(os.path.join(here, "..", "examples", "fashion_mlp_sync.toml"))
    cluster = os.path.normpath(os.path.join(here, "..", "examples", "cluster_this_machine.toml"))
    names = ["gpipe", "1f1b", "zb-h1"]
    shape = ["training.batch_size=%d" % args.batch,
             "parallelism.micro_batches=%d" % args.micro_batches,
             "training.max_steps=%d" % args.steps, "training.epochs=1"]
    print("4 stages, batch %d in %d micro-batches, %d steps per run" % (
        args.batch, args.micro_batches, args.steps), flush=True)
    results = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as directory:
        for round_index in range(args.rounds):
            for name in names:
                overrides = shape + ["parallelism.schedule=\"%s\"" % name]
                summary = run_troupe(args.troupe, job, overrides, os.path.join(directory, "run"))
                results[name].append(summary)
                print("round %d  %-6s samples/s %8.1f" % (round_index + 1, name,
                                                         summary["samples_per_s"]), flush=True)
        report(results, "gpipe", [("samples_per_s", "samples/s", True)])
        if args.no_simulation:
            return
        # The same sweep in the simulator, charged with this machine's times measured just now.
        profile = os.path.join(directory, "profile.json")
        run_checked([args.troupe, "calibrate", job, "--out", profile] + set_flags(shape))
        run_checked([args.troupe, "simulate", job, "--cluster", cluster, "--profile", profile,
                     "--out", os.path.join(directory, "simulation"),
                     "--sweep", "parallelism.schedule=" + ",".join(names)] + set_flags(shape))
        with open(os.path.join(directory, "simulation", "summary.json")) as file:
            simulated = {run["sweep_value"]: run["samples_per_s"]
                         for run in json.load(file)["sweep"]["runs"]}
    measured = {name: median_of([r["samples_per_s"] for r in results[name]]) for name in names}
    print("\nsimulated with a profile calibrated after the rounds:")
    for name in names:
        text = "  %-32s samples/s %.1f" % (name, simulated[name])
        if name != "gpipe":
            text += " (%.2fx gpipe)" % (simulated[name] / simulated["gpipe"])
        print(text + "  prediction %+.1f %%" % (100 * (simulated[name] / measured[name] - 1)))
    print("order, slowest first (~: within 1 %%): measured %s; simulated %s" % (
        slowest_first(measured), slowest_first(simulated)))


def slowest_first(rates):
    """The names of `rates` from the slowest, '<' between them, '~' where within 1 %."""
    names = sorted(rates, key=lambda name: rates[name])
    text = names[0]
    for before, name in zip(names, names[1:]):
        text += (" ~ " if rates[name] < 1.01 * rates[before] else " < ") + name
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["fashion", "pipeline", "schedules", "race",
                                         "pytorch-fashion"])
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=64, help="schedules: training.batch_size")
    parser.add_argument("--micro-batches", type=int, default=4,
                        help="schedules: parallelism.micro_batches")
    parser.add_argument("--no-simulation", action="store_true",
                        help="schedules: measure only, without calibrating and simulating")
    parser.add_argument("--troupe", default=default_troupe())
    tuning.add_arguments(parser)
    converge_race.add_arguments(parser)
    args = parser.parse_args()
    if args.rounds is None:
        args.rounds = 3 if args.what == "fashion" else 5
    if args.what == "pytorch-fashion":  # one PyTorch run of `fashion`, a JSON line last
        return pytorch_fashion_command(args)
    if not os.path.exists(args.troupe):
        sys.exit("cpu_pipeline: no troupe at %s (build it, or pass --troupe)" % args.troupe)
    if args.what == "race":
        return converge_race.race(args)
    {"fashion": fashion, "pipeline": pipeline, "schedules": schedules}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
