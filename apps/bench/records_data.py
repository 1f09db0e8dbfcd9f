"""The instances of a text-records troupe job, and troupe's order of them, for PyTorch.

`troupe dataset JOB --out DIR` writes a job's instances (a fortune, or a piece of one, per
line); read_dataset reads them, batches lists each step's instances in troupe's seeded order
(layers/batch_order.cpp) and load_node_weights loads troupe's safetensors files into a model
whose parameters are named as a graph's nodes name them. lstm_model.py and
gpt_records_model.py build their models on these; pytorch_records.py checks and races them.
"""

import json
import os
import sys

from gpt_model import read_safetensors


# ---- the data: `troupe dataset JOB --out DIR` ---------------------------------------------------

def read_dataset(directory):
    """(the resolved job, {"train": [(tokens, labels)], "validation": [...]}) of a text-records
    job as `troupe dataset` writes it: DIR/config.json, DIR/train.jsonl and DIR/test.jsonl, one
    instance (a fortune, or a piece of one) per line, its byte tokens and the bytes after them."""
    with open(os.path.join(directory, "config.json")) as file:
        config = json.load(file)
    if config["data"]["dataset"] != "text-records":
        sys.exit("pytorch_records: %s holds %s data, not text-records"
                 % (directory, config["data"]["dataset"]))

    def instances(name):
        with open(os.path.join(directory, name)) as file:
            return [(bytes(record["tokens"]), bytes(record["labels"]))
                    for record in map(json.loads, file)]

    return config, {"train": instances("train.jsonl"), "validation": instances("test.jsonl")}


# ---- troupe's batch order (layers/batch_order.cpp, layers/random.h) -----------------------------

MASK = (1 << 64) - 1


def mix64(x):
    x = (x + 0x9e3779b97f4a7c15) & MASK
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & MASK
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & MASK
    return x ^ (x >> 31)


def epoch_order(count, seed, epoch, shuffle):
    """The instances of `epoch` in troupe's order: a Fisher-Yates shuffle drawn by SplitMix64
    from derive_seed(seed, epoch), bounded by Lemire's method."""
    order = list(range(count))
    if not shuffle:
        return order
    state = mix64(seed ^ mix64((epoch + 0x5851f42d4c957f2d) & MASK))

    def below(bound):
        nonlocal state
        while True:
            product = mix64(state) * bound
            state = (state + 0x9e3779b97f4a7c15) & MASK
            low = product & MASK
            if low >= bound or low >= (-bound % (1 << 64)) % bound:
                return product >> 64

    for i in range(count - 1, 0, -1):
        j = below(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def batches(config, train, steps):
    """The instances of each of the first `steps` steps, in troupe's order."""
    training = config["training"]
    size = training["batch_size"]
    per_epoch = len(train) // size
    result, order = [], None
    for step in range(steps):
        if step % per_epoch == 0:
            order = epoch_order(len(train), training["seed"], step // per_epoch,
                                config["data"]["shuffle"])
        first = (step % per_epoch) * size
        result.append([train[index] for index in order[first:first + size]])
    return result


def total_steps(config, train_count, max_steps):
    """The steps of a troupe run of the job with training.max_steps = `max_steps` (which its
    learning-rate schedule spans): fewer when training.epochs ends it first."""
    per_epoch = train_count // config["training"]["batch_size"]
    return min(config["training"]["epochs"] * per_epoch, max_steps)


def load_node_weights(model, path):
    """Loads troupe's safetensors file `path` into `model`, whose parameters sit in a ModuleDict
    `nodes` named as the job's nodes are ("nodes.embed.embedding0.weight" holds troupe's
    "embed.embedding0.weight"); exits naming the tensors that differ."""
    tensors = read_safetensors(path)
    names = {name[len("nodes."):]: name for name in model.state_dict()}
    if set(tensors) != set(names):
        sys.exit("pytorch_records: %s holds %s, the model needs %s"
                 % (path, sorted(set(tensors) - set(names)), sorted(set(names) - set(tensors))))
    model.load_state_dict({names[key]: value for key, value in tensors.items()}, strict=True)
