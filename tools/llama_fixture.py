#!/usr/bin/env python3
"""Make the Llama-family fidelity fixtures (issue 33 item 5) with PyPI's torch
and transformers.

For each family -- llama (Llama 3 "llama3" RoPE scaling, GQA, untied head),
qwen2 (q/k/v biases, GQA, tied embeddings, a sliding_window that
use_sliding_window=false switches off, as Qwen2.5's configs have), mistral
(sliding window of 8 < T = 24, GQA) -- a RANDOM-initialised tiny model is
saved as a Hugging Face directory, and what ztrain must reproduce is written
beside it. llama-bf16 is llama's model with its weights rounded to bf16 and
saved as BF16 (config torch_dtype bfloat16): every number computed in fp32
from those weights (no grad/), plus bf16/logits and bf16/loss, the same
directory run in bf16 by transformers (a loose reference).

  spec/fixtures/llama/<family>/config.json          the model's config (see CONFIG FORMS)
  spec/fixtures/llama/<family>/model.safetensors    F32 parameters, HF names
  spec/fixtures/llama/<family>/expected.safetensors what transformers computes

expected.safetensors (every float the fp32 value torch produced):

  tokens      I32 [B, T]    input ids      (seq[:, :-1] of a random [B, T+1] sequence)
  targets     I32 [B, T]    next-token ids (seq[:, 1:])
  logits      F32 [B, T, V] model(tokens).logits, initial weights
  loss        F32 [1]       mean cross-entropy of logits vs targets over all B*T positions
  grad/NAME   F32 (shape of parameter NAME)  d loss / d NAME at the initial weights,
              for every parameter in model.safetensors (a tied lm_head's
              gradient is inside grad/model.embed_tokens.weight)
  losses      F32 [STEPS+1] losses[i] = loss after i AdamW steps on the same batch
  grad_norms  F32 [STEPS]   the total gradient L2 norm at each step, before clipping
  final/NAME  F32           every parameter after the STEPS steps (--final; off by default)
  prompt      I32 [1, P]    a random prompt
  generated   I32 [1, P+N]  model.generate(prompt, do_sample=False, max_new_tokens=N),
              no end-of-text stop (eos_token_id=None): the prompt then N greedy ids

and __metadata__ (strings; JSON where structured): made_by, family (the model_type), weights (f32 or bf16), torch,
transformers, seed, batch, optim (lr, betas, eps, weight_decay, clip, decay
rule, steps), rope (what the config asks for and inv_freq as transformers
computed it), sliding_window, generate (min_margin: the smallest top-1 minus
top-2 logit along the greedy path), loss, losses, grad_norms, ref_max_abs_diff
(this tool's own float64 re-implementation vs transformers' logits).

Training (what ztrain's defaults reproduce; lua/ztrain/model/adamw.lua and
train/recipe.lua): torch.nn.utils.clip_grad_norm_(params, 1.0) -- ztrain's
default optim.clip = 1 with PyTorch's scale clip / (norm + 1e-6) -- then
torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False) with
weight_decay 0.1 on tensors of dim >= 2 (embeddings, lm_head, every
projection) and 0 on the RMSNorm weights and the biases -- ztrain's decay
rule -- at a constant lr (ztrain: lr.warmup = 0, a constant schedule).

CONFIG FORMS: transformers 5 writes RoPE settings as "rope_parameters"
({"rope_type", "rope_theta", ...}); the Hub's Llama 3.x / Qwen2.5 files (and
transformers 4) use "rope_theta" and "rope_scaling". llama/ and qwen2/ get
the Hub's form (written by this tool from the model's config), mistral/ keeps
transformers 5's own save_pretrained form, so a loader sees both. Every
directory is loaded back with from_pretrained and must give bit-identical
logits to the model that made the numbers.

Requirements (torch with a CPU, transformers, safetensors):

    python3 -m venv .venv-torch          # gitignored
    .venv-torch/bin/pip install torch transformers safetensors
    .venv-torch/bin/python tools/llama_fixture.py [--out-dir spec/fixtures/llama] [--only llama]

CPU, float32, one thread, deterministic algorithms, fixed seeds: rerunning on
the same torch build gives the same bytes. A few seconds per family.
"""

