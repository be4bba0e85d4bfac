#!/usr/bin/env bash
# llmc against llama.cpp's server and OpenVINO GenAI in one run, on one host, one system at a
# time (the peers table): 16 prompts of 128 tokens, 128 new tokens, greedy, EOS ignored,
# 1 and 16 concurrent requests.
#
#   benchmarks/peers/run_all.sh OUT_DIR ENGINE_DIR [ENGINE_DIR ...]
#
# Each llmc engine is served by `llmc serve --no-prefix-caching` and loaded by `llmc bench` (a
# warm-up, then --max-concurrency 1 and 16, each with prompts of its own: no prompt caching); then
# llama_cpp_server.sh and openvino_genai.sh; then the first engine again (the host's drift over
# the run); then table.py prints the Markdown table of OUT_DIR. Run from the repository root with llmc installed.
set -euo pipefail
OUT=${1:?usage: run_all.sh OUT_DIR ENGINE_DIR [ENGINE_DIR ...]}
shift
HERE=$(cd "$(dirname "$0")" && pwd)
PORT=${PORT:-8092}
mkdir -p "$OUT"
lscpu | grep -E "Model name|Flags" > "$OUT/host.txt"
# Serve ENGINE and load it: llmc_LABEL_c1.json and llmc_LABEL_c16.json.
serve_and_bench() {
    local engine=$1 label=$2
    llmc serve "$engine" --port "$PORT" --no-prefix-caching > "$OUT/llmc_$label.log" 2>&1 &
    local server=$!
    for _ in $(seq 300); do
        curl -sf "http://127.0.0.1:$PORT/ready" > /dev/null && break
        sleep 1
    done
    llmc bench --base-url "http://127.0.0.1:$PORT" --num-prompts 2 --input-len 128 \
        --output-len 8 --ignore-eos --tokenizer "$engine" --seed 3 > /dev/null  # warm-up
    for c in 1 16; do  # other prompts per run (--seed): no run reads another's KV
        llmc bench --base-url "http://127.0.0.1:$PORT" --num-prompts 16 --input-len 128 \
            --output-len 128 --ignore-eos --tokenizer "$engine" --max-concurrency "$c" \
            --seed "$c" --json "$OUT/llmc_${label}_c$c.json"
    done
    kill "$server"
    wait "$server" || true
}
for engine in "$@"; do
    serve_and_bench "$engine" "$(basename "$engine")"
done
bash "$HERE/llama_cpp_server.sh" "$OUT" "$1"
bash "$HERE/openvino_genai.sh" "$OUT"
# The first engine again, last: how far the host's speed drifted over the run (table.py).
serve_and_bench "$1" "$(basename "$1")_again"
python3 "$HERE/table.py" "$OUT"
