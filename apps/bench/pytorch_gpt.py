#!/usr/bin/env python3
"""The GPT of a troupe job, built in PyTorch: checked against troupe, trained, and timed.

The model, the data and the training step are gpt_model.py's: the job's blocks, named as
troupe names them (troupe's safetensors files load with load_state_dict), and troupe's text
data rebuilt byte for byte.

    pytorch_gpt.py compare JOB [--steps 50] [--set KEY=VALUE ...]
        troupe exports the job's initial weights and trains `steps` steps in sync mode with
        data.shuffle = false and log_interval 1; PyTorch loads the same weights, trains on the
        same batches with the same AdamW, schedule and clipping, and every step's loss is
        compared: exit status 0 when all are within --tolerance (relative, default 1e-4).
    pytorch_gpt.py train JOB [--minutes 15]
        trains the job's model in PyTorch for a wall-clock budget (the cosine schedule is
        planned for the steps the budget allows, measured over the first steps) and prints
        the held-out bits per byte.
    pytorch_gpt.py speed JOB [--rounds 3] [--steps 20]
        alternates rounds of troupe (one stage, and the pipeline configurations listed by
        --pipelines) and PyTorch on the same model, batch and context, prints tokens/s of
        each (medians) and the ratios to PyTorch. Each side is timed over `steps` steps after
        3 warm-up steps that are not counted (troupe's from its per-step metrics records).

PyTorch runs on the CPU, or with --device cuda on the GPU, where troupe's runs get
parallelism.devices = "cuda" too. `train` and `speed` first tune each side as its users do
(tuning.py): a short probe of PyTorch's OMP_WAIT_POLICY, threads and OPENBLAS_NUM_THREADS
(--probe-seconds, --probe-rounds; --pytorch-setting KEY=VALUE,... or --threads N skips it), and
in `speed` of each troupe configuration's parallelism.threads and spin_wait_ms
(--troupe-setting skips it); they print the setting chosen beside the rate of PyTorch's
default settings in the probe. --precision fp32|tf32|bf16 sets both sides' GEMM arithmetic:
troupe's training.precision, and PyTorch's TF32 matmuls or bf16 autocast (fp32 master weights
either way).
"""

import argparse
import atexit
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import gpt_model
import tuning
from gpt_model import Model, learning_rate_at, make_optimizer, read_safetensors, text_splits, \
    train_step, validation_loss

# speed: steps each side runs before its timing starts (set-up, allocation, the GEMM search).
WARMUP_STEPS = tuning.WARMUP_STEPS
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- running troupe ----------------------------------------------------------------------------

def troupe_binary(given):
    if given:
        return given
    built = os.path.join(REPOSITORY, "build", "apps", "troupe")
    return built if os.path.exists(built) else "troupe"


