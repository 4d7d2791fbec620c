#!/opt/hfvenv/bin/python
"""Make the tiny Hugging Face GPT-2 fixture that ztrain's spec/e2e/hf_spec.lua reads.

Writes spec/fixtures/hf/:

  tiny/         GPT2LMHeadModel.save_pretrained (config.json, model.safetensors
                with "transformer."-prefixed F32 tensors, generation_config.json)
                plus expected.json and logits.f32 (what ztrain must reproduce)
  tiny-f16/     the same model as F16 tensors, keys WITHOUT the "transformer."
                prefix (as openai-community/gpt2's file), with the attn.bias
                causal-mask buffers saved as BOOL (a dtype ztrain does not
                read, on tensors it must ignore)
  tiny-bf16/    the same model as BF16 tensors, "transformer." prefix

expected.json holds:
  input_ids [B][T], targets [B][T], loss (mean cross-entropy, fp32), the
  logits' file (logits.f32: B*T*V float32 little-endian, row-major [B,T,V]),
  their SHA-256 and max |logit|;
  generate: a prompt of ids and transformers' greedy generate output
  (do_sample=False, max_new_tokens=20, no end-of-text stop), and the smallest
  gap between the best and second-best logit along the greedy path (how far
  fp32 noise is from flipping a token);
  param_digest: for each copy (f32, f16, bf16), the SHA-256 of every
  parameter as fp32 little-endian in ztrain's canonical unit/tensor order
  (wte, wpe, per block ln_1.w/b, c_attn.w/b, attn c_proj.w/b, ln_2.w/b,
  c_fc.w/b, mlp c_proj.w/b, then ln_f.w/b) with HF's Conv1D weights
  transposed to ztrain's [out, in] -- what ztrain's param_digest must be
  after loading that copy. The F16/BF16 values are torch's own conversions.

Requirements: Debian's python3-torch (1.13) and, in a venv with the system
site packages, transformers (< 4.41, for torch 1.13) and safetensors:

    apt-get install -y python3-torch python3-venv
    /usr/bin/python3 -m venv --system-site-packages /opt/hfvenv
    /opt/hfvenv/bin/pip install "transformers<4.41" safetensors
    /opt/hfvenv/bin/python tools/make_hf_fixture.py [--out-dir spec/fixtures/hf]

CPU, float32, one thread, fixed seed: the output is reproducible on the same
torch build.
"""

import argparse
import hashlib
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

SEED = 20240520
CFG = dict(n_layer=2, n_embd=64, n_head=4, n_positions=128,
           vocab_size=381,          # not a multiple of 16: ztrain pads its flat buffers
           activation_function="gelu_new", layer_norm_epsilon=1e-5,
           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
           bos_token_id=380, eos_token_id=380)
B, T = 2, 16
PROMPT_LEN, NEW_TOKENS = 8, 20
# position embeddings that matter: greedy text varies along the path
# (with 0.1 it settles into one repeated id, which a position bug would not change)
WPE_STD = 0.5
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
BLOCK = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
         "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
         "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")


