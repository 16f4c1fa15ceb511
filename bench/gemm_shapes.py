"""The matrix products of one training step, each timed alone against a square product.

Reads the weight shapes `gradscope list --tensors MODEL --preset P` prints; every 2-D weight
is taken as a linear layer's (out, in) on N = batch x seq rows, and the embedding, tied to the
head, as the head's (the model's head must be tied: an untied one is refused). Each weight
gives three products, as autograd runs them for y = x W^T: forward (N, in) x (in, out), the
input's gradient (N, out) x (out, in) and the weight's, G^T x: (out, N) x (N, in). Each
product is timed with torch.mm into a buffer made once, `--reps` times per round, the rounds
interleaved with a square fp32 product of `--square` (gradscope probe's largest size) so
that both see the same machine. Prints a JSON object: per product its FLOPs and its best and
median FLOP/s over all repetitions, the square product's, and the time the step's products
would take at their median rates.

Run with the project environment's Python (bench.py does), whose torch is gradscope's.
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import time

import torch


def weight_shapes(gradscope, model, preset):
    """(name, out, in) for every 2-D tensor of the model's weights file."""
    text = subprocess.run([gradscope, "list", "--tensors", model, "--preset", preset],
                          check=True, capture_output=True, text=True).stdout
    shapes = []
    for line in text.splitlines():
        m = re.match(r"^(\S+)\s+\((\d+), (\d+)\)\s*$", line)
        if m:
            shapes.append((m.group(1), int(m.group(2)), int(m.group(3))))
    if not shapes:
        sys.exit(f"gemm_shapes: no 2-D tensor in `gradscope list --tensors {model}`")
    # An untied head has a weight of its own, and its embedding is no product.
    if any(name.endswith("lm_head.weight") for name, _, _ in shapes):
        sys.exit(f"gemm_shapes: {model} {preset} has an untied head; the script takes the "
                 "embedding as the tied head's weight")
    return shapes


def products(shapes, n):
    """The step's products: (weight, kind, m, k, n_cols, count) per distinct shape.

    Autograd's linear runs, for y = x W^T with W^T read column-major, the weight's gradient
    as G^T x, (out, N) x (N, in), and hands on its transpose's transpose; gradscope's head
    (head_logits) runs the same product."""
    seen = {}
    for name, out, inp in shapes:
        # Layers repeat: one entry per shape, counted.
        what = re.sub(r"\.\d+\.", ".N.", name)
        for kind, (a, b, c) in (("forward", (n, inp, out)), ("input gradient", (n, out, inp)),
                                ("weight gradient", (out, n, inp))):
            key = (what, kind, a, b, c)
            seen[key] = seen.get(key, 0) + 1
    return [(*key, count) for key, count in seen.items()]


def timed(f, reps):
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gradscope", required=True)
    p.add_argument("--model", default="llama")
    p.add_argument("--preset", default="small")
    p.add_argument("--rows", type=int, required=True, help="N: batch x seq")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--square", type=int, default=2048)
    args = p.parse_args()
    if args.rows < 1 or args.threads < 1 or args.rounds < 1 or args.reps < 1:
        sys.exit("gemm_shapes: --rows, --threads, --rounds and --reps must be positive")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cases = []
    for what, kind, m, k, n, count in products(
            weight_shapes(args.gradscope, args.model, args.preset), args.rows):
        # The operands as the step hands them: a transposed view where the product reads one.
        if kind == "forward":  # x W^T
            a, b = torch.randn(m, k), torch.randn(n, k).t()
        elif kind == "input gradient":  # G W
            a, b = torch.randn(m, k), torch.randn(k, n)
        else:  # G^T x: the transpose of the (N, out) gradient, read column-major
            a, b = torch.randn(k, m).t(), torch.randn(k, n)
        out = torch.empty(m, n)
        cases.append({"weight": what, "product": kind, "m": m, "k": k, "n": n, "count": count,
                      "flops": 2.0 * m * k * n,
                      "run": (lambda a=a, b=b, out=out: torch.mm(a, b, out=out)), "s": []})
    s = args.square
    sa, sb, so = torch.randn(s, s), torch.randn(s, s), torch.empty(s, s)
    square = {"flops": 2.0 * s ** 3, "run": lambda: torch.mm(sa, sb, out=so), "s": []}
    for _ in range(args.rounds):
        for c in [square] + cases:
            c["run"]()  # warm
            c["s"] += timed(c["run"], args.reps)

    def rates(c):
        return {"best_per_s": c["flops"] / min(c["s"]),
                "median_per_s": c["flops"] / statistics.median(c["s"])}

    result = {"threads": args.threads, "rows": args.rows, "model": args.model,
              "preset": args.preset, "square": {"size": s, **rates(square)}, "products": []}
    total_flops = total_s = 0.0
    for c in cases:
        r = rates(c)
        total_flops += c["count"] * c["flops"]
        total_s += c["count"] * c["flops"] / r["median_per_s"]
        result["products"].append({k: c[k] for k in ("weight", "product", "m", "k", "n",
                                                     "count", "flops")} | r)
    result["products_flops"] = total_flops
    result["products_s_at_median"] = total_s
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
