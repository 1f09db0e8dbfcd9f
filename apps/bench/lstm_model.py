"""The LSTM of apps/examples/fortunes_lstm.toml in PyTorch.

An embedding, LSTMCell's arithmetic over the packed time steps of each batch padded to its
longest record (every position's row [h | c], as troupe's lstm_cell emits it) and a linear head
over those rows, its parameters named as troupe names them so that troupe's safetensors files
load as they are (records_data.load_node_weights). pytorch_records.py checks it against troupe
and races the two; gpt_records_model.py is the same interface for the GPT over whole records.

This module chooses no threads and no OMP_WAIT_POLICY: on a 2-core machine untuned PyTorch runs
about 3x slower. Every caller that reports a rate (pytorch_records.py speed and its timed
children)
first enters the setting tuning.py's probe chose (tuning.enter_pytorch); compare reports losses
only.
"""

import sys

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence

from records_data import load_node_weights


# ---- the model ---------------------------------------------------------------------------------

def packed_lstm(projected, batch_sizes, weight_hh, hidden):
    """LSTMCell over packed time steps: `projected` holds W_ih x + b of every position in packed
    order, and step t takes the first batch_sizes[t] rows on. Each position's row is [h | c].
    The steps are split off `projected` in one op: slicing it per step would make autograd add a
    zero gradient of its whole size at every step."""
    h = projected.new_zeros(batch_sizes[0], hidden)
    c = projected.new_zeros(batch_sizes[0], hidden)
    rows = []
    for step in projected.split(batch_sizes):
        size = step.shape[0]
        gates = torch.addmm(step, h[:size], weight_hh.t())
        i, f, g, o = gates.chunk(4, 1)
        c = torch.sigmoid(f) * c[:size] + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        rows.append(torch.cat([h, c], 1))
    return torch.cat(rows, 0)


def graph_shape(config):
    """(nodes, vocab, dim, hidden, classes) of the job's embed -> loop lstm_cell -> linear
    graph; exits naming what differs."""
    nodes = config["model"].get("nodes") or []
    kinds = [[layer["type"] for layer in node["layers"]] for node in nodes]
    if kinds != [["embedding"], ["lstm_cell"], ["linear"]] or nodes[1].get("route") != "loop":
        sys.exit("pytorch_records: the job's model must be the nodes embedding -> lstm_cell (route "
                 "= \"loop\", emit = \"every\") -> linear, as apps/examples/fortunes_lstm.toml")
    embedding, cell, head = (node["layers"][0] for node in nodes)
    if not cell.get("bias", True) or not head.get("bias", True):
        sys.exit("pytorch_records: the cell and the head must have biases")
    return nodes, embedding["vocab"], embedding["dim"], cell["out"], head["out"]


class Embedding(torch.nn.Module):
    """troupe's embedding on rows of one token: weight[id] + position[0], its one learned
    position a bias that every row shares."""

    def __init__(self, vocab, dim):
        super().__init__()
        bound = 0.02 * 3 ** 0.5
        self.weight = torch.nn.Parameter(torch.empty(vocab, dim).uniform_(-bound, bound))
        self.position = torch.nn.Parameter(torch.empty(1, dim).uniform_(-bound, bound))

    def forward(self, ids):
        return F.embedding(ids, self.weight) + self.position[0]


class LstmModel(torch.nn.Module):
    """embedding -> LSTMCell over packed steps -> linear over [h | c], named as troupe names it
    ("embed.embedding0.weight", "cell.lstm_cell0.weight", ...)."""

    def __init__(self, config):
        super().__init__()
        nodes, vocab, dim, hidden, classes = graph_shape(config)
        self.hidden, self.dim = hidden, dim
        parts = {}
        for node, layer in zip(nodes, [Embedding(vocab, dim), None,
                                       torch.nn.Linear(2 * hidden, classes)]):
            parts[node["name"]] = torch.nn.Module()
            if layer is None:  # troupe's one [4H, X + H] weight and one bias
                layer = torch.nn.Module()
                bound = hidden ** -0.5
                layer.weight = torch.nn.Parameter(
                    torch.empty(4 * hidden, dim + hidden).uniform_(-bound, bound))
                layer.bias = torch.nn.Parameter(torch.empty(4 * hidden).uniform_(-bound, bound))
            setattr(parts[node["name"]], node["layers"][0]["type"] + "0", layer)
        self.nodes = torch.nn.ModuleDict(parts)
        # A tuple, not attributes: a module attribute would register each layer a second time.
        self.layers = tuple(getattr(parts[node["name"]], node["layers"][0]["type"] + "0")
                            for node in nodes)

    def load_troupe(self, path):
        load_node_weights(self, path)

    def forward(self, tokens, lengths):
        """Logits of every real position, in packed order; and the packing."""
        embed, cell, head = self.layers
        packed = pack_padded_sequence(embed(tokens), lengths, batch_first=True,
                                      enforce_sorted=False)
        projected = F.linear(packed.data, cell.weight[:, :self.dim], cell.bias)
        rows = packed_lstm(projected, packed.batch_sizes.tolist(), cell.weight[:, self.dim:],
                           self.hidden)
        return head(rows)


def padded(instances):
    """(tokens [B, longest], labels packed as the model packs, lengths) of a batch."""
    lengths = torch.tensor([len(tokens) for tokens, _ in instances], dtype=torch.int64)
    longest = int(lengths.max())
    tokens = torch.zeros(len(instances), longest, dtype=torch.int64)
    labels = torch.zeros(len(instances), longest, dtype=torch.int64)
    for row, (ids, after) in enumerate(instances):
        tokens[row, :len(ids)] = torch.frombuffer(bytearray(ids), dtype=torch.uint8)
        labels[row, :len(after)] = torch.frombuffer(bytearray(after), dtype=torch.uint8)
    packed_labels = pack_padded_sequence(labels, lengths, batch_first=True,
                                         enforce_sorted=False).data
    return tokens, packed_labels, lengths


def train_step(model, optimizer, training, instances, rate):
    """One step on a batch: the mean loss over its real tokens, as troupe's key loss is."""
    tokens, labels, lengths = padded(instances)
    for group in optimizer.param_groups:
        group["lr"] = rate
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(tokens, lengths), labels)
    loss.backward()
    if training.get("clip_norm", 0) > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), training["clip_norm"])
    optimizer.step()
    return loss.item()


def validation_loss(model, validation, batch=64):
    total, count = 0.0, 0
    with torch.no_grad():
        for first in range(0, len(validation), batch):
            tokens, labels, lengths = padded(validation[first:first + batch])
            total += F.cross_entropy(model(tokens, lengths), labels, reduction="sum").item()
            count += labels.numel()
    return total / count


def describe(config):
    """The model in a few words, for a report's heading."""
    _, vocab, dim, hidden, classes = graph_shape(config)
    return "LSTM language model (embedding %dx%d, lstm_cell H=%d, head 2H->%d)" % (
        vocab, dim, hidden, classes)


# The name of PyTorch's configuration in a race.
PYTORCH_NAME = "pytorch padded+packed"
Model = LstmModel