def randomize(model, gen):
    """Every parameter random and O(1)-scaled logits: HF's own init leaves
    biases 0 and LayerNorms at 1/0 (a mapping error there would go unseen)
    and gives near-uniform logits (greedy generation would be all ties)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            elif name.endswith("c_proj.weight"):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            elif name.endswith("wpe.weight"):
                p.copy_(WPE_STD * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def canonical(sd, prefix):
    """ztrain's canonical (name, fp32 tensor in ztrain's layout) list."""
    out = [("wte", sd[prefix + "wte.weight"]), ("wpe", sd[prefix + "wpe.weight"])]
    for l in range(CFG["n_layer"]):
        for t in BLOCK:
            v = sd["%sh.%d.%s" % (prefix, l, t)]
            if t in CONV1D:
                v = v.t()                      # HF Conv1D [in, out] -> ztrain [out, in]
            out.append(("h.%d.%s" % (l, t), v))
    out += [("ln_f.weight", sd[prefix + "ln_f.weight"]), ("ln_f.bias", sd[prefix + "ln_f.bias"])]
    return out


def digest(sd, prefix):
    h = hashlib.sha256()
    for _, v in canonical(sd, prefix):
        h.update(v.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes())
    return h.hexdigest()


def copy_dir(src, dst):
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    for f in ("config.json", "generation_config.json"):
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default="spec/fixtures/hf")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)

    model = GPT2LMHeadModel(GPT2Config(**CFG)).eval()
    randomize(model, gen)
    tiny = os.path.join(args.out_dir, "tiny")
    if os.path.isdir(tiny):
        shutil.rmtree(tiny)
    model.save_pretrained(tiny, safe_serialization=True)
    V = CFG["vocab_size"]

    # logits and loss on a random batch
    seq = torch.randint(0, V, (B, T + 1), generator=gen)
    ids, targets = seq[:, :-1], seq[:, 1:]
    with torch.no_grad():
        logits = model(ids).logits.to(torch.float32)          # [B, T, V]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    raw = logits.contiguous().numpy().astype("<f4").tobytes()
    with open(os.path.join(tiny, "logits.f32"), "wb") as f:
        f.write(raw)

    # greedy generation, no stop at end-of-text (every run yields 20 tokens)
    prompt = torch.randint(0, V, (1, PROMPT_LEN), generator=gen)
    with torch.no_grad():
        out = model.generate(prompt, do_sample=False, max_new_tokens=NEW_TOKENS,
                             eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(prompt))
        # how close the greedy path came to a tie (full forward per step, fp32)
        margin = float("inf")
        for i in range(PROMPT_LEN, out.shape[1]):
            last = model(out[:, :i]).logits[0, -1]
            top = torch.topk(last, 2).values
            margin = min(margin, float(top[0] - top[1]))
    new_ids = out[0, PROMPT_LEN:].tolist()
    assert len(new_ids) == NEW_TOKENS, new_ids

    # the F16 and BF16 copies (torch's conversions), and their digests
    sd = load_file(os.path.join(tiny, "model.safetensors"))
    digests = {"f32": digest(sd, "transformer.")}
    half = {k[len("transformer."):]: v.to(torch.float16).contiguous() for k, v in sd.items()}
    mask = torch.tril(torch.ones(CFG["n_positions"], CFG["n_positions"], dtype=torch.bool))
    for l in range(CFG["n_layer"]):
        half["h.%d.attn.bias" % l] = mask.view(1, 1, CFG["n_positions"], CFG["n_positions"]).clone()
    d16 = os.path.join(args.out_dir, "tiny-f16")
    copy_dir(tiny, d16)
    save_file(half, os.path.join(d16, "model.safetensors"), metadata={"format": "pt"})
    digests["f16"] = digest(half, "")
    bf = {k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}
    dbf = os.path.join(args.out_dir, "tiny-bf16")
    copy_dir(tiny, dbf)
    save_file(bf, os.path.join(dbf, "model.safetensors"), metadata={"format": "pt"})
    digests["bf16"] = digest(bf, "transformer.")

    expected = {
        "made_by": "tools/make_hf_fixture.py",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "config": {"L": CFG["n_layer"], "C": CFG["n_embd"], "NH": CFG["n_head"],
                   "maxT": CFG["n_positions"], "V": V},
        "params": sum(p.numel() for p in model.parameters()),
        "input_ids": ids.tolist(),
        "targets": targets.tolist(),
        "loss": float(loss),
        "logits": {"file": "logits.f32", "dtype": "float32 little-endian", "shape": [B, T, V],
                   "sha256": hashlib.sha256(raw).hexdigest(),
                   "max_abs": float(logits.abs().max()), "std": float(logits.std())},
        "generate": {"prompt": prompt[0].tolist(), "max_new_tokens": NEW_TOKENS,
                     "do_sample": False, "new_ids": new_ids, "min_margin": margin},
        "param_digest": digests,
    }
    with open(os.path.join(tiny, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    print("wrote %s (params %d, loss %.6f, max |logit| %.3f, greedy min margin %.4f)"
          % (args.out_dir, expected["params"], expected["loss"], expected["logits"]["max_abs"], margin))


if __name__ == "__main__":
    main()