import argparse
import copy
import json
import math
import os
import shutil

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import transformers
from transformers import (AutoModelForCausalLM, GenerationConfig, LlamaConfig, MistralConfig,
                          Qwen2Config)

SEED = 20261127
B, T = 2, 24
PROMPT_LEN, NEW_TOKENS = 12, 8
STEPS = 10
OPTIM = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, clip=1.0)

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              hidden_act="silu", attention_dropout=0.0, bos_token_id=None, eos_token_id=None,
              pad_token_id=None)

# Llama 3 scaling, sized for head_dim 16 and rope_theta 5e5: wavelengths
# 2*pi*theta^(i/8) = 6.3, 32.4, 167, 864, ...; original_max_position_embeddings
# 256 / high_freq_factor 4 = 64 and / low_freq_factor 1 = 256: i = 0, 1 kept,
# i = 2 smoothed, i >= 3 divided by factor -- each regime present, none near
# a boundary.
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 256}

FAMILIES = {
    "llama": dict(cls=LlamaConfig, seed_offset=1, hub_form=True,
                  kw=dict(COMMON, rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False,
                          tie_word_embeddings=False, max_position_embeddings=1024,
                          rope_parameters=dict(LLAMA3_SCALING, rope_theta=500000.0))),
    "qwen2": dict(cls=Qwen2Config, seed_offset=2, hub_form=True,
                  kw=dict(COMMON, rms_norm_eps=1e-6, tie_word_embeddings=True,
                          use_sliding_window=False, sliding_window=8, max_window_layers=1,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "mistral": dict(cls=MistralConfig, seed_offset=3, hub_form=False,
                    kw=dict(COMMON, rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=8,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
}
# llama's model (same seed, same draws) with its weights rounded to bf16 and
# saved as BF16: loading a bf16 checkpoint; no grad/ (llama/ has them)
FAMILIES["llama-bf16"] = dict(FAMILIES["llama"], base="llama", weights="bf16", grads=False)


def randomize(model, gen, tied):
    """Every parameter random, O(1) logits: HF's init leaves norms at 1 and
    biases at 0 (a mis-mapped one would go unseen) and gives near-uniform
    logits (greedy generation would be ties)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name == "model.embed_tokens.weight":
                p.copy_((0.3 if tied else 1.0) * torch.randn(p.shape, generator=gen))
            elif name == "lm_head.weight":
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            else:                                   # projections: 1/sqrt(fan_in)
                # tied: each block's output scaled up 4x, or the embedding of
                # the last token dominates the residual and e.e wins the tied
                # head -- greedy generation then repeats one token forever
                up = 1.0
                if tied and name.endswith(("o_proj.weight", "down_proj.weight")):
                    up = 4.0
                elif tied and name.endswith(("q_proj.weight", "k_proj.weight")):
                    up = 2.0
                p.copy_(up * torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))


def hub_config(saved, family):
    """config.json as the Hub's Llama 3.x / Qwen2.5 files spell it, from the
    one save_pretrained wrote: rope_theta and rope_scaling for
    rope_parameters, no layer_types, torch_dtype for dtype."""
    d = dict(saved)
    rp = d.pop("rope_parameters")
    d.pop("layer_types", None)
    d["rope_theta"] = rp["rope_theta"]
    if rp.get("rope_type", "default") != "default":
        d["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
    else:
        d["rope_scaling"] = None
    if family == "qwen2":
        # Qwen2.5's files carry a sliding_window that use_sliding_window=false
        # turns off (transformers saves it as null; the Hub's files keep it)
        d["sliding_window"] = FAMILIES["qwen2"]["kw"]["sliding_window"]
        d.pop("head_dim", None)
    d["torch_dtype"] = d.pop("dtype", "float32")
    return d


# ---------------------------------------------------------------------------
# An independent float64 forward (no transformers code): what the README says
# the model is. The tool refuses to write a fixture it disagrees with.

def ref_inv_freq(kw):
    D = kw["hidden_size"] // kw["num_attention_heads"]
    rp = kw["rope_parameters"]
    inv = [rp["rope_theta"] ** (-(2 * i) / D) for i in range(D // 2)]
    if rp.get("rope_type") == "llama3":
        f, lo, hi, old = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"], rp["original_max_position_embeddings"]
        out = []
        for x in inv:
            wl = 2 * math.pi / x
            if wl < old / hi:
                out.append(x)
            elif wl > old / lo:
                out.append(x / f)
            else:
                s = (old / wl - lo) / (hi - lo)
                out.append((1 - s) * x / f + s * x)
        inv = out
    return torch.tensor(inv, dtype=torch.float64)


def ref_forward(sd, kw, ids, window):
    d = {k: v.to(torch.float64) for k, v in sd.items()}
    H, KV = kw["num_attention_heads"], kw["num_key_value_heads"]
    C = kw["hidden_size"]
    D = C // H
    eps = kw["rms_norm_eps"]
    Bn, Tn = ids.shape

    def rms(x, w):
        return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))

    def lin(x, name):
        y = x @ d[name + ".weight"].T
        return y + d[name + ".bias"] if name + ".bias" in d else y

    inv = ref_inv_freq(kw)
    ang = torch.arange(Tn, dtype=torch.float64)[:, None] * inv[None, :]       # [T, D/2]
    cos, sin = torch.cos(ang), torch.sin(ang)

    def rope(x):                 # x [B, T, heads, D]; pairs (i, i + D/2) (HF's rotate_half)
        a, b = x[..., :D // 2], x[..., D // 2:]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    i = torch.arange(Tn)[:, None]
    j = torch.arange(Tn)[None, :]
    allowed = j <= i
    if window is not None:
        allowed = allowed & (j > i - window)       # the last `window` positions, itself included
    x = d["model.embed_tokens.weight"][ids]
    for l in range(kw["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = rms(x, d[p + "input_layernorm.weight"])
        q = rope(lin(h, p + "self_attn.q_proj").view(Bn, Tn, H, D))
        k = rope(lin(h, p + "self_attn.k_proj").view(Bn, Tn, KV, D))
        v = lin(h, p + "self_attn.v_proj").view(Bn, Tn, KV, D)
        out = torch.empty(Bn, Tn, H, D, dtype=torch.float64)
        for hh in range(H):
            g = hh // (H // KV)                      # query heads [g*H/KV, (g+1)*H/KV) share kv head g
            s = torch.einsum("btd,bsd->bts", q[:, :, hh], k[:, :, g]) / math.sqrt(D)
            s = s.masked_fill(~allowed, float("-inf"))
            out[:, :, hh] = torch.softmax(s, -1) @ v[:, :, g]
        x = x + lin(out.reshape(Bn, Tn, C), p + "self_attn.o_proj")
        h = rms(x, d[p + "post_attention_layernorm.weight"])
        x = x + lin(F.silu(lin(h, p + "mlp.gate_proj")) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    x = rms(x, d["model.norm.weight"])
    head = d["lm_head.weight"] if "lm_head.weight" in d else d["model.embed_tokens.weight"]
    return x @ head.T


# ---------------------------------------------------------------------------

ST_DTYPE = {torch.float32: "F32", torch.int32: "I32", torch.bfloat16: "BF16"}


def write_safetensors(path, tensors, metadata):
    """safetensors.torch.save_file's format, byte-reproducible: its Rust
    writer orders __metadata__ by a hash map's whim; here the tensors are in
    name order and the header's keys sorted."""
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": ST_DTYPE[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    back = load_file(path)                       # the real reader agrees
    assert sorted(back) == sorted(tensors)
    for name, t in tensors.items():
        assert torch.equal(back[name], t), name


def ce(model, tokens, targets):
    logits = model(tokens).logits
    return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def make_family(family, out_dir, with_final):
    spec = FAMILIES[family]
    base = spec.get("base", family)                 # the model_type
    bf16 = spec.get("weights") == "bf16"
    kw = spec["kw"]
    seed = SEED + spec["seed_offset"]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = spec["cls"](**kw)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    randomize(model, gen, kw["tie_word_embeddings"])
    model.eval()
    if bf16:                                        # the values a bf16 file holds, as fp32
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))

    d = os.path.join(out_dir, family)
    if os.path.isdir(d):
        shutil.rmtree(d)
    (copy.deepcopy(model).to(torch.bfloat16) if bf16 else model).save_pretrained(d, safe_serialization=True)
    gc = os.path.join(d, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    if spec["hub_form"]:
        with open(os.path.join(d, "config.json")) as f:
            saved = json.load(f)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(hub_config(saved, base), f, indent=2, sort_keys=True)
            f.write("\n")

    # every number below comes from the directory as transformers loads it
    m = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
    sd = load_file(os.path.join(d, "model.safetensors"))
    for name, p in model.state_dict().items():
        if name in sd:
            assert sd[name].dtype == (torch.bfloat16 if bf16 else torch.float32), name
            assert torch.equal(sd[name].to(torch.float32), p), name
    assert ("lm_head.weight" in sd) == (not kw["tie_word_embeddings"]), sorted(sd)
    window = kw.get("sliding_window") if base == "mistral" else None
    V = kw["vocab_size"]

    seq = torch.randint(0, V, (B, T + 1), generator=gen)
    tokens, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    prompt = torch.randint(0, V, (1, PROMPT_LEN), generator=gen)

    with torch.no_grad():
        assert torch.equal(model(tokens).logits, m(tokens).logits), "reloaded directory differs"
        ref = ref_forward(sd, kw, tokens, window)
    logits, loss = ce(m, tokens, targets)
    ref_diff = float((ref - logits.detach().double()).abs().max())
    assert ref_diff < 1e-4 * max(1.0, float(ref.abs().max())), (family, ref_diff)
    if kw.get("sliding_window") is not None:
        # mistral: the window changes the answer; qwen2: applying the
        # sliding_window that use_sliding_window=false turns off would too
        with torch.no_grad():
            other = ref_forward(sd, kw, tokens, None if window else kw["sliding_window"])
        assert float((other - ref).abs().max()) > 1e-2, family
    m.zero_grad()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters()}
    assert sorted(grads) == sorted(sd), (sorted(grads), sorted(sd))

    # greedy generation, checked against a full forward per step
    with torch.no_grad():
        out = m.generate(prompt, attention_mask=torch.ones_like(prompt),
                         generation_config=GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS,
                                                            eos_token_id=None, pad_token_id=0, bos_token_id=None))
        assert out.shape == (1, PROMPT_LEN + NEW_TOKENS), out.shape
        # a path that repeats one token would not see a position or cache bug
        assert len(set(out[0, PROMPT_LEN:].tolist())) >= 4, (family, out[0, PROMPT_LEN:].tolist())
        margin = float("inf")
        for i in range(PROMPT_LEN, out.shape[1]):
            last = m(out[:, :i]).logits[0, -1]
            top = torch.topk(last, 2)
            assert int(top.indices[0]) == int(out[0, i]), (family, i)
            margin = min(margin, float(top.values[0] - top.values[1]))

    # training: clip_grad_norm_ then AdamW, constant lr, the same batch
    tm = copy.deepcopy(m).train()
    decay = [p for _, p in tm.named_parameters() if p.dim() >= 2]
    nodecay = [p for _, p in tm.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPTIM["weight_decay"]},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=OPTIM["lr"], betas=OPTIM["betas"], eps=OPTIM["eps"], foreach=False)
    losses, norms = [], []
    for step in range(STEPS + 1):
        opt.zero_grad(set_to_none=True)
        _, l = ce(tm, tokens, targets)
        losses.append(l.item())
        if step == STEPS:
            break
        l.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(tm.parameters(), OPTIM["clip"], foreach=False)))
        opt.step()

    tensors = {
        "tokens": tokens.to(torch.int32), "targets": targets.to(torch.int32),
        "logits": logits.detach().float().contiguous(),
        "loss": loss.detach().float().reshape(1),
        "losses": torch.tensor(losses, dtype=torch.float32),
        "grad_norms": torch.tensor(norms, dtype=torch.float32),
        "prompt": prompt.to(torch.int32), "generated": out.to(torch.int32),
    }
    if spec.get("grads", True):
        for n, g in grads.items():
            tensors["grad/" + n] = g.contiguous()
    extra = {}
    if bf16:
        # the same directory computed in bf16 (CPU, eager): a loose reference
        # for ztrain's bf16 precision, whose roundings are not torch's
        mb = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.bfloat16).eval()
        with torch.no_grad():
            lb, lossb = ce(mb, tokens, targets)
        tensors["bf16/logits"] = lb.float().contiguous()
        tensors["bf16/loss"] = lossb.float().reshape(1)
        extra["bf16"] = json.dumps({"max_abs_diff_logits_vs_fp32": float((lb.float() - logits.detach()).abs().max()),
                                    "loss": float(lossb)})
    if with_final:
        for n, p in tm.named_parameters():
            tensors["final/" + n] = p.detach().contiguous()
    rot = m.model.rotary_emb.inv_freq
    meta = {
        "made_by": "tools/llama_fixture.py", "family": base, "weights": "bf16" if bf16 else "f32",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "seed": str(seed), "batch": json.dumps({"B": B, "T": T}),
        "optim": json.dumps({"lr": OPTIM["lr"], "betas": list(OPTIM["betas"]), "eps": OPTIM["eps"],
                             "weight_decay": OPTIM["weight_decay"], "clip": OPTIM["clip"],
                             "decay": "dim>=2", "steps": STEPS, "lr_schedule": "constant",
                             "torch": "clip_grad_norm_(params, clip, foreach=False); "
                                      "AdamW(foreach=False) with two param groups"}),
        "rope": json.dumps({"config": kw["rope_parameters"], "inv_freq": [float(x) for x in rot]}),
        "sliding_window": json.dumps(window),
        "generate": json.dumps({"prompt_len": PROMPT_LEN, "max_new_tokens": NEW_TOKENS,
                                "do_sample": False, "min_margin": margin}),
        "loss": repr(loss.item()), "losses": json.dumps(losses), "grad_norms": json.dumps(norms),
        "ref_max_abs_diff": repr(ref_diff),
    }
    meta.update(extra)
    write_safetensors(os.path.join(d, "expected.safetensors"), tensors, meta)
    nparams = sum(p.numel() for p in m.parameters())
    print("%-8s params %d  loss %.5f -> %.5f  grad norm %.3f  logit std %.3f  greedy margin %.4f  "
          "ref diff %.2e  bytes %d + %d" % (family, nparams, losses[0], losses[-1], norms[0],
                                           float(logits.detach().std()), margin, ref_diff,
                                           os.path.getsize(os.path.join(d, "model.safetensors")),
                                           os.path.getsize(os.path.join(d, "expected.safetensors"))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default="spec/fixtures/llama")
    ap.add_argument("--only", choices=sorted(FAMILIES), action="append")
    ap.add_argument("--final", action="store_true", help="also write final/NAME (the parameters after the steps)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out_dir, exist_ok=True)
    for family in args.only or ["llama", "qwen2", "mistral", "llama-bf16"]:
        make_family(family, args.out_dir, args.final)


if __name__ == "__main__":
    main()
