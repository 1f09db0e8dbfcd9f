"""troupe's LSTM cells against PyTorch: lstm_cell against torch.nn.LSTMCell and tree_lstm_cell
against Tai et al.'s N-ary Tree-LSTM written below in torch, on the weights, rows and upstream
gradients that troupe_lstm_cell_dump wrote. Forward outputs and every gradient must agree within
1e-5 relative (largest difference over the largest reference value). PyTorch computes in
float64, so the differences are troupe's float32 rounding.

Usage: lstm_cell_pytorch_test.py DUMP_FILE (exits 77 where torch is missing: ctest's skip)."""

import sys

try:
    import torch
except ImportError:
    print("lstm_cell_pytorch_test.py: no torch; skipped")
    sys.exit(77)

TOLERANCE = 1e-5


def read_cases(path):
    cases, case = [], None
    with open(path) as file:
        for line in file:
            words = line.split()
            if words[0] == "case":
                case = {"type": words[1]}
                case.update({words[i]: int(words[i + 1]) for i in range(2, len(words), 2)})
                cases.append(case)
            else:
                values = [float(v) for v in words[2:]]
                assert len(values) == int(words[1]), words[0]
                case[words[0]] = torch.tensor(values, dtype=torch.float64)
    return cases


def leaf(*tensors):
    return [t.clone().requires_grad_(True) for t in tensors]


def lstm_cell(case):
    """torch.nn.LSTMCell with troupe's one weight [4H, X + H] split into weight_ih and weight_hh."""
    hidden, x, rows = case["hidden"], case["x"], case["rows"]
    cell = torch.nn.LSTMCell(x, hidden).double()
    weight = case["weight"].view(4 * hidden, x + hidden)
    with torch.no_grad():
        cell.weight_ih.copy_(weight[:, :x])
        cell.weight_hh.copy_(weight[:, x:])
        cell.bias_ih.copy_(case["bias"])
        cell.bias_hh.zero_()
    row = case["input"].view(rows, x + 2 * hidden)
    inputs = leaf(row[:, :x], row[:, x:x + hidden], row[:, x + hidden:])
    h, c = cell(inputs[0], (inputs[1], inputs[2]))
    output = torch.cat([h, c], dim=1)
    (output * case["upstream"].view(rows, 2 * hidden)).sum().backward()
    return {
        "output": output.detach().flatten(),
        "input_gradient": torch.cat([t.grad for t in inputs], dim=1).flatten(),
        "weight_gradient": torch.cat([cell.weight_ih.grad, cell.weight_hh.grad], dim=1).flatten(),
        "bias_gradient": cell.bias_ih.grad,
    }


def tree_lstm_cell(case):
    """Tai et al. 2015, N-ary Tree-LSTM: gates i, f_1 .. f_N, u, o from W [x | h_1 .. h_N] + b."""
    hidden, x, rows, n = case["hidden"], case["x"], case["rows"], case["children"]
    row = case["input"].view(rows, x + 2 * n * hidden)
    pieces = [row[:, :x]]
    for k in range(n):
        start = x + 2 * k * hidden
        pieces += [row[:, start:start + hidden], row[:, start + hidden:start + 2 * hidden]]
    inputs = leaf(*pieces)
    weight, bias = leaf(case["weight"].view((3 + n) * hidden, x + n * hidden), case["bias"])
    hs, cs = inputs[1::2], inputs[2::2]
    gates = torch.cat([inputs[0]] + hs, dim=1) @ weight.t() + bias
    blocks = gates.split(hidden, dim=1)
    i, forgets, u, o = blocks[0].sigmoid(), blocks[1:1 + n], blocks[1 + n].tanh(), blocks[2 + n]
    c = i * u
    for k in range(n):
        c = c + forgets[k].sigmoid() * cs[k]
    h = o.sigmoid() * c.tanh()
    output = torch.cat([h, c], dim=1)
    (output * case["upstream"].view(rows, 2 * hidden)).sum().backward()
    return {
        "output": output.detach().flatten(),
        "input_gradient": torch.cat([t.grad for t in inputs], dim=1).flatten(),
        "weight_gradient": weight.grad.flatten(),
        "bias_gradient": bias.grad,
    }


def main():
    cases = read_cases(sys.argv[1])
    assert len(cases) == 4, "expected an lstm_cell and three tree_lstm_cell cases"
    failures = 0
    for case in cases:
        reference = lstm_cell(case) if case["type"] == "lstm_cell" else tree_lstm_cell(case)
        for name, expected in reference.items():
            actual = case[name]
            error = ((actual - expected).abs().max() / expected.abs().max()).item()
            verdict = "ok" if error <= TOLERANCE else "FAIL"
            failures += verdict != "ok"
            print(f"{case['type']} N={case['children']} {name}: relative difference {error:.2e} "
                  f"{verdict}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
