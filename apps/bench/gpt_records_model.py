"""The GPT of apps/examples/gpt_fortunes_whole.toml in PyTorch: whole records, padded.

troupe runs the job's nodes (a chain of embedding, transformer blocks, layernorm and lm_head,
cut into nodes) over each key's records packed end to end, each record attended within itself
with its positions counted from 0. PyTorch runs the same blocks (gpt_model.py's modules, named
as troupe names them: "embed.embedding0.weight", "middle.transformer_block0.attn.c_attn.weight")
on each batch padded to its longest record. The attention is causal, so no real position sees a
pad; the pads' labels are ignored and the loss is the mean over the real tokens, as troupe's key
loss is. pytorch_records.py checks it against troupe and races the two (lstm_model.py is the
same interface for the LSTM).

This module chooses no threads and no OMP_WAIT_POLICY: every caller that reports a rate enters
the setting tuning.py's probe chose first (tuning.enter_pytorch).
"""

import sys

import torch
from torch import nn
from torch.nn import functional as F

from gpt_model import make_layer
from records_data import load_node_weights

IGNORED = -1  # the label of a pad, as troupe's data.padding = "longest" marks it


def chain_of(config):
    """The job's nodes in the order a record visits them; exits unless they form a chain."""
    nodes = config["model"].get("nodes") or []
    if not nodes:
        sys.exit("pytorch_records: the job's model has no [[model.nodes]]")
    by_name = {node["name"]: node for node in nodes}
    order, node = [], nodes[0]
    while node is not None:
        if node.get("route", "chain") != "chain" or node in order:
            sys.exit("pytorch_records: node '%s' is not a plain chain node; the GPT over records "
                     "is a chain of nodes, as apps/examples/gpt_fortunes_whole.toml"
                     % node["name"])
        order.append(node)
        following = node.get("next") or ""
        node = by_name.get(following) if following else None
    return order


class RecordsGpt(nn.Module):
    """The layers of every node, each node a submodule of `nodes` named as the job names it."""

    def __init__(self, config):
        super().__init__()
        context, width, parts = config["data"]["context"], None, {}
        for node in chain_of(config):
            holder = nn.Module()
            for index, spec in enumerate(node["layers"]):
                module, width = make_layer(spec, width, context)
                holder.add_module("%s%d" % (spec["type"], index), module)
            parts[node["name"]] = holder
        self.nodes = nn.ModuleDict(parts)
        # A tuple, not attributes: a module attribute would register each layer a second time.
        self.layers = tuple(module for holder in self.nodes.values()
                            for module in holder.children())

    def load_troupe(self, path):
        load_node_weights(self, path)

    def forward(self, tokens):
        x = tokens
        for module in self.layers:
            x = module(x)
        return x


Model = RecordsGpt
PYTORCH_NAME = "pytorch padded"


def describe(config):
    """The model in a few words, for a report's heading."""
    layers = [spec for node in chain_of(config) for spec in node["layers"]]
    blocks = [spec for spec in layers if spec["type"] == "transformer_block"]
    embedding = layers[0]
    return "GPT over whole records (%d blocks, width %d, %d heads, vocab %d)" % (
        len(blocks), embedding.get("dim", 0), blocks[0]["heads"] if blocks else 0,
        embedding.get("vocab", 0))


def padded(instances):
    """(tokens [B, longest], labels [B, longest] with IGNORED at the pads) of a batch."""
    longest = max(len(tokens) for tokens, _ in instances)
    tokens = torch.zeros(len(instances), longest, dtype=torch.int64)
    labels = torch.full((len(instances), longest), IGNORED, dtype=torch.int64)
    for row, (ids, after) in enumerate(instances):
        tokens[row, :len(ids)] = torch.frombuffer(bytearray(ids), dtype=torch.uint8)
        labels[row, :len(after)] = torch.frombuffer(bytearray(after), dtype=torch.uint8)
    return tokens, labels


def summed_loss(model, instances, reduction):
    tokens, labels = padded(instances)
    logits = model(tokens)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1),
                           ignore_index=IGNORED, reduction=reduction), int((labels >= 0).sum())


def train_step(model, optimizer, training, instances, rate):
    """One step on a batch: the mean loss over its real tokens, as troupe's key loss is."""
    for group in optimizer.param_groups:
        group["lr"] = rate
    optimizer.zero_grad(set_to_none=True)
    loss, _ = summed_loss(model, instances, "mean")
    loss.backward()
    if training.get("clip_norm", 0) > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), training["clip_norm"])
    optimizer.step()
    return loss.item()


def validation_loss(model, validation, batch=64):
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for first in range(0, len(validation), batch):
            loss, rows = summed_loss(model, validation[first:first + batch], "sum")
            total += loss.item()
            count += rows
    model.train()
    return total / count