def run_troupe(binary, arguments):
    result = subprocess.run([binary] + arguments, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        global failed
        failed = True
        raise SystemExit(f"pytorch_gpt: troupe {' '.join(arguments)} exited with {result.returncode}")
    return result.stdout


def scratch_directory(prefix):
    """A fresh directory for troupe's runs, removed when this program ends well; one whose run
    failed is kept and named, for its logs."""
    work = tempfile.mkdtemp(prefix=prefix)
    atexit.register(lambda: shutil.rmtree(work, ignore_errors=True) if not failed else None)
    return work


failed = False


def settings(pairs):
    return [item for pair in pairs for item in ("--set", pair)]


def compare(args):
    work = scratch_directory("troupe_gpt_compare_")
    overrides = args.set + ["parallelism.mode=sync", "data.shuffle=false", "metrics.log_interval=1",
                            f"training.max_steps={args.steps}", "training.epochs=1",
                            "checkpoint.interval_steps=0", "checkpoint.interval_s=0",
                            "metrics.progress=false"]
    initial = os.path.join(work, "initial.safetensors")
    run_troupe(args.troupe, ["export", args.job, initial, "--initial"] + settings(overrides))
    out = os.path.join(work, "run")
    run_troupe(args.troupe, ["train", args.job, "--out", out] + settings(
        overrides + [f'model.init_from="{initial}"']))
    config = json.load(open(os.path.join(out, "config.json")))
    troupe_losses = {}
    for line in open(os.path.join(out, "metrics.jsonl")):
        record = json.loads(line)
        if "loss" in record and "test_loss" not in record and "event" not in record:
            troupe_losses[record["step"]] = record["loss"]

    model = Model(config)
    model.load_state_dict(read_safetensors(initial), strict=True)
    model.to(args.device)
    training = config["training"]
    optimizer = make_optimizer(model, training)
    (inputs, targets), _ = text_splits(config, args.device)
    batch = training["batch_size"]
    total = min(inputs.shape[0] // batch * training["epochs"], args.steps)
    worst = 0.0
    parallelism = config["parallelism"]
    print(f"troupe sync {parallelism['schedule']} S={parallelism['stages']} "
          f"M={parallelism['micro_batches']} against PyTorch {torch.__version__}, "
          f"{args.steps} steps of batch {batch} x {config['data']['context']} tokens, "
          f"{args.precision} on {device_name(args.device)}")
    print(" step    troupe loss   PyTorch loss   relative difference")
    for step in range(total):
        rate = learning_rate_at(training, step, total)
        loss = train_step(model, optimizer, training, inputs[step * batch:(step + 1) * batch],
                          targets[step * batch:(step + 1) * batch], rate)
        theirs = troupe_losses.get(step + 1)
        if theirs is None:
            raise SystemExit(f"pytorch_gpt: troupe logged no loss for step {step + 1}")
        difference = abs(theirs - loss) / abs(loss)
        worst = max(worst, difference)
        if step < 5 or step % 10 == 9 or step == total - 1:
            print(f"{step + 1:5d}   {theirs:12.7f}   {loss:12.7f}   {difference:.2e}")
    verdict = "PASS" if worst <= args.tolerance else "FAIL"
    print(f"worst relative difference {worst:.3e} over {total} steps "
          f"(tolerance {args.tolerance:g}): {verdict}")
    return 0 if worst <= args.tolerance else 1


def device_name(device):
    if device == "cpu":
        return "the CPU"
    return torch.cuda.get_device_name(torch.device(device))


def resolved_config(args):
    """The job as troupe resolves it (DIR/config.json of a one-step run)."""
    work = scratch_directory("troupe_gpt_config_")
    out = os.path.join(work, "run")
    run_troupe(args.troupe, ["train", args.job, "--out", out] + settings(
        args.set + ["training.max_steps=1", "training.epochs=1", "checkpoint.interval_steps=0",
                    "checkpoint.interval_s=0", "metrics.progress=false"]))
    with open(os.path.join(out, "config.json")) as file:
        config = json.load(file)
    # Removed now: `train` may start this program again, which skips the removal at exit.
    shutil.rmtree(work, ignore_errors=True)
    return config


def train(args):
    config = resolved_config(args)
    if args.pytorch_setting is None:
        with tempfile.TemporaryDirectory(prefix="troupe_gpt_probe_") as work:
            choice = pytorch_choice(args, written_config(config, work))
        tuning.restart_with(choice)
    tuning.enter_pytorch(args.pytorch_setting, torch)
    torch.manual_seed(config["training"]["seed"])
    model = Model(config).to(args.device)
    training = config["training"]
    optimizer = make_optimizer(model, training)
    (inputs, targets), validation = text_splits(config, args.device)
    batch = training["batch_size"]
    per_epoch = inputs.shape[0] // batch
    generator = torch.Generator().manual_seed(training["seed"])
    order = torch.randperm(inputs.shape[0], generator=generator).to(args.device)
    budget = args.minutes * 60.0
    start = time.perf_counter()
    probe_steps, total, step = 10, None, 0
    while True:
        elapsed = time.perf_counter() - start
        if total is None and step == probe_steps:
            total = max(probe_steps + 1, int(budget / (elapsed / probe_steps)))
        if (total is not None and step >= total) or elapsed >= budget:
            break
        if step % per_epoch == 0 and step > 0:
            order = torch.randperm(inputs.shape[0], generator=generator).to(args.device)
        picks = order[(step % per_epoch) * batch:(step % per_epoch + 1) * batch]
        rate = learning_rate_at(training, step, total or 10 ** 9)
        loss = train_step(model, optimizer, training, inputs[picks], targets[picks], rate)
        step += 1
        if step % 50 == 0:
            tokens_per_s = step * batch * inputs.shape[1] / (time.perf_counter() - start)
            print(f"step {step}  loss {loss:.4f}  lr {rate:.3g}  {tokens_per_s:.0f} tokens/s  "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
    trained_s = time.perf_counter() - start
    loss = validation_loss(model, validation)
    tokens_per_s = step * batch * inputs.shape[1] / trained_s
    choice = tuning.Choice(args.pytorch_setting, probed=args.default_rate is not None)
    print(tuning.summary_line("pytorch", choice, tokens_per_s, "tokens/s", args.default_rate,
                              args.chosen_rate))
    print(json.dumps({"framework": f"pytorch {torch.__version__}", "steps": step,
                      "train_s": round(trained_s, 1), "tokens_per_s": tokens_per_s,
                      "validation_loss": loss, "bits_per_byte": loss / math.log(2),
                      "setting": tuning.setting_text(args.pytorch_setting)}))
    return 0


def written_config(config, directory):
    """`config` in a file of `directory`, for the child processes that time PyTorch."""
    path = os.path.join(directory, "config.json")
    with open(path, "w") as file:
        json.dump(config, file)
    return path


def pytorch_tokens_per_s(config, device, steps=None, seconds=None):
    """PyTorch's tokens/s over `steps` steps (or `seconds`) after WARMUP_STEPS uncounted ones."""
    torch.manual_seed(1)
    model = Model(config).to(device)
    training = config["training"]
    optimizer = make_optimizer(model, training)
    (inputs, targets), _ = text_splits(config, device)
    batch = training["batch_size"]
    batches = max(1, inputs.shape[0] // batch)
    counter = iter(range(10 ** 9))

    def step():
        first = next(counter) % batches * batch
        train_step(model, optimizer, training, inputs[first:first + batch],
                   targets[first:first + batch], training["lr"])

    rate = tuning.timed_rate(step, seconds=seconds, steps=steps, warmup=WARMUP_STEPS)
    return rate * batch * inputs.shape[1]


def pytorch_command(args, config_file, setting):
    """The command of a `pytorch-speed` child process that times PyTorch with `setting`."""
    return [sys.executable, os.path.abspath(__file__), "pytorch-speed", args.job, "--config",
            config_file, "--steps", str(args.steps), "--device", args.device, "--precision",
            args.precision, "--pytorch-setting", tuning.setting_text(setting)]


def pytorch_choice(args, config_file):
    """PyTorch's setting: --pytorch-setting (or --threads), or the fastest in a probe whose
    candidates each time --probe-seconds of steps in a process of their own."""
    def measure(setting):
        command = pytorch_command(args, config_file, setting)
        command += ["--probe-child", str(args.probe_seconds)]
        return tuning.child_result(command, setting, "the PyTorch probe")["tokens_per_s"]

    candidates = tuning.pytorch_candidates(gpu=args.device != "cpu")
    return tuning.chosen(args.pytorch_setting, "pytorch", candidates, measure, args, "tokens/s")


def pytorch_speed(args):
    """A child process of `speed`: PyTorch's tokens/s with --pytorch-setting, as a JSON line."""
    tuning.enter_pytorch(args.pytorch_setting or {}, torch)
    config = json.load(open(args.config))
    if args.probe_child is not None:
        rate = pytorch_tokens_per_s(config, args.device, seconds=args.probe_child)
    else:
        rate = pytorch_tokens_per_s(config, args.device, steps=args.steps)
    print(json.dumps({"tokens_per_s": rate}))
    return 0


def layouts_of(args):
    """{name: overrides} of troupe's configurations: one stage, then each of --pipelines."""
    layouts = {"troupe 1 stage": ["parallelism.stages=1", "parallelism.mode=sync",
                                  "parallelism.micro_batches=1"]}
    for text in args.pipelines:
        stages, mode, micro = text.split(":")
        layouts[f"troupe {stages} stages {mode} M={micro}"] = [
            f"parallelism.stages={stages}", f"parallelism.mode={mode}",
            f"parallelism.micro_batches={micro}", f"parallelism.max_active_keys={stages}",
            f"parallelism.min_update_interval={micro}"]
    return layouts


def speed(args):
    config = resolved_config(args)
    work = scratch_directory("troupe_gpt_speed_")
    config_file = written_config(config, work)
    layouts = layouts_of(args)
    # troupe's tokens/s from its per-step metrics records, as PyTorch's is measured, so that
    # neither side's rate counts the first steps' one-off costs (CUDA and cuBLAS set-up, the
    # GEMM search, allocation); an evaluation of 0.1 % held out at most.
    keys = {name: args.set + layout + ["data.validation_fraction=0.001"]
            for name, layout in layouts.items()}
    tokens_per_step = config["training"]["batch_size"] * config["data"]["context"]
    out = os.path.join(work, "run")
    # Each side as its users would run it: the fastest setting of a short probe.
    pytorch = pytorch_choice(args, config_file)
    troupe = {name: tuning.troupe_choice(args, name, args.troupe, args.job, keys[name],
                                         int(layout[0].split("=")[1]), out, tokens_per_step,
                                         "tokens/s", gpu=args.device != "cpu")
              for name, layout in layouts.items()}
    rates = {name: [] for name in ["pytorch"] + list(layouts)}
    for round_index in range(args.rounds):
        rates["pytorch"].append(tuning.child_result(
            pytorch_command(args, config_file, pytorch.setting), pytorch.setting,
            "the PyTorch run")["tokens_per_s"])
        for name in layouts:
            setting = troupe[name].setting
            rates[name].append(tuning.troupe_rate(
                args.troupe, args.job, keys[name] + tuning.job_overrides(setting), args.steps,
                out, tokens_per_step, env=tuning.environment(setting)))
        print(f"round {round_index + 1}: " + "  ".join(
            f"{name} {values[-1]:.0f}" for name, values in rates.items()), flush=True)
    print_speed(args, config, rates, pytorch, troupe)
    return 0


def print_speed(args, config, rates, pytorch, troupe):
    reference = statistics.median(rates["pytorch"])
    layers = config["model"]["layers"]
    blocks = sum(1 for spec in layers if spec["type"] == "transformer_block")
    parameters = sum(p.numel() for p in Model(config).parameters())
    print(f"\nGPT of {blocks} transformer blocks, width {layers[0].get('dim')}, "
          f"{parameters / 1e6:.1f} M parameters, batch "
          f"{config['training']['batch_size']} x {config['data']['context']} tokens, "
          f"{args.precision} on {device_name(args.device)}, PyTorch {torch.__version__}, "
          f"median of {args.rounds} alternating rounds of {args.steps} steps after {WARMUP_STEPS} "
          "warm-up steps")
    print(f"{'configuration':40s} {'tokens/s':>10s} {'ratio':>7s}")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:40s} {median:10.0f} {median / reference:7.2f}")
    print("settings:")
    print("  " + tuning.summary_line("pytorch", pytorch, reference, "tokens/s"))
    for name, choice in troupe.items():
        print(f"  {name} ({choice.label()})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["compare", "train", "speed", "pytorch-speed"])
    parser.add_argument("job", help="troupe job file (TOML)")
    parser.add_argument("--set", action="append", default=[], help="job override KEY=VALUE")
    parser.add_argument("--troupe", default="", help="troupe binary (default: build/apps/troupe)")
    parser.add_argument("--threads", type=int, default=None,
                        help="PyTorch's threads, no probe (--pytorch-setting threads=N)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (PyTorch and troupe)")
    parser.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pipelines", nargs="*", default=["2:async:4", "4:async:4", "2:sync:4", "4:sync:8"],
                        help="pipeline layouts STAGES:MODE:MICRO_BATCHES to time")
    # pytorch-speed (a child process of speed): the job resolved, as config.json.
    parser.add_argument("--config", help=argparse.SUPPRESS)
    tuning.add_arguments(parser)
    args = parser.parse_args()
    args.troupe = troupe_binary(args.troupe)
    if args.threads is not None and args.pytorch_setting is None:
        args.pytorch_setting = {"threads": str(args.threads)}
    if args.device != "cpu":
        if not torch.cuda.is_available():
            raise SystemExit(f"pytorch_gpt: --device {args.device}: this PyTorch sees no GPU")
        args.set = [f'parallelism.devices="{args.device}"'] + args.set
    if args.precision != "fp32":
        args.set = [f'training.precision="{args.precision}"'] + args.set
    tf32 = args.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    gpt_model.AUTOCAST_BF16 = args.precision == "bf16"
    if args.mode == "pytorch-speed":
        return pytorch_speed(args)
    if args.mode == "compare":
        if args.pytorch_setting is not None:
            tuning.enter_pytorch(args.pytorch_setting, torch)
        return compare(args)
    try:
        return train(args) if args.mode == "train" else speed(args)
    except SystemExit as failure:
        global failed
        failed = failed or failure.code not in (0, None)  # keep the runs' logs
        raise


if __name__ == "__main__":
    sys.exit(main())
