"""The Tree-LSTM of a troupe ListOps job in PyTorch: its model, its data and its training loop.

The data are the expressions troupe trains on, as `troupe dataset JOB --out DIR` writes them
(DIR/train.tsv, DIR/test.tsv: label<TAB>expression, and the resolved DIR/config.json). Each
expression becomes the binary tree troupe builds (layers/listops.h): its tokens are the leaves,
combined left-branching within a list, (((`[MAX` 2) 9) `]`), a nested list its own subtree, and
each combination an internal part with the token 15.

The model is the job's graph, node for node: an embedding (a token table and one learned
position row, both U(+-0.02 sqrt 3), as troupe's embedding), one or more N-ary Tree-LSTM cells
of Tai et al. 2015 over the whole tree (a cell after the first takes the [h | c] of the one
before at each part as that part's input) as troupe's tree_lstm_cell computes them (gates i, f_1 .. f_N, u, o from one GEMM over
[x | h_1 .. h_N]; c = i*u + sum f_k*c_k; h = o*tanh(c); every value U(+-1/sqrt(H)); a leaf's
children are zeros), and a linear head over the root's [h | c] (U(+-1/sqrt(fan_in)), PyTorch's
nn.Linear). Softmax cross-entropy, the mean over a batch; Adam and global gradient clipping.

Two implementations compute the same numbers:
  recursive  each tree walked in Python, one cell call per part (one row);
  batched    level by level: every part of a batch at the same height in one cell call.
Evaluation always runs the batched form (the same math, without gradients).

This module chooses no threads and no OMP_WAIT_POLICY: on a 2-core machine untuned PyTorch runs
about 3x slower. Every caller that reports a time (pytorch_listops.py train, race and speed)
first enters the setting tuning.py's probe chose (tuning.enter_pytorch); check and compare
report values only.
"""

import json
import os
import time

import numpy
import torch
from torch.nn import functional as F

TOKEN_IDS = {name: index for index, name in enumerate(
    ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "[MAX", "[MIN", "[MED", "[SM", "]"])}
CLOSE_TOKEN = TOKEN_IDS["]"]
NODE_TOKEN = 15
IMPLEMENTATIONS = ("recursive", "batched")


# ---- the data ----------------------------------------------------------------------------------

class Tree:
    """One expression: per part (post-order, the root last) its token, its left and right
    child (-1: none) and its height (0 for a leaf); and the expression's label."""

    def __init__(self, tokens, left, right, label):
        self.tokens, self.left, self.right, self.label = tokens, left, right, label
        height = []
        for l, r in zip(left, right):
            height.append(0 if l < 0 and r < 0 else
                          1 + max(height[l] if l >= 0 else 0, height[r] if r >= 0 else 0))
        self.height = height
        self.token_tensor = torch.tensor(tokens, dtype=torch.long)

    @property
    def root(self):
        return len(self.tokens) - 1


def parse_expression(text, label):
    """The Tree of an expression's text ("[MAX 2 9 [MIN 4 7 ] 0 ]"), as troupe builds it."""
    words = [word for word in text.split() if word not in ("(", ")")]
    tokens, left, right = [], [], []
    position = 0

    def part(token, l=-1, r=-1):
        tokens.append(token)
        left.append(l)
        right.append(r)
        return len(tokens) - 1

    def parse_list():
        nonlocal position
        current = part(TOKEN_IDS[words[position]])
        position += 1
        while words[position] != "]":
            if words[position].startswith("["):
                argument = parse_list()
            else:
                argument = part(TOKEN_IDS[words[position]])
                position += 1
            current = part(NODE_TOKEN, current, argument)
        position += 1
        close = part(CLOSE_TOKEN)
        return part(NODE_TOKEN, current, close)

    parse_list()
    if position != len(words):
        raise ValueError("tokens follow the expression's last ']'")
    return Tree(tokens, left, right, label)


def read_trees(path, limit=None):
    """The Trees of a label<TAB>expression file (its first `limit` lines when given)."""
    trees = []
    with open(path) as file:
        for number, line in enumerate(file, 1):
            if limit is not None and len(trees) >= limit:
                break
            if not line.strip():
                continue
            label, _, expression = line.rstrip("\n").partition("\t")
            try:
                trees.append(parse_expression(expression, int(label)))
            except (KeyError, IndexError, ValueError) as error:
                raise SystemExit("%s:%d: not a ListOps line (%s)" % (path, number, error))
    return trees


