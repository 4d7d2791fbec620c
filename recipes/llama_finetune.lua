-- recipes/llama_finetune.lua -- fine-tune a Llama-family model (Llama 3,
-- Qwen 2.5, Mistral, SmolLM: model/llama.lua) with ZeRO stage 3 and the
-- optimizer state and parameter shards on the host, on 2 local ranks.
--
--   build/ztrain recipes/llama_finetune.lua model=hf:DIR   # a Hugging Face directory
--   build/ztrain recipes/llama_finetune.lua                 # the demo below, runs as is
--   build/ztrain generate runs/llama_finetune/hf "Q:"      # sample from the result
--
-- model=hf:DIR reads config.json (model_type llama, qwen2 or mistral), the
-- weights (model.safetensors or its shards; F32, BF16, F16) and the
-- directory's tokenizer.json, which then replaces data.tokenizer below.
-- Without it the recipe trains a random llama-tiny with a Llama 3 style
-- tokenizer (spec/fixtures/hf_tokenizer/llama3, ~1200 tokens): the whole
-- path runs on any machine. fp32 for now (bf16 GEMMs are refused for the
-- Llama family). export.hf writes the result as a directory transformers
-- and `ztrain generate` read.
local zt = require "ztrain"
return {
  launch   = { nproc = 2 },
  model    = { size = "llama-tiny", seed = 1337 },
  data     = { text = "/usr/share/games/fortunes/*", exclude = "*.dat",
               tokenizer = "hf:spec/fixtures/hf_tokenizer/llama3", seq_len = 128 },
  strategy = zt.strategy.zero { stage = 3, offload_optimizer = "host", offload_params = "host" },
  offload  = { staging = "16MiB" },
  optim    = { name = "adamw", lr = 1e-3, weight_decay = 0.1, betas = { 0.9, 0.95 }, clip = 1.0 },
  lr       = { warmup = 20, schedule = "cosine" },
  batch    = { micro = 4, accumulate = 1 },      -- global batch = ranks x 4
  sample   = { prompt = "Q:", tokens = 40, temperature = 0.8, top_k = 40 },   -- printed at each evaluation
  train    = { steps = 200, log_every = 20, eval_every = 100, eval_batches = 10 },
  export   = { hf = "runs/llama_finetune/hf" },
}
