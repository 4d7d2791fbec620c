#!/usr/bin/env python3
"""PyTorch's flash attention at the GPU-Attention issue's shapes, the figure
ztrain's tensor-core attention is measured against (bench_cuda's "attention
... bf16 tc, bf16 I/O" rows: the same shapes, the same FLOP count).

scaled_dot_product_attention, flash backend, causal, bf16, (B, NH, T, hs)
tensors; forward, then backward alone (a forward with grad, then the timed
backward of a fixed dout). FLOPs count the causal half: forward
4 * B * NH * T^2 / 2 * hs, backward 2.5 times that (bench_cuda's counts).
Median of the timed repetitions, CUDA events around each.

    python3 tools/torch_attention_bench.py [--reps N]
"""
import argparse
import sys

import torch
import torch.nn.functional as F

SHAPES = [(16, 12, 1024, 64), (16, 16, 1024, 128), (4, 16, 4096, 64), (4, 16, 4096, 128), (2, 16, 8192, 64),
          (2, 16, 8192, 128)]


def timed(fn, reps):
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_attention_bench.py: no CUDA device visible to torch")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}: "
          "scaled_dot_product_attention (flash backend), causal, bf16", flush=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for B, NH, T, hs in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                   for _ in range(3))
        dout = torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16, generator=g)
        f = 4.0 * B * NH * (T * T / 2) * hs
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for _ in range(3):
                F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)
            with torch.no_grad():
                fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), a.reps)
            outs = []

            def bwd():
                outs[0].backward(dout, retain_graph=True)
            outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True))
            bwd_ms = timed(bwd, a.reps)
        print(f"torch sdpa flash B={B} NH={NH} T={T} hs={hs}: fwd {fwd:.3f} ms {f / fwd / 1e9:.1f} TFLOP/s, "
              f"bwd {bwd_ms:.3f} ms {2.5 * f / bwd_ms / 1e9:.1f} TFLOP/s", flush=True)
        del q, k, v, dout, outs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
