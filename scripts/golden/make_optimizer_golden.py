#!/usr/bin/env python3
"""Writes tests/fixtures/golden/optimizers.json: parameter trajectories of torch.optim on a
fixed float64 problem, which tests/optim/golden_test.cpp replays with gradscope's optimizer
factory. torch.optim has no Lion, and its Adafactor follows other conventions than Hugging
Face's: those two runs come from the short reference implementations below, written from the papers' algorithms (Adafactor with the
Hugging Face implementation's conventions, as docs/optimizers.md describes).

Run from the repository root with the project environment's Python (its pinned torch):
    .venv/bin/python scripts/golden/make_optimizer_golden.py

The problem: a 2-layer tanh MLP, y = W2 tanh(W1 x + b1) + b2, fitted by mean squared error
to fixed data. Data and initial parameters come from a seeded generator and are written into
the file, so the C++ side reads exactly the same numbers instead of regenerating them. JSON
floats are written with Python's repr, which round-trips float64 exactly.
"""

import json
import os
import sys

import torch
import torch.nn.functional as F

STEPS = 1000
SAMPLE_EVERY = 100
N, D_IN, D_HIDDEN, D_OUT = 32, 4, 16, 2  # samples, input, hidden, output widths

# Each run must be well conditioned: started from parameters perturbed by a relative
# PERTURBATION, its sampled parameters may move by at most MAX_DEVIATION. Otherwise the run
# amplifies rounding (these small problems turn chaotic at high learning rates: Adadelta at
# lr 1, Adafactor at lr 1e-2), and matching it at rtol 1e-6 would need bitwise-identical
# arithmetic, which another LibTorch build or a GPU does not give. Hence the learning rates.
PERTURBATION = 1e-13
MAX_DEVIATION = 1e-9

# name, optimizer (gradscope's name, a key of OPTIMIZERS), lr, weight decay, gradscope's
# --opt settings (strings, as on the command line), the same settings as keyword arguments.
RUNS = [
    ("sgd", "sgd", 0.1, 0.0, {}, {}),
    ("sgd_momentum", "sgd", 0.05, 0.0, {"momentum": "0.9"}, {"momentum": 0.9}),
    ("sgd_nesterov", "sgd", 0.05, 0.0, {"momentum": "0.9", "nesterov": "true"},
     {"momentum": 0.9, "nesterov": True}),
    # gradscope's Adam and AdamW step with ATen's fused kernel, as torch.optim's fused=True.
    ("adam", "adam", 1e-2, 0.0, {}, {"fused": True}),
    ("adamw", "adamw", 1e-2, 0.01, {}, {"fused": True}),
    ("adagrad", "adagrad", 0.05, 0.0, {}, {}),
    ("adadelta", "adadelta", 0.2, 0.0, {}, {}),
    ("adadelta_decay", "adadelta", 0.1, 0.01, {"rho": "0.95", "eps": "1e-05"},
     {"rho": 0.95, "eps": 1e-5}),
    ("lion", "lion", 1e-3, 0.1, {}, {}),
    ("adafactor", "adafactor", 1e-3, 0.0, {}, {}),
    ("adafactor_beta1_fixed_lr", "adafactor", 1e-2, 0.01,
     {"beta1": "0.9", "relative_step": "false", "clip_threshold": "0.5"},
     {"beta1": 0.9, "relative_step": False, "clip_threshold": 0.5}),
]


class Lion(torch.optim.Optimizer):
    """Chen et al. 2023, Algorithm 2, with decoupled weight decay."""

    def __init__(self, params, lr, weight_decay=0.0, betas=(0.9, 0.99)):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, betas=betas))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd, (beta1, beta2) = group["lr"], group["weight_decay"], group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - lr * wd)
                p.add_(m.mul(beta1).add_(p.grad, alpha=1 - beta1).sign_(), alpha=-lr)
                m.mul_(beta2).add_(p.grad, alpha=1 - beta2)


class Adafactor(torch.optim.Optimizer):
    """Shazeer & Stern 2018, factored second moment over the last two dims."""

    def __init__(self, params, lr, weight_decay=0.0, beta1=None, decay_rate=-0.8,
                 clip_threshold=1.0, eps=(1e-30, 1e-3), relative_step=True,
                 scale_parameter=True):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, beta1=beta1,
                                      decay_rate=decay_rate, clip_threshold=clip_threshold,
                                      eps=eps, relative_step=relative_step,
                                      scale_parameter=scale_parameter))

    @staticmethod
    def rms(t):
        return t.norm() / t.numel() ** 0.5

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            eps1, eps2 = group["eps"]
            for p in group["params"]:
                g = p.grad
                factored = g.dim() >= 2
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    if factored:
                        state["row"] = torch.zeros(g.shape[:-1], dtype=g.dtype)
                        state["col"] = torch.zeros(g.shape[:-2] + g.shape[-1:], dtype=g.dtype)
                    else:
                        state["v"] = torch.zeros_like(g)
                    if group["beta1"] is not None:
                        state["m"] = torch.zeros_like(g)
                state["step"] += 1
                t = state["step"]
                rho = min(group["lr"], t ** -0.5) if group["relative_step"] else group["lr"]
                alpha = self.rms(p).clamp_min(eps2) * rho if group["scale_parameter"] else rho
                beta2 = 1.0 - t ** group["decay_rate"]
                g2 = g.square() + eps1
                if factored:
                    row, col = state["row"], state["col"]
                    row.mul_(beta2).add_(g2.mean(-1), alpha=1 - beta2)
                    col.mul_(beta2).add_(g2.mean(-2), alpha=1 - beta2)
                    v = (row / row.mean(-1, keepdim=True)).unsqueeze(-1) * col.unsqueeze(-2)
                else:
                    v = state["v"]
                    v.mul_(beta2).add_(g2, alpha=1 - beta2)
                u = g / v.sqrt()
                u = u / (self.rms(u) / group["clip_threshold"]).clamp_min(1.0) * alpha
                if group["beta1"] is not None:
                    u = state["m"].mul_(group["beta1"]).add_(u, alpha=1 - group["beta1"])
                p.sub_(p * (group["weight_decay"] * alpha))
                p.sub_(u)

