#!/usr/bin/env python3
"""troupe's CPU pipelines against one stage and against PyTorch, in alternating rounds.

Two comparisons, each printing every round's figures, the medians and the ratios:

  fashion   The Fashion-MNIST MLP 784-1024-1024-1024-10 (ReLU, no dropout), plain SGD lr 0.05,
            batch 64, 3 epochs, test accuracy after every epoch, trained by PyTorch (Debian's
            python3-torch, 2 threads, the same model, batch and data standardization) and by
            troupe in several configurations. Reports training samples/s (time spent training)
            and the seconds until the first evaluation at or above 0.85 test accuracy
            (wall time, evaluations included, as troupe's time_to_target_s counts it).
  pipeline  The MLP 784-2048-2048-2048-2048-10 on synthetic data, batch 64: one stage on one
            core, one stage on both cores, and two asynchronous stages with one core each, cut
            between whole blocks ("balanced") and where "measured" cuts (inside a layer).
  schedules apps/examples/fashion_mlp_sync.toml (4 stages) under the sync schedules gpipe,
            1f1b and zb-h1, --steps steps each, batch --batch in --micro-batches micro-batches;
            then calibrates this machine for that job and simulates the same three schedules
            (apps/examples/cluster_this_machine.toml), printing both orders.

    python3 apps/bench/cpu_pipeline.py fashion [--rounds 3] [--epochs 3] [--troupe PATH]
    (the PyTorch side needs Debian's python3-torch: run it with /usr/bin/python3 where another
    python3 comes first on the PATH)
    python3 apps/bench/cpu_pipeline.py pipeline [--rounds 5] [--steps 600] [--troupe PATH]
    python3 apps/bench/cpu_pipeline.py schedules [--rounds 5] [--steps 600] [--batch 64]
        [--micro-batches 4] [--no-simulation] [--troupe PATH]

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


def run_checked(command):
    """Runs `command`, or exits naming it and showing its stderr when it fails."""
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("cpu_pipeline: %s failed (%d):\n%s" % (" ".join(command), result.returncode,
                                                        result.stderr))


def run_troupe(troupe, job_path, overrides, out_dir):
    run_checked([troupe, "train", job_path, "--quiet", "--out", out_dir] + set_flags(overrides))
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


def pytorch_fashion(data, epochs):
    """Trains the MLP as troupe's job does; returns the figures troupe's summary has."""
    import torch
    from torch import nn
    torch.set_num_threads(2)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_function = nn.CrossEntropyLoss()
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
            optimizer.zero_grad(set_to_none=True)
            loss = loss_function(model(train_x[batch]), train_y[batch])
            loss.backward()
            optimizer.step()
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


def fashion(args):
    results = {"pytorch": []}
    results.update({name: [] for name in FASHION_CONFIGS})
    with tempfile.TemporaryDirectory() as directory:
        job = os.path.join(directory, "fashion_mlp_race.toml")
        with open(job, "w") as file:
            file.write(FASHION_JOB % {"path": FASHION, "epochs": args.epochs,
                                      "target": TARGET_ACCURACY})
        for round_index in range(args.rounds):
            # A process of its own, gone before troupe runs: PyTorch's OpenMP threads keep
            # spinning on the cores for a while after their last parallel region.
            child = subprocess.run([sys.executable, os.path.abspath(__file__), "pytorch-fashion",
                                    "--epochs", str(args.epochs)], capture_output=True, text=True)
            if child.returncode != 0:
                sys.exit("cpu_pipeline: the PyTorch run failed:\n" + child.stderr)
            results["pytorch"].append(json.loads(child.stdout.splitlines()[-1]))
            for name, overrides in FASHION_CONFIGS.items():
                out = os.path.join(directory, "run")
                results[name].append(run_troupe(args.troupe, job, overrides, out))
            for name, rounds in results.items():
                r = rounds[-1]
                print("round %d  %-32s samples/s %8.1f  time to %.2f: %s s  accuracy %.4f" % (
                    round_index + 1, name, r["samples_per_s"], TARGET_ACCURACY,
                    "-" if r["time_to_target_s"] is None else "%.1f" % r["time_to_target_s"],
                    r["final_test_accuracy"]), flush=True)
    report(results, "pytorch", [("samples_per_s", "samples/s", True),
                                ("time_to_target_s", "s to 0.85", False),
                                ("final_test_accuracy", "accuracy", True)])


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
    parser.add_argument("what", choices=["fashion", "pipeline", "schedules", "pytorch-fashion"])
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=64, help="schedules: training.batch_size")
    parser.add_argument("--micro-batches", type=int, default=4,
                        help="schedules: parallelism.micro_batches")
    parser.add_argument("--no-simulation", action="store_true",
                        help="schedules: measure only, without calibrating and simulating")
    parser.add_argument("--troupe", default=default_troupe())
    args = parser.parse_args()
    if args.rounds is None:
        args.rounds = 3 if args.what == "fashion" else 5
    if args.what == "pytorch-fashion":  # one PyTorch run of `fashion`, as a JSON line
        print(json.dumps(pytorch_fashion(fashion_tensors(FASHION), args.epochs)))
        return 0
    if not os.path.exists(args.troupe):
        sys.exit("cpu_pipeline: no troupe at %s (build it, or pass --troupe)" % args.troupe)
    {"fashion": fashion, "pipeline": pipeline, "schedules": schedules}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
