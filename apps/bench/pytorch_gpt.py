#!/usr/bin/env python3
"""The GPT of a troupe job, built in PyTorch: checked against troupe, trained, and timed.

The model is read from the resolved job troupe writes (DIR/config.json), block for block:
embedding (token table "weight" and learned "position"), transformer_block (nanoGPT's
pre-LayerNorm block: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, GELU),
layernorm and lm_head. Each block is a submodule named as troupe names it ("embedding0",
"transformer_block1", ..., "lm_head8"), so the module's state_dict keys are troupe's tensor
names without their "stage{i}." prefix: troupe's safetensors files load with load_state_dict.
The data is troupe's text data rebuilt byte for byte: the job's files in name order
(regular files, no ".dat" or ".u8"), concatenated, the last data.validation_fraction held out,
cut into sequences of data.context bytes labelled with the byte after each.

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

PyTorch runs on the CPU with --threads threads (default 2), or with --device cuda on the GPU,
where troupe's runs get parallelism.devices = "cuda" too. --precision fp32|tf32|bf16 sets both
sides' GEMM arithmetic: troupe's training.precision, and PyTorch's TF32 matmuls or bf16
autocast (fp32 master weights either way).
"""

import argparse
import atexit
import json
import math
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn
from torch.nn import functional as F

AUTOCAST_BF16 = False  # set by --precision bf16
# speed: steps each side runs before its timing starts (set-up, allocation, the GEMM search).
WARMUP_STEPS = 3
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- the model ---------------------------------------------------------------------------------

class Embedding(nn.Module):
    def __init__(self, vocab, dim, positions):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, dim).uniform_(-0.0346, 0.0346))
        self.position = nn.Parameter(torch.empty(positions, dim).uniform_(-0.0346, 0.0346))

    def forward(self, ids):
        length = ids.shape[1]
        return self.weight[ids] + self.position[:length]


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(width // self.heads))
        mask = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(batch, length, width))


class Mlp(nn.Module):
    def __init__(self, width, ratio):
        super().__init__()
        self.c_fc = nn.Linear(width, ratio * width)
        self.c_proj = nn.Linear(ratio * width, width)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, width, heads, ratio, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, eps=1e-5)
        self.attn = Attention(width, heads)
        self.ln_2 = nn.LayerNorm(width, eps=1e-5)
        self.mlp = Mlp(width, ratio)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.dropout(self.attn(self.ln_1(x)))
        return x + self.dropout(self.mlp(self.ln_2(x)))


class Model(nn.Module):
    """The blocks of a troupe job's model.layers, named "{type}{index}"."""

    def __init__(self, config):
        super().__init__()
        context = config["data"]["context"]
        width = None
        for index, spec in enumerate(config["model"]["layers"]):
            kind = spec["type"]
            if kind == "embedding":
                width = spec["dim"]
                module = Embedding(spec["vocab"], width, spec.get("positions") or context)
            elif kind == "transformer_block":
                module = Block(width, spec["heads"], spec.get("mlp_ratio", 4), spec.get("dropout", 0))
            elif kind == "layernorm":
                module = nn.LayerNorm(width, eps=1e-5)
            elif kind in ("lm_head", "linear"):
                out = spec["vocab"] if kind == "lm_head" else spec["out"]
                module = nn.Linear(width, out, bias=spec.get("bias", kind == "linear"))
                width = out
            elif kind == "gelu":
                module = nn.GELU()
            elif kind == "relu":
                module = nn.ReLU()
            elif kind == "dropout":
                module = nn.Dropout(spec.get("p", 0.5))
            else:
                raise SystemExit(f"pytorch_gpt: no PyTorch counterpart of layer type '{kind}'")
            self.add_module(f"{kind}{index}", module)

    def forward(self, ids):
        x = ids
        for module in self.children():
            x = module(x)
        return x


def read_safetensors(path):
    """{name: tensor} of a float32 safetensors file, names without their "stage{i}." prefix."""
    with open(path, "rb") as file:
        header_size = struct.unpack("<Q", file.read(8))[0]
        header = json.loads(file.read(header_size))
        data = file.read()
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] != "F32":
            raise SystemExit(f"pytorch_gpt: {path}: tensor {name} is {entry['dtype']}, not F32")
        begin, end = entry["data_offsets"]
        values = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        bare = name.split(".", 1)[1] if name.startswith("stage") else name
        tensors[bare] = values.reshape(entry["shape"])
    return tensors


