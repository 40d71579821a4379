#!/usr/bin/env bash
# Runs llama.cpp's server test suite against a server binary, offline (see setup.sh).
# usage: run.sh kvserve|llama-server all|listed [pytest args...]
#   all     the suite's default selection (-m "not slow", as its tests.sh); listed: the tests in
#           scripts/upstream/baseline.txt. UPSTREAM_WORKERS (3) pytest-xdist workers run in parallel.
#   prints "N of M ... tests pass" and leaves the passing ids in DIR/passed-<server>-<which>[-TAG].txt
#   (UPSTREAM_TAG names a partial run, e.g. one file)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WHO=${1:?kvserve or llama-server}; WHICH=${2:?all or listed}; shift 2
D=$("$ROOT/scripts/upstream/setup.sh" "${UPSTREAM_DIR:-$ROOT/build/upstream}")
case "$WHO" in
  kvserve) BIN="$D/kvserve-server" ;;
  llama-server) BIN=${LLAMA_SERVER:-$("$ROOT/scripts/upstream/build-llama-server.sh" "$D")} ;;
  *) echo "unknown server $WHO" >&2; exit 2 ;;
esac
TESTS="$D/llama.cpp/tools/server/tests"
ARGS=(-m "not slow")
if [[ "$WHICH" == listed ]]; then
  grep -v '^#' "$ROOT/scripts/upstream/baseline.txt" | grep . > "$D/listed.args"
  ARGS=("@$D/listed.args")
fi
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TAG="$WHO-$WHICH${UPSTREAM_TAG:+-$UPSTREAM_TAG}"
OUT="$D/out-$TAG.txt"
cd "$TESTS"
set +e
# servers run side by side on few cores: OpenMP workers sleep between kernels instead of spinning
env OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}" LLAMA_SERVER_BIN_PATH="$BIN" PORT="$PORT" UPSTREAM_MODEL_DEFAULT="$D/models/smollm2.gguf" \
  UPSTREAM_MODEL_GEMMA3="$D/models/gemma-3-270m-q4_k_m.gguf" PYTHONPATH="$TESTS:$ROOT/scripts/upstream" \
  nice "$D/venv/bin/python" -m pytest -p kvserve_models -p no:cacheprovider -v -rA \
  --timeout "${UPSTREAM_TIMEOUT:-150}" -n "${UPSTREAM_WORKERS:-3}" "${ARGS[@]}" "$@" > "$OUT" 2>&1
set -e
# per-test result lines of -v under pytest-xdist: "[gwN] [ n%] STATUS nodeid"
results() { sed -nE 's/^\[gw[0-9]+\] \[ *[0-9]+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.*[^ ]) *$/\1 \2/p' "$OUT" | sort -u; }
results | sed -n 's/^PASSED //p' > "$D/passed-$TAG.txt"
N=$(wc -l < "$D/passed-$TAG.txt")
if [[ "$WHICH" == listed ]]; then M=$(wc -l < "$D/listed.args"); else M=$(results | cut -d' ' -f2- | sort -u | wc -l); fi
tail -n 1 "$OUT"
echo "$N of $M $WHICH tests pass against $WHO (log: $OUT)"
