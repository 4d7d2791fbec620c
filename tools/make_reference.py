#!/usr/bin/python3
"""Generate the GPT-2 reference fixture used by ztrain's Lua specs.

Writes spec/fixtures/gpt2_tiny_ref.json and spec/fixtures/gpt2_tiny_ref.bin
(format "ztrain-ref-1", see spec/fixtures/README.md).

Run with Debian's PyTorch (the pyenv python3 on PATH has no torch):

    /usr/bin/python3 tools/make_reference.py [--out-dir spec/fixtures]

The model is written by hand (no transformers) so that it matches ztrain's
implementation op for op: pre-LN GPT-2, LayerNorm eps 1e-5, GELU tanh
approximation, tied LM head without bias, mean cross-entropy loss.
Runs on CPU in float32 with fixed seeds and a single thread.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

FORMAT = "ztrain-ref-1"
ALIGN = 64
SEED = 1337

CONFIG = {"V": 256, "maxT": 128, "L": 2, "C": 64, "NH": 4, "B": 4, "T": 64}
OPTIM = {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
         "clip": 1.0, "decay": "dim>=2"}
STEPS = 10
LN_EPS = 1e-5


# --------------------------------------------------------------------------
# parameters (canonical flat-layout order)
# --------------------------------------------------------------------------

def param_specs(cfg):
    """[(name, shape)] in ztrain's canonical flat layout order."""
    V, maxT, L, C = cfg["V"], cfg["maxT"], cfg["L"], cfg["C"]
    specs = [("wte", (V, C)), ("wpe", (maxT, C))]
    for l in range(L):
        p = "h.%d." % l
        specs += [
            (p + "ln_1.weight", (C,)),
            (p + "ln_1.bias", (C,)),
            (p + "attn.c_attn.weight", (3 * C, C)),
            (p + "attn.c_attn.bias", (3 * C,)),
            (p + "attn.c_proj.weight", (C, C)),
            (p + "attn.c_proj.bias", (C,)),
            (p + "ln_2.weight", (C,)),
            (p + "ln_2.bias", (C,)),
            (p + "mlp.c_fc.weight", (4 * C, C)),
            (p + "mlp.c_fc.bias", (4 * C,)),
            (p + "mlp.c_proj.weight", (C, 4 * C)),
            (p + "mlp.c_proj.bias", (C,)),
        ]
    specs += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return specs


def init_params(cfg, gen):
    """GPT-2 style init, with non-trivial biases / LayerNorm params."""
    L = cfg["L"]
    params = {}
    for name, shape in param_specs(cfg):
        def normal(std, mean=0.0):
            return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            t = normal(0.1, 1.0)                      # LN weight: 1 + N(0, 0.1)
        elif name.endswith(".bias"):
            t = normal(0.02)                          # biases and LN biases: N(0, 0.02)
        elif name.endswith("c_proj.weight"):
            t = normal(0.02 / math.sqrt(2 * L))       # residual projections
        else:
            t = normal(0.02)                          # wte, wpe, c_attn, c_fc
        assert tuple(t.shape) == tuple(shape), name
        params[name] = t.contiguous()
    return params


# --------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------

def linear(x, w, b):
    # w is (out_features, in_features) as in nn.Linear
    return F.linear(x, w, b)