# ---- the data ----------------------------------------------------------------------------------

def text_files(path):
    if os.path.isfile(path):
        return [path]
    files = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.startswith(".") or name.endswith((".dat", ".u8")) or os.path.islink(full):
            continue
        if os.path.isfile(full) and os.path.getsize(full) > 0:
            files.append(full)
    return files


def text_splits(config, device="cpu"):
    """(train, validation): int64 tensors [sequences, context + 1] of troupe's text data."""
    data = config["data"]
    everything = b"".join(open(f, "rb").read() for f in text_files(data["path"]))
    held_out = int(len(everything) * data["validation_fraction"])
    split = len(everything) - held_out

    def sequences(raw):
        context = data["context"]
        count = (len(raw) - 1) // context
        values = torch.tensor(list(raw[: count * context + 1]), dtype=torch.int64)
        inputs = values[: count * context].view(count, context)
        targets = values[1: count * context + 1].view(count, context)
        return inputs.to(device), targets.to(device)

    return sequences(everything[:split]), sequences(everything[split:])


# ---- training ----------------------------------------------------------------------------------

def learning_rate_at(training, step, total_steps):
    """troupe's learning_rate_at for the constant and cosine schedules, with warm-up."""
    rate = training["lr"]
    if training["lr_schedule"] == "cosine" and total_steps > 0:
        rate = 0.5 * training["lr"] * (1.0 + math.cos(math.pi * min(step / total_steps, 1.0)))
    if training["warmup_steps"] > 0 and step < training["warmup_steps"]:
        rate *= (step + 1) / training["warmup_steps"]
    return rate


def make_optimizer(model, training):
    kind = training["optimizer"]
    betas = (training["beta1"], training["beta2"])
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=training["lr"], betas=betas,
                                 eps=training["epsilon"], weight_decay=training["weight_decay"])
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=training["lr"], betas=betas,
                                eps=training["epsilon"], weight_decay=training["weight_decay"])
    return torch.optim.SGD(model.parameters(), lr=training["lr"], momentum=training["momentum"],
                           weight_decay=training["weight_decay"])


def train_step(model, optimizer, training, inputs, targets, rate):
    for group in optimizer.param_groups:
        group["lr"] = rate
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=inputs.device.type, dtype=torch.bfloat16, enabled=AUTOCAST_BF16):
        logits = model(inputs)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    if training.get("clip_norm", 0) > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), training["clip_norm"])
    optimizer.step()
    return loss.item()


def validation_loss(model, validation, batch=64):
    inputs, targets = validation
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for first in range(0, inputs.shape[0], batch):
            logits = model(inputs[first: first + batch])
            total += F.cross_entropy(logits.view(-1, logits.shape[-1]),
                                     targets[first: first + batch].reshape(-1),
                                     reduction="sum").item()
            count += targets[first: first + batch].numel()
    model.train()
    return total / count


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
    return json.load(open(os.path.join(out, "config.json")))


def train(args):
    config = resolved_config(args)
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
    print(json.dumps({"framework": f"pytorch {torch.__version__}", "steps": step,
                      "train_s": round(trained_s, 1),
                      "tokens_per_s": step * batch * inputs.shape[1] / trained_s,
                      "validation_loss": loss, "bits_per_byte": loss / math.log(2)}))
    return 0


def pytorch_tokens_per_s(config, steps, device, warmup=WARMUP_STEPS):
    torch.manual_seed(1)
    model = Model(config).to(device)
    training = config["training"]
    optimizer = make_optimizer(model, training)
    (inputs, targets), _ = text_splits(config, device)
    batch = training["batch_size"]
    for step in range(warmup):
        train_step(model, optimizer, training, inputs[step * batch:(step + 1) * batch],
                   targets[step * batch:(step + 1) * batch], training["lr"])
    start = time.perf_counter()
    for step in range(warmup, warmup + steps):
        train_step(model, optimizer, training, inputs[step * batch:(step + 1) * batch],
                   targets[step * batch:(step + 1) * batch], training["lr"])
    return steps * batch * inputs.shape[1] / (time.perf_counter() - start)