def read_job(directory):
    """The resolved job of `troupe dataset`'s DIR/config.json, checked to be what this model
    implements: embedding -> one or more tree_lstm_cell nodes (tree route; the last emits the
    root, any before it every part) -> linear, Adam."""
    with open(os.path.join(directory, "config.json")) as file:
        config = json.load(file)
    nodes = config["model"].get("nodes", [])
    kinds = [[layer["type"] for layer in node["layers"]] for node in nodes]
    training = config["training"]
    problems = []
    cells = nodes[1:-1]
    if len(kinds) < 3 or kinds[0] != ["embedding"] or kinds[-1] != ["linear"] or \
            any(kind != ["tree_lstm_cell"] for kind in kinds[1:-1]):
        problems.append("model.nodes are %s, not embedding, tree_lstm_cell (one or more), linear"
                        % kinds)
    elif any(node["route"] != "tree" for node in cells) or cells[-1]["emit"] != "root" or \
            any(node["emit"] != "every" for node in cells[:-1]):
        problems.append("the cells' nodes are not route = \"tree\", the last with emit = "
                        "\"root\" and any before it emit = \"every\"")
    if training["optimizer"] != "adam" or training["lr_schedule"] != "constant" or \
            training["warmup_steps"] or training["weight_decay"]:
        problems.append("training is not Adam at a constant rate without warm-up or decay")
    if config["data"]["dataset"] != "listops":
        problems.append("data.dataset is not listops")
    if problems:
        raise SystemExit("listops_model: %s: %s" % (directory, "; ".join(problems)))
    return config


# ---- the model ---------------------------------------------------------------------------------

class TreeCell(torch.nn.Module):
    """One tree_lstm_cell: rows [x | h_1 .. h_N] -> [h | c]."""

    def __init__(self, inputs, hidden, arity):
        super().__init__()
        self.hidden, self.arity = hidden, arity
        bound = hidden ** -0.5
        gates = (3 + arity) * hidden
        self.weight = torch.nn.Parameter(
            torch.empty(gates, inputs + arity * hidden).uniform_(-bound, bound))
        self.bias = torch.nn.Parameter(torch.empty(gates).uniform_(-bound, bound))

    def forward(self, x, children):
        """The rows [h | c] of parts whose inputs are `x` and whose children's [h | c] rows are
        `children` (one tensor per child, zeros where a part has none)."""
        hidden, arity = self.hidden, self.arity
        inputs = torch.cat([x] + [child[:, :hidden] for child in children], 1)
        gates = torch.addmm(self.bias, inputs, self.weight.t())
        sigmoids = torch.sigmoid(gates[:, :(1 + arity) * hidden])
        u = torch.tanh(gates[:, (1 + arity) * hidden:(2 + arity) * hidden])
        o = torch.sigmoid(gates[:, (2 + arity) * hidden:])
        c = sigmoids[:, :hidden] * u
        for k, child in enumerate(children):
            c = c + sigmoids[:, (1 + k) * hidden:(2 + k) * hidden] * child[:, hidden:]
        return torch.cat([o * torch.tanh(c), c], 1)


class TreeLstm(torch.nn.Module):
    """The embedding, the tree cells in order (each over the whole tree; a cell after the first
    takes the [h | c] rows of the one before as each part's input) and the head."""

    def __init__(self, config):
        super().__init__()
        nodes = config["model"]["nodes"]
        embedding, head = nodes[0]["layers"][0], nodes[-1]["layers"][0]
        dim = embedding["dim"]
        bound = 0.02 * 3 ** 0.5
        self.table = torch.nn.Parameter(
            torch.empty(embedding["vocab"], dim).uniform_(-bound, bound))
        self.position = torch.nn.Parameter(torch.empty(dim).uniform_(-bound, bound))
        cells, inputs = [], dim
        for node in nodes[1:-1]:
            spec = node["layers"][0]
            cells.append(TreeCell(inputs, spec["out"], spec["arity"]))
            inputs = 2 * spec["out"]
        self.cells = torch.nn.ModuleList(cells)
        self.hidden = self.cells[-1].hidden
        self.head = torch.nn.Linear(inputs, head["out"])
        self.names = {"%s.embedding0.weight" % nodes[0]["name"]: self.table,
                      "%s.embedding0.position" % nodes[0]["name"]: self.position,
                      "%s.linear0.weight" % nodes[-1]["name"]: self.head.weight,
                      "%s.linear0.bias" % nodes[-1]["name"]: self.head.bias}
        for node, cell in zip(nodes[1:-1], self.cells):
            self.names["%s.tree_lstm_cell0.weight" % node["name"]] = cell.weight
            self.names["%s.tree_lstm_cell0.bias" % node["name"]] = cell.bias

    def load_troupe_weights(self, tensors):
        """Takes the weights of `troupe export`'s file ({name: tensor} without the stage
        prefix, gpt_model.read_safetensors)."""
        if set(tensors) != set(self.names):
            raise SystemExit("listops_model: troupe's weights are %s, not %s" % (
                sorted(tensors), sorted(self.names)))
        with torch.no_grad():
            for name, parameter in self.names.items():
                parameter.copy_(tensors[name].reshape(parameter.shape))

    def embed(self, tokens):
        return F.embedding(tokens, self.table) + self.position


