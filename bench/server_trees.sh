#!/bin/bash
# The server rows of bench/gpu_matrix.sh (64 streams; the 64-request burst over a fresh ~2,000-token
# prefix, then again cached) for several trees in one run, one server per tree: started, warmed up
# with other prompts (32 streams and another prefix: nothing measured is cached), then both
# workloads against it (bench/throughput.py --url). A server start costs a model load and a graph
# capture; one per tree instead of one per workload and tree fits a short device run.
#   TREES="base=old/src now=src now:KVSERVE_X=0=src" OUT=/tmp/out bash bench/server_trees.sh
# A tree is NAME=SRC (its kvserve on PYTHONPATH first, then $LIBS), NAME:VAR=VALUE=SRC sets VAR in
# its server's environment (NAME:VAR=VALUE,VAR2=VALUE2=SRC several, values without commas); a name
# ending in "-bursts" runs only the bursts. SHAPE is the
# random-weight model (default the 1B shape), QTYPE its weights' type (default F16), STREAMS_N the
# tokens per stream (default 256).
# Output: $OUT/streams-NAME.log, $OUT/burst-NAME.log, $OUT/server-NAME.log.
set -u
OUT=${OUT:-/tmp/kvserve-trees}; mkdir -p "$OUT"
PY=${PY:-python3}
SHAPE=${SHAPE:-llama:n_layer=16,n_embd=2048,n_head=32,n_head_kv=8,head_dim=64,n_ff=8192,n_vocab=49152,tied=False}
LIBS=${LIBS:-}
export PYTHONUNBUFFERED=1
S=$SECONDS
FIRST_SRC=${TREES%% *}; FIRST_SRC=${FIRST_SRC##*=}
M=$(PYTHONPATH="$FIRST_SRC${LIBS:+:$LIBS}" $PY -c "import sys; sys.path.insert(0,'bench')
from engine import synth_path; print(synth_path('$SHAPE','${QTYPE:-F16}','${SYNTH:-/tmp/kvserve-synth}'))")
echo "model $M (t+$((SECONDS - S))s)"
for TREE in $TREES; do
  SRC=${TREE##*=}; HEAD=${TREE%=*}; NAME=${HEAD%%:*}; SET=; [[ "$HEAD" == *:* ]] && SET=${HEAD#*:}
  PORT=$($PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
  U=http://127.0.0.1:$PORT
  (export PYTHONPATH="$SRC${LIBS:+:$LIBS}"; IFS=, read -ra VARS <<< "$SET"; for V in "${VARS[@]}"; do export "$V"; done
   exec $PY -m kvserve -m "$M" -c 262144 -np 64 --metrics --port "$PORT") > "$OUT/server-$NAME.log" 2>&1 &
  P=$!
  $PY -c "import time, urllib.request as u
for _ in range(480):
    try:
        u.urlopen('$U/health', timeout=2); break
    except Exception:
        time.sleep(0.5)"
  echo "=== $NAME ($SRC${SET:+, $SET}) ready (t+$((SECONDS - S))s)"
  $PY bench/throughput.py --url "$U" --name "warm-up $NAME" --concurrency 32 --workloads distinct,shared --n-predict 8 \
      --prompt-words 38 --prefix-words 580 --rounds 1 --burst 2>&1 | grep "c=32"
  if [[ "$NAME" != *-bursts ]]; then
    $PY bench/throughput.py --url "$U" --name "$NAME" --concurrency 64 --workloads distinct --n-predict "${STREAMS_N:-256}" \
        --prompt-words 38 --rounds 1 > "$OUT/streams-$NAME.log" 2>&1
    grep "c=64" "$OUT/streams-$NAME.log"
  fi
  $PY bench/throughput.py --url "$U" --name "$NAME" --concurrency 64 --workloads shared --n-predict 64 --prefix-words 600 \
      --prompt-words 10 --rounds 2 --burst > "$OUT/burst-$NAME.log" 2>&1
  grep -E "^\| $NAME +\| shared +\| 64 +\| [12] " "$OUT/burst-$NAME.log"
  kill "$P"; wait "$P" 2> /dev/null
done
echo "done (t+$((SECONDS - S))s)"