def attention(x, p, prefix, NH):
    """Causal self-attention, the way ztrain computes it."""
    B, T, C = x.shape
    hs = C // NH
    qkv = linear(x, p[prefix + "c_attn.weight"], p[prefix + "c_attn.bias"])  # (B,T,3C)
    q, k, v = qkv.split(C, dim=2)
    # head h uses channels [h*hs, (h+1)*hs) of each of q, k, v
    q = q.view(B, T, NH, hs).transpose(1, 2)  # (B,NH,T,hs)
    k = k.view(B, T, NH, hs).transpose(1, 2)
    v = v.view(B, T, NH, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf"))
    att = F.softmax(att, dim=-1)
    y = att @ v                                            # (B,NH,T,hs)
    y = y.transpose(1, 2).contiguous().view(B, T, C)       # merge heads
    return linear(y, p[prefix + "c_proj.weight"], p[prefix + "c_proj.bias"])


def attention_naive(x, p, prefix, NH):
    """Straightforward per-(b, h, t) loop reference, float64, for cross-check."""
    B, T, C = x.shape
    hs = C // NH
    xd = x.double()
    W = p[prefix + "c_attn.weight"].double()
    bias = p[prefix + "c_attn.bias"].double()
    qkv = xd @ W.t() + bias
    y = torch.zeros(B, T, C, dtype=torch.float64)
    for b in range(B):
        for h in range(NH):
            q = qkv[b, :, 0 * C + h * hs:0 * C + (h + 1) * hs]
            k = qkv[b, :, 1 * C + h * hs:1 * C + (h + 1) * hs]
            v = qkv[b, :, 2 * C + h * hs:2 * C + (h + 1) * hs]
            for t in range(T):
                s = torch.stack([(q[t] * k[j]).sum() / math.sqrt(hs) for j in range(t + 1)])
                w = torch.exp(s - s.max())
                w = w / w.sum()
                y[b, t, h * hs:(h + 1) * hs] = (w[:, None] * v[:t + 1]).sum(0)
    Wp = p[prefix + "c_proj.weight"].double()
    bp = p[prefix + "c_proj.bias"].double()
    return y @ Wp.t() + bp


def layernorm(x, p, prefix):
    return F.layer_norm(x, (x.shape[-1],), p[prefix + "weight"], p[prefix + "bias"], LN_EPS)


def mlp(x, p, prefix):
    h = linear(x, p[prefix + "c_fc.weight"], p[prefix + "c_fc.bias"])
    h = F.gelu(h, approximate="tanh")
    return linear(h, p[prefix + "c_proj.weight"], p[prefix + "c_proj.bias"])


def forward(p, tokens, targets, cfg):
    B, T = tokens.shape
    pos = torch.arange(T, dtype=torch.long)
    x = p["wte"][tokens] + p["wpe"][pos]
    for l in range(cfg["L"]):
        pre = "h.%d." % l
        x = x + attention(layernorm(x, p, pre + "ln_1."), p, pre + "attn.", cfg["NH"])
        x = x + mlp(layernorm(x, p, pre + "ln_2."), p, pre + "mlp.")
    x = layernorm(x, p, "ln_f.")
    logits = x @ p["wte"].t()                              # tied head, no bias
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
    return logits, loss


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------

class BinWriter:
    def __init__(self):
        self.chunks = []
        self.size = 0
        self.entries = []

    def add(self, name, t, dtype):
        if dtype == "f32":
            a = t.detach().cpu().numpy().astype("<f4", copy=False)
        elif dtype == "i32":
            a = t.detach().cpu().numpy().astype("<i4")
        else:
            raise ValueError(dtype)
        a = np.ascontiguousarray(a)
        pad = (-self.size) % ALIGN
        if pad:
            self.chunks.append(b"\0" * pad)
            self.size += pad
        self.entries.append({"name": name, "dtype": dtype, "shape": list(a.shape),
                             "offset": self.size, "numel": int(a.size)})
        raw = a.tobytes()
        self.chunks.append(raw)
        self.size += len(raw)

    def data(self):
        pad = (-self.size) % ALIGN
        return b"".join(self.chunks) + b"\0" * pad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out-dir", default=os.path.normpath(os.path.join(here, "..", "spec", "fixtures")))
    ap.add_argument("--name", default="gpt2_tiny_ref")
    args = ap.parse_args()

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)

    cfg = CONFIG
    B, T, V, C, NH = cfg["B"], cfg["T"], cfg["V"], cfg["C"], cfg["NH"]
    assert C % NH == 0 and T <= cfg["maxT"]

    gen = torch.Generator().manual_seed(SEED)
    init = init_params(cfg, gen)
    names = [n for n, _ in param_specs(cfg)]
    nparams = sum(init[n].numel() for n in names)
    print("gpt2-tiny: %d parameter tensors, %d parameters" % (len(names), nparams))

    seq = torch.randint(0, V, (B, T + 1), generator=gen, dtype=torch.long)
    tokens = seq[:, :-1].contiguous()
    targets = seq[:, 1:].contiguous()

    # ---- cross-check attention against the naive loop reference ----------
    xin = torch.randn(B, T, C, generator=gen)
    with torch.no_grad():
        for l in range(cfg["L"]):
            pre = "h.%d.attn." % l
            fast = attention(xin, init, pre, NH).double()
            slow = attention_naive(xin, init, pre, NH)
            err = (fast - slow).abs().max().item()
            print("attention cross-check layer %d: max abs err %.3e" % (l, err))
            assert err < 1e-5, err

    # ---- forward + backward ----------------------------------------------
    p = {n: init[n].clone().requires_grad_(True) for n in names}
    logits, loss = forward(p, tokens, targets, cfg)
    loss.backward()
    loss0 = loss.item()
    grads = {n: p[n].grad.detach().clone() for n in names}
    print("loss %.9g (ln V = %.6f)" % (loss0, math.log(V)))

    # ---- 10 AdamW steps on the same batch ---------------------------------
    q = {n: init[n].clone().requires_grad_(True) for n in names}
    plist = [q[n] for n in names]
    decay = [q[n] for n in names if q[n].dim() >= 2]
    no_decay = [q[n] for n in names if q[n].dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": OPTIM["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=OPTIM["lr"], betas=tuple(OPTIM["betas"]), eps=OPTIM["eps"],
        weight_decay=OPTIM["weight_decay"], foreach=False)
    losses, grad_norms = [], []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, l_ = forward(q, tokens, targets, cfg)
        l_.backward()
        gn = torch.nn.utils.clip_grad_norm_(plist, OPTIM["clip"])
        losses.append(l_.item())
        grad_norms.append(gn.item())
        opt.step()
        print("step %2d loss %.7f grad_norm %.6f" % (step, losses[-1], grad_norms[-1]))
    assert losses[0] == loss0, (losses[0], loss0)

    # ---- write ------------------------------------------------------------
    w = BinWriter()
    w.add("tokens", tokens, "i32")
    w.add("targets", targets, "i32")
    w.add("logits", logits, "f32")
    for n in names:
        w.add("param/" + n, init[n], "f32")
    for n in names:
        w.add("grad/" + n, grads[n], "f32")
    for n in names:
        w.add("final/" + n, q[n], "f32")

    meta = {
        "format": FORMAT,
        "torch_version": torch.__version__,
        "seed": SEED,
        "num_params": nparams,
        "config": cfg,
        "optim": OPTIM,
        "loss": loss0,
        "losses": losses,
        "grad_norms": grad_norms,
        "tensors": w.entries,
    }
    os.makedirs(args.out_dir, exist_ok=True)
    bin_path = os.path.join(args.out_dir, args.name + ".bin")
    json_path = os.path.join(args.out_dir, args.name + ".json")
    data = w.data()
    with open(bin_path, "wb") as f:
        f.write(data)
    # json.dumps uses repr() for floats: shortest round-tripping form.
    # Layout: indented top level, one compact line per tensor entry.
    tensors = meta.pop("tensors")
    lines = ["{"]
    for k, v in meta.items():
        lines.append(" %s: %s," % (json.dumps(k), json.dumps(v)))
    lines.append(' "tensors": [')
    lines.append(",\n".join("  " + json.dumps(e) for e in tensors))
    lines.append(" ]")
    lines.append("}")
    with open(json_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s (%d bytes), %s (%d tensors)" % (bin_path, len(data), json_path, len(w.entries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
