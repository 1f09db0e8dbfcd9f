"""The GPT of a troupe job in PyTorch: its model, its text data and its training step.

The model is read from the resolved job troupe writes (DIR/config.json), block for block:
embedding (token table "weight" and learned "position"), transformer_block (nanoGPT's
pre-LayerNorm block: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, GELU),
layernorm and lm_head. Each block is a submodule named as troupe names it ("embedding0",
"transformer_block1", ..., "lm_head8"), so the module's state_dict keys are troupe's tensor
names without their "stage{i}." prefix: troupe's safetensors files load with load_state_dict.
The data is troupe's text data rebuilt byte for byte: the job's files in name order
(regular files, no ".dat" or ".u8"), concatenated, the last data.validation_fraction held out,
cut into sequences of data.context bytes labelled with the byte after each.

This module chooses no threads and no OMP_WAIT_POLICY: on a 2-core machine untuned PyTorch runs
about 3x slower. Every caller that reports a rate (pytorch_gpt.py train and speed) first enters
the setting tuning.py's probe chose (tuning.enter_pytorch); compare reports losses only.
"""

import json
import math
import os
import struct

import torch
from torch import nn
from torch.nn import functional as F

AUTOCAST_BF16 = False  # set by pytorch_gpt.py's --precision bf16


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


def make_layer(spec, width, context):
    """(the module of one troupe layer spec, the width after it), `width` the one before."""
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
    return module, width


class Model(nn.Module):
    """The blocks of a troupe job's model.layers, named "{type}{index}"."""

    def __init__(self, config):
        super().__init__()
        context = config["data"]["context"]
        width = None
        for index, spec in enumerate(config["model"]["layers"]):
            module, width = make_layer(spec, width, context)
            self.add_module(f"{spec['type']}{index}", module)

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
