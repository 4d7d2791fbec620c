#!/usr/bin/env python3
"""tools/torch_gpt2_bench.py -- PyTorch's GPT-2 124M training step on a GPU,
the baseline the CUDA issue compares ztrain with: tokens/s and MFU, eager
and torch.compile, bf16 autocast, fused AdamW.

  python3 tools/torch_gpt2_bench.py [--B 16] [--T 1024] [--steps 20] [--peak-tflops 989]

MFU = 6 x params x tokens/s (+ attention's 12 x L x T x C per token)
divided by the GPU's dense bf16 peak (--peak-tflops; H200/H100 SXM: 989).
The model is GPT-2 small written here (no transformers needed): tied
embedding, pre-LN blocks, GELU(tanh), causal scaled_dot_product_attention.
"""
import argparse, math, time, json, sys
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.NH = NH

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V=50257, maxT=1024, L=12, C=768, NH=12):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(maxT, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.L, self.C = L, C
        # GPT-2's initialisation: N(0, 0.02), residual projections / sqrt(2L)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def run(compiled, a):
    torch.manual_seed(1337)
    model = GPT().cuda()
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    step_model = torch.compile(model) if compiled else model
    x = torch.randint(0, 50257, (a.B, a.T), device="cuda")
    y = torch.randint(0, 50257, (a.B, a.T), device="cuda")
    times = []
    for i in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    med = sorted(times[a.warmup:])[len(times[a.warmup:]) // 2]
    tps = a.B * a.T / med
    flops_per_token = 6 * nparams + 12 * model.L * a.T * model.C
    mfu = tps * flops_per_token / (a.peak_tflops * 1e12)
    return {"mode": "torch.compile" if compiled else "eager", "tokens_per_s": tps, "step_ms": med * 1000,
            "mfu": mfu, "params": nparams, "loss": float(loss.detach())}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--B", type=int, default=16)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--json", default="")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    info = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "B": a.B, "T": a.T,
            "peak_tflops": a.peak_tflops, "runs": []}
    for compiled in (False, True):
        r = run(compiled, a)
        info["runs"].append(r)
        print(f"{r['mode']:14s} {r['tokens_per_s']:10.0f} tok/s  {r['step_ms']:8.1f} ms/step  MFU {100*r['mfu']:5.1f}%",
              flush=True)
    print(json.dumps(info))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