def recursive_roots(model, trees):
    """The roots' [h | c], each tree walked recursively in Python, one part at a time, cell by
    cell."""
    roots = []
    for tree in trees:
        x = model.embed(tree.token_tensor)
        for cell in model.cells:
            zeros = torch.zeros(1, 2 * cell.hidden)
            states = [None] * len(tree.tokens)

            def state(part):
                children = [state(child) if child >= 0 else zeros
                            for child in (tree.left[part], tree.right[part])]
                states[part] = cell(x[part:part + 1], children)
                return states[part]

            root = state(tree.root)
            if cell is not model.cells[-1]:
                x = torch.cat(states)  # every part's [h | c], the next cell's inputs
        roots.append(root)
    return torch.cat(roots)


def level_plan(trees):
    """The batch as one forest: every part's token, the parts of each height (with their
    children's rows, the zero row `parts` for none) and the roots' rows."""
    sizes = numpy.array([len(tree.tokens) for tree in trees])
    offsets = numpy.concatenate([[0], numpy.cumsum(sizes)[:-1]])
    total = int(sizes.sum())
    tokens = torch.cat([tree.token_tensor for tree in trees])

    def children(side):
        rows = numpy.concatenate([numpy.asarray(getattr(tree, side)) for tree in trees])
        shifted = rows + numpy.repeat(offsets, sizes)
        return numpy.where(rows >= 0, shifted, total)

    left, right = children("left"), children("right")
    height = numpy.concatenate([tree.height for tree in trees])
    order = numpy.argsort(height, kind="stable")
    levels = []
    for nodes in numpy.split(order, numpy.cumsum(numpy.bincount(height))[:-1]):
        levels.append(tuple(torch.from_numpy(rows) for rows in (nodes, left[nodes], right[nodes])))
    return tokens, total, levels, torch.from_numpy(offsets + sizes - 1)


def batched_roots(model, trees):
    """The roots' [h | c], level by level: all parts of one height in one cell call, cell by
    cell."""
    tokens, total, levels, roots = level_plan(trees)
    x = model.embed(tokens)
    for cell in model.cells:
        states = torch.zeros(total + 1, 2 * cell.hidden)
        for nodes, left, right in levels:
            children = [states.index_select(0, left), states.index_select(0, right)]
            # In place: a read of `states` keeps only its rows' indices for the backward pass.
            states.index_copy_(0, nodes, cell(x.index_select(0, nodes), children))
        x = states[:total]
    return states.index_select(0, roots)


ROOTS = {"recursive": recursive_roots, "batched": batched_roots}


# ---- training ----------------------------------------------------------------------------------

class Trainer:
    """The job's training of `model` with one implementation."""

    def __init__(self, config, implementation, seed):
        torch.manual_seed(seed)
        self.model = TreeLstm(config)
        training = config["training"]
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=training["lr"],
                                          betas=(training["beta1"], training["beta2"]),
                                          eps=training["epsilon"])
        self.clip_norm = training["clip_norm"]
        self.batch_size = training["batch_size"]
        self.roots = ROOTS[implementation]
        self.generator = torch.Generator().manual_seed(seed)

    def loss(self, trees):
        labels = torch.tensor([tree.label for tree in trees])
        return F.cross_entropy(self.model.head(self.roots(self.model, trees)), labels)

    def step(self, trees):
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(trees)
        loss.backward()
        if self.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        self.optimizer.step()
        return loss.item()

    def epoch(self, trees):
        """One pass over `trees` in a fresh seeded order; the mean loss."""
        order = torch.randperm(len(trees), generator=self.generator).tolist()
        losses = [self.step([trees[i] for i in order[first:first + self.batch_size]])
                  for first in range(0, len(order), self.batch_size)]
        return sum(losses) / len(losses)

    def accuracy(self, trees, batch=256):
        correct = 0
        with torch.no_grad():
            for first in range(0, len(trees), batch):
                part = trees[first:first + batch]
                predicted = self.model.head(batched_roots(self.model, part)).argmax(1)
                correct += sum(int(p) == tree.label for p, tree in zip(predicted, part))
        return correct / len(trees)


def train(config, implementation, train_trees, test_trees, epochs, seed, report=print):
    """Trains `epochs` epochs, evaluating after each; per epoch (accuracy, seconds since the
    start, the mean training loss), and the seconds spent training (evaluations left out)."""
    trainer = Trainer(config, implementation, seed)
    history, trained_s = [], 0.0
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        before = time.perf_counter()
        loss = trainer.epoch(train_trees)
        trained_s += time.perf_counter() - before
        accuracy = trainer.accuracy(test_trees)
        history.append((accuracy, time.perf_counter() - start, loss))
        report("epoch %d  loss %.4f  test_accuracy %.4f  %.1f s" % (epoch, loss, accuracy,
                                                                   history[-1][1]))
    return history, trained_s