def troupe_tokens_per_s(args, layout, steps, warmup=WARMUP_STEPS):
    """troupe's tokens/s over the steps after its first `warmup`, as PyTorch's is measured:
    from the per-step metrics records (log_interval 1), so that neither side's rate counts
    the first steps' one-off costs (CUDA and cuBLAS set-up, the GEMM search, allocation)."""
    work = scratch_directory("troupe_gpt_speed_")
    out = os.path.join(work, "run")
    run_troupe(args.troupe, ["train", args.job, "--out", out] + settings(
        args.set + layout + [f"training.max_steps={warmup + steps}", "checkpoint.interval_steps=0",
                             "checkpoint.interval_s=0", "data.validation_fraction=0.001",
                             "metrics.log_interval=1", "metrics.progress=false"]))
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    # Step records only: the epoch's evaluation record also carries test_loss.
    wall = {record["step"]: record["wall_s"] for record in records if "test_loss" not in record}
    first = min((step for step in wall if step >= warmup), default=None)
    last = max(wall, default=None)
    if first is None or last <= first:
        global failed
        failed = True
        raise SystemExit(f"pytorch_gpt: troupe's run in {out} logged too few steps "
                         f"({sorted(wall)}) to time {steps} after {warmup} warm-up steps")
    config = json.load(open(os.path.join(out, "config.json")))
    tokens_per_step = config["training"]["batch_size"] * config["data"]["context"]
    return (last - first) * tokens_per_step / (wall[last] - wall[first])


def speed(args):
    config = resolved_config(args)
    layouts = {"troupe 1 stage": ["parallelism.stages=1", "parallelism.mode=sync",
                                  "parallelism.micro_batches=1"]}
    for text in args.pipelines:
        stages, mode, micro = text.split(":")
        layouts[f"troupe {stages} stages {mode} M={micro}"] = [
            f"parallelism.stages={stages}", f"parallelism.mode={mode}",
            f"parallelism.micro_batches={micro}", f"parallelism.max_active_keys={stages}",
            f"parallelism.min_update_interval={micro}"]
    rates = {name: [] for name in ["pytorch"] + list(layouts)}
    for round_index in range(args.rounds):
        rates["pytorch"].append(pytorch_tokens_per_s(config, args.steps, args.device))
        for name, layout in layouts.items():
            rates[name].append(troupe_tokens_per_s(args, layout, args.steps))
        print(f"round {round_index + 1}: " + "  ".join(
            f"{name} {values[-1]:.0f}" for name, values in rates.items()), flush=True)
    reference = statistics.median(rates["pytorch"])
    layers = config["model"]["layers"]
    blocks = sum(1 for spec in layers if spec["type"] == "transformer_block")
    parameters = sum(p.numel() for p in Model(config).parameters())
    print(f"\nGPT of {blocks} transformer blocks, width {layers[0].get('dim')}, "
          f"{parameters / 1e6:.1f} M parameters, batch "
          f"{config['training']['batch_size']} x {config['data']['context']} tokens, "
          f"{args.precision} on {device_name(args.device)}, "
          f"PyTorch {torch.__version__} with {torch.get_num_threads()} threads, "
          f"median of {args.rounds} alternating rounds of {args.steps} steps after {WARMUP_STEPS} "
          "warm-up steps")
    print(f"{'configuration':40s} {'tokens/s':>10s} {'ratio':>7s}")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:40s} {median:10.0f} {median / reference:7.2f}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["compare", "train", "speed"])
    parser.add_argument("job", help="troupe job file (TOML)")
    parser.add_argument("--set", action="append", default=[], help="job override KEY=VALUE")
    parser.add_argument("--troupe", default="", help="troupe binary (default: build/apps/troupe)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (PyTorch and troupe)")
    parser.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pipelines", nargs="*", default=["2:async:4", "4:async:4", "2:sync:4", "4:sync:8"],
                        help="pipeline layouts STAGES:MODE:MICRO_BATCHES to time")
    args = parser.parse_args()
    args.troupe = troupe_binary(args.troupe)
    torch.set_num_threads(args.threads)
    if args.device != "cpu":
        if not torch.cuda.is_available():
            raise SystemExit(f"pytorch_gpt: --device {args.device}: this PyTorch sees no GPU")
        args.set = [f'parallelism.devices="{args.device}"'] + args.set
    if args.precision != "fp32":
        args.set = [f'training.precision="{args.precision}"'] + args.set
    tf32 = args.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    global AUTOCAST_BF16
    AUTOCAST_BF16 = args.precision == "bf16"
    if args.mode == "compare":
        return compare(args)
    if args.mode == "train":
        return train(args)
    return speed(args)


if __name__ == "__main__":
    sys.exit(main())
