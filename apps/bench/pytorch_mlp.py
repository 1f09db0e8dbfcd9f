#!/usr/bin/env python3
"""PyTorch eager training throughput of the MLP that `troupe bench compute --device cuda` trains.

The model is 784-8192-8192-8192-8192-10 with ReLU, trained with SGD (lr 0.01, momentum 0.9) on
softmax cross-entropy at batch 1024, on synthetic data, at --precision fp32, tf32 or bf16 (bf16
through torch.autocast, with fp32 master weights). Like troupe's training step, each step by
default uploads its batch from host memory and reads the loss back (--data host); --data device
keeps the data on the GPU instead. After warm-up steps it times --steps steps between
torch.cuda.synchronize() calls and prints one line:

    pytorch_mlp precision=bf16 samples_per_s=123456.7 ...

which compares with troupe's `troupe_mlp precision=bf16 samples_per_s=...` line. First it
tries the CPU settings a PyTorch user tries (tuning.py; on a GPU the CPU's threads only launch
kernels and copy batches, so the probe is short: OMP_WAIT_POLICY unset or PASSIVE, PyTorch's
threads or one), each for --probe-seconds in a process of its own, and measures with the
fastest; the line names it (setting=) beside the default settings' rate in the probe
(default_rate=). --pytorch-setting KEY=VALUE,... (or 'default') skips the probe.
"""

import argparse
import json
import sys
import time

import torch
from torch import nn

import tuning

WIDTHS = [784, 8192, 8192, 8192, 8192, 10]


def build_model(widths):
    blocks = []
    for i in range(len(widths) - 1):
        blocks.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            blocks.append(nn.ReLU())
    return nn.Sequential(*blocks)


def set_precision(precision):
    """fp32 and bf16 keep fp32 matmuls outside autocast; tf32 lets them use TF32 tensor cores."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=50, help="timed steps")
    parser.add_argument("--data", choices=["host", "device"], default="host",
                        help="upload each batch from host memory (as troupe does) or not")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=1)
    tuning.add_arguments(parser, troupe=False, probe_seconds=1.0, probe_rounds=1)
    return parser.parse_args()


def probe(args):
    """The fastest of the GPU candidates, each timed in a process of its own."""
    def measure(setting):
        command = [sys.executable] + sys.argv + ["--pytorch-setting", tuning.setting_text(setting),
                                                 "--probe-child", str(args.probe_seconds)]
        return tuning.child_result(command, setting, "the PyTorch probe")["samples_per_s"]

    return tuning.chosen(None, "pytorch_mlp", tuning.pytorch_candidates(gpu=True), measure, args,
                         "samples/s")


def main():
    args = parse_arguments()
    if not torch.cuda.is_available():
        print("pytorch_mlp: no CUDA device", file=sys.stderr)
        return 2
    if args.pytorch_setting is None:
        tuning.restart_with(probe(args))
    tuning.enter_pytorch(args.pytorch_setting, torch)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    set_precision(args.precision)

    model = build_model(WIDTHS).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_function = nn.CrossEntropyLoss()
    features = torch.rand(args.batch, WIDTHS[0]) * 2 - 1
    labels = torch.arange(args.batch) % WIDTHS[-1]
    if args.data == "device":
        features, labels = features.to(device), labels.to(device)

    def step():
        inputs = features.to(device, non_blocking=False)
        targets = labels.to(device, non_blocking=False)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16,
                            enabled=args.precision == "bf16"):
            logits = model(inputs)
            loss = loss_function(logits.float(), targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    if args.probe_child is not None:
        rate = tuning.timed_rate(step, seconds=args.probe_child)
        print(json.dumps({"samples_per_s": rate * args.batch}))
        return 0
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        last_loss = step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start

    samples_per_s = args.batch * args.steps / seconds
    flops_per_step = 0.0
    for i in range(len(WIDTHS) - 1):
        gemm = 2.0 * args.batch * WIDTHS[i] * WIDTHS[i + 1]
        flops_per_step += (2.0 if i == 0 else 3.0) * gemm
    tflops = flops_per_step * args.steps / seconds / 1e12
    print(f"pytorch_mlp precision={args.precision} samples_per_s={samples_per_s:.1f} "
          f"tflops={tflops:.1f} batch={args.batch} steps={args.steps} data={args.data} "
          f"loss={last_loss:.4f} gpu={torch.cuda.get_device_name(device).replace(' ', '_')} "
          f"setting={tuning.setting_text(args.pytorch_setting)} default_rate="
          f"{'-' if args.default_rate is None else '%.1f' % args.default_rate}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