OPTIMIZERS = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "adagrad": torch.optim.Adagrad,
    "adadelta": torch.optim.Adadelta,
    "lion": Lion,
    "adafactor": Adafactor,
}

PARAM_NAMES = ["w1", "b1", "w2", "b2"]


def make_problem():
    g = torch.Generator().manual_seed(20231)
    x = torch.randn(N, D_IN, generator=g, dtype=torch.float64)            # (N, D_IN)
    teacher = torch.randn(D_OUT, D_IN, generator=g, dtype=torch.float64)  # (D_OUT, D_IN)
    y = torch.sin(x @ teacher.t())                                        # (N, D_OUT)
    params = {
        "w1": 0.5 * torch.randn(D_HIDDEN, D_IN, generator=g, dtype=torch.float64),
        "b1": 0.1 * torch.randn(D_HIDDEN, generator=g, dtype=torch.float64),
        "w2": 0.5 * torch.randn(D_OUT, D_HIDDEN, generator=g, dtype=torch.float64),
        "b2": 0.1 * torch.randn(D_OUT, generator=g, dtype=torch.float64),
    }
    return x, y, params


def loss_fn(p, x, y):
    h = F.linear(x, p["w1"], p["b1"]).tanh()  # (N, D_HIDDEN)
    out = F.linear(h, p["w2"], p["b2"])       # (N, D_OUT)
    return (out - y).pow(2).mean()


def tensor_json(t):
    return {"shape": list(t.shape), "values": [float(v) for v in t.reshape(-1).tolist()]}


def run(x, y, init, cls, lr, weight_decay, kwargs):
    p = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    opt = cls([p[k] for k in PARAM_NAMES], lr=lr, weight_decay=weight_decay, **kwargs)
    samples = []
    for step in range(1, STEPS + 1):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(p, x, y)
        loss.backward()
        opt.step()
        if step % SAMPLE_EVERY == 0:
            samples.append({
                "step": step,
                "loss_before_step": float(loss.item()),
                "params": [[float(v) for v in p[k].detach().reshape(-1).tolist()]
                           for k in PARAM_NAMES],
            })
    return samples


def main():
    torch.set_num_threads(1)
    x, y, init = make_problem()
    out = {
        "generated": "GENERATED FILE, do not edit: "
                     ".venv/bin/python scripts/golden/make_optimizer_golden.py",
        "torch_version": torch.__version__,
        "problem": {
            "description": "y ~ W2 tanh(W1 x + b1) + b2, loss mean((out - y)^2), float64",
            "x": tensor_json(x),
            "y": tensor_json(y),
            "param_names": PARAM_NAMES,
            "params": [tensor_json(init[k]) for k in PARAM_NAMES],
        },
        "steps": STEPS,
        "sample_every": SAMPLE_EVERY,
        "runs": [],
    }
    perturbed = {k: v * (1 + PERTURBATION) for k, v in init.items()}
    for name, optimizer, lr, weight_decay, opt, kwargs in RUNS:
        samples = run(x, y, init, OPTIMIZERS[optimizer], lr, weight_decay, kwargs)
        nearby = run(x, y, perturbed, OPTIMIZERS[optimizer], lr, weight_decay, kwargs)
        deviation = max(abs(a - b)
                        for sa, sb in zip(samples, nearby)
                        for pa, pb in zip(sa["params"], sb["params"])
                        for a, b in zip(pa, pb))
        if deviation > MAX_DEVIATION:
            sys.exit(f"error: run {name} is ill-conditioned: a {PERTURBATION} relative change "
                     f"of the start moves its parameters by {deviation:.2g} "
                     f"(> {MAX_DEVIATION}); lower its learning rate")
        print(f"{name:24s} loss {samples[0]['loss_before_step']:.6f} at step {SAMPLE_EVERY}, "
              f"{samples[-1]['loss_before_step']:.6f} at step {STEPS}; "
              f"deviation from a perturbed start {deviation:.1e}", file=sys.stderr)
        out["runs"].append({"name": name, "optimizer": optimizer, "lr": lr,
                            "weight_decay": weight_decay, "opt": opt,
                            "deviation_from_perturbed_start": deviation, "samples": samples})
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "tests", "fixtures", "golden", "optimizers.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
