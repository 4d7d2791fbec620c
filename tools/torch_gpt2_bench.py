#!/usr/bin/env python3
"""tools/torch_gpt2_bench.py -- PyTorch's GPT-2 training step, the peer ztrain
is measured beside: tokens/s and MFU, eager and torch.compile, AdamW.

  GPU (the CUDA issue's baseline): python3 tools/torch_gpt2_bench.py
      [--B 16] [--T 1024] [--steps 20] [--peak-tflops 989]      (bf16 autocast)
  CPU (make bench-peers, tools/bench_peers.sh):
      python3 tools/torch_gpt2_bench.py --device cpu --model gpt2 --B 4 --T 256
      --precision fp32,bf16 --threads 2 --steps 4 --warmup 1 --markdown

--precision fp32: no autocast; bf16: torch.autocast(bfloat16) (the GPU's
default). --threads sets torch.set_num_threads (the CPU run uses as many
threads as ztrain). --markdown prints one table row per run, the columns of
docs/performance.md's peers table.
MFU = 6 x params x tokens/s (+ attention's 12 x L x T x C per token)
divided by the device's peak (--peak-tflops; H200/H100 SXM bf16: 989; on the
CPU pass the sgemm peak bench.lua measures, in TFLOP/s, or leave it 0: no MFU).
The model is GPT-2 written here (no transformers needed): tied embedding,
pre-LN blocks, GELU(tanh), causal scaled_dot_product_attention.
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


SIZES = {"gpt2": (12, 768, 12), "gpt2-medium": (24, 1024, 16), "gpt2-mini": (4, 128, 4),
         "gpt2-tiny": (2, 64, 4)}


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def run(compiled, a, precision):
    torch.manual_seed(1337)
    L, C, NH = SIZES[a.model]
    dev = a.device
    model = GPT(L=L, C=C, NH=NH).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    except (RuntimeError, TypeError):   # a torch without fused AdamW on this device
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    step_model = torch.compile(model) if compiled else model
    x = torch.randint(0, 50257, (a.B, a.T), device=dev)
    y = torch.randint(0, 50257, (a.B, a.T), device=dev)
    times = []
    for i in range(a.steps + a.warmup):
        sync(dev)
        t0 = time.perf_counter()
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = step_model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(dev)
        times.append(time.perf_counter() - t0)
    med = sorted(times[a.warmup:])[len(times[a.warmup:]) // 2]
    tps = a.B * a.T / med
    flops_per_token = 6 * nparams + 12 * model.L * a.T * model.C
    mfu = tps * flops_per_token / (a.peak_tflops * 1e12) if a.peak_tflops > 0 else 0.0
    return {"mode": "torch.compile" if compiled else "eager", "precision": precision, "tokens_per_s": tps,
            "step_ms": med * 1000, "mfu": mfu, "params": nparams, "loss": float(loss.detach()),
            "gflops": tps * flops_per_token / 1e9}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--model", default="gpt2", choices=sorted(SIZES))
    p.add_argument("--B", type=int, default=None, help="default 16 on cuda, 4 on cpu")
    p.add_argument("--T", type=int, default=None, help="default 1024 on cuda, 256 on cpu")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20 on cuda, 3 on cpu)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 5 on cuda, 1 on cpu)")
    p.add_argument("--precision", default=None, help="fp32, bf16 or both (default bf16 on cuda, fp32,bf16 on cpu)")
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--peak-tflops", type=float, default=None, help="default 989 on cuda, 0 (no MFU) on cpu")
    p.add_argument("--markdown", action="store_true", help="one docs/performance.md row per run")
    p.add_argument("--json", default="")
    a = p.parse_args()
    gpu = a.device == "cuda"
    for k, g, c in (("B", 16, 4), ("T", 1024, 256), ("steps", 20, 3), ("warmup", 5, 1),
                    ("precision", "bf16", "fp32,bf16"), ("peak_tflops", 989.0, 0.0)):
        if getattr(a, k) is None:
            setattr(a, k, g if gpu else c)
    if gpu and not torch.cuda.is_available():
        sys.exit("torch_gpt2_bench.py: no CUDA device visible to torch; use --device cpu")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = True
    info = {"device": torch.cuda.get_device_name(0) if gpu else "cpu", "torch": torch.__version__,
            "model": a.model, "B": a.B, "T": a.T, "threads": torch.get_num_threads(),
            "peak_tflops": a.peak_tflops, "runs": []}
    if a.markdown:
        print(f"torch {torch.__version__}, {info['device']}, {torch.get_num_threads()} threads, "
              f"{'MKL' if torch.backends.mkl.is_available() else 'no MKL'}", flush=True)
    for precision in a.precision.split(","):
        for mode in a.modes.split(","):
            r = run(mode == "compile", a, precision)
            info["runs"].append(r)
            if a.markdown:
                print(f"| {a.model} | {precision} | PyTorch {r['mode']} | {r['step_ms']:.1f} | "
                      f"{r['tokens_per_s']:.1f} | {r['gflops']:.1f} |", flush=True)
            else:
                print(f"{r['mode']:14s} {precision:5s} {r['tokens_per_s']:10.1f} tok/s  {r['step_ms']:8.1f} ms/step"
                      f"  MFU {100*r['mfu']:5.1f}%", flush=True)
    if not a.markdown:
        print(json.dumps(info))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
