#!/bin/sh
# bench_peers.sh -- `make bench-peers`: ztrain's GPT-2 training step beside
# PyTorch's (eager and torch.compile) in one sitting: the same model, B, T,
# thread count, fp32 and bf16 (ztrain: precision = "bf16" with its bf16
# GEMMs; PyTorch: autocast to bfloat16), AdamW. Prints a markdown table that
# pastes into docs/performance.md and writes it to build/bench_peers.md.
#
#   sh tools/bench_peers.sh [models] [B] [T] [threads]
#   defaults: gpt2,gpt2-medium 4 256 (the thread count ztrain runs with)
#
# PyTorch comes from $ZTRAIN_TORCH_PYTHON, else ./.venv-torch/bin/python3
# (`make torch-venv` makes that venv from PyPI). Without a python that
# imports torch: one line saying so, exit 0 (a machine without PyTorch is
# not a failure).
cd "$(dirname "$0")/.." || exit 1
models=${1:-gpt2,gpt2-medium}
B=${2:-4}
T=${3:-256}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE     # as on a user's machine (make bench does the same)

py=${ZTRAIN_TORCH_PYTHON:-./.venv-torch/bin/python3}
if [ ! -x "$py" ] || ! "$py" -c "import torch" >/dev/null 2>&1; then
  echo "bench-peers: skipped: no PyTorch at $py (set ZTRAIN_TORCH_PYTHON to a python with torch, or run make torch-venv)"
  exit 0
fi

tmp=$(mktemp) || exit 1
trap 'rm -f "$tmp" "$tmp.z" "$tmp.t" "$tmp.lua"' EXIT
trap 'exit 130' INT TERM
echo 'print(require("ztrain").threads())' > "$tmp.lua"
threads=${4:-$(build/ztrain --script "$tmp.lua")}
case "$threads" in
  ''|*[!0-9]*) echo "bench-peers: could not read ztrain's thread count (got '$threads')" >&2; exit 1;;
esac

{
  echo "Peers in one sitting: B=$B, T=$T, $threads threads, $(date -u +%Y-%m-%d)."
  echo
  echo "| model | precision | implementation | ms/step | tok/s | GFLOP/s |"
  echo "|---|---|---|---:|---:|---:|"
} > "$tmp"
: > "$tmp.t"
status=0
for m in $(echo "$models" | tr ',' ' '); do
  # ztrain: bench.lua's markdown rows | model | B | T | precision | ms | tok/s | GFLOP/s | % | ratio |
  if build/ztrain --script tools/bench.lua model="$m" B="$B" T="$T" threads="$threads" \
       precision=fp32,bf16 > "$tmp.z" 2>&1; then
    grep "^| $m | $B | $T |" "$tmp.z" |
      awk -F'|' 'function t(s) { gsub(/^ +| +$/, "", s); return s }
                 { printf "| %s | %s | ztrain | %s | %s | %s |\n", t($2), t($5), t($6), t($7), t($8) }' >> "$tmp"
    grep "^ztrain bench:\|^OPENBLAS_CORETYPE\|^sgemm peak\|^ztrain .* GEMM:" "$tmp.z" >> "$tmp.t"
  else
    echo "bench-peers: ztrain's bench failed for $m:" >&2; cat "$tmp.z" >&2; status=1
  fi
  # PyTorch: eager and torch.compile, fp32 and bf16 autocast
  if "$py" tools/torch_gpt2_bench.py --device cpu --model "$m" --B "$B" --T "$T" --threads "$threads" \
       --precision fp32,bf16 --markdown > "$tmp.z" 2>&1; then
    grep "^torch " "$tmp.z" >> "$tmp.t"
    grep "^| " "$tmp.z" >> "$tmp"
  else
    echo "bench-peers: PyTorch's bench failed for $m:" >&2; tail -20 "$tmp.z" >&2; status=1
  fi
done
echo >> "$tmp"
awk '!seen[$0]++' "$tmp.t" | sed 's/^/    /' >> "$tmp"    # what each side ran with
cat "$tmp"
mkdir -p build && cp "$tmp" build/bench_peers.md && echo "(written to build/bench_peers.md)"
exit $status
