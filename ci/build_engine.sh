#!/usr/bin/env bash
# Build one engine for one target in CI and publish it to the registry.
#
#   ci/build_engine.sh engine MODEL ARCH QUANT [llmc build flags...]
#       llmc build MODEL --arch ARCH --quant QUANT, then llmc registry push (local, then remote).
#       With LLMC_STAGE set (sm* targets), finishes that portable stage instead: llmc build --from.
#   ci/build_engine.sh stage MODEL ARCH QUANT [llmc build flags...]
#       sm* targets on a CPU runner: writes the portable stage (the Q/DQ ONNX with plugins, its
#       lint report and calibration statistics) to stages/, for a GPU job to finish.
#
# Environment (all optional):
#   LLMC_REGISTRY     local registry root (default: engines)
#   LLMC_REMOTE       remote registry, s3://BUCKET/PREFIX; AWS_* variables give credentials,
#                     AWS_ENDPOINT_URL an S3-compatible endpoint (MinIO, Ceph, ...)
#   LLMC_SIGN_KEY     Ed25519 private key (PEM) that signs the manifest (llmc registry keygen)
#   LLMC_STAGE        portable stage directory to finish (engine mode, sm* targets)
set -euo pipefail

usage() { echo "usage: $0 engine|stage MODEL ARCH QUANT [llmc build flags...]" >&2; exit 64; }
[[ $# -ge 4 ]] || usage
mode=$1 model=$2 arch=$3 quant=$4
shift 4
name="$(basename "${model%.gguf}")-${arch}-${quant}"
registry=${LLMC_REGISTRY:-engines}

case "$mode" in
  stage)
    [[ "$arch" == sm* ]] || { echo "stage mode is for sm* targets, not $arch" >&2; exit 64; }
    out="stages/${name}-stage"
    # Without TensorRT and a GPU, llmc build writes the portable stage and exits 2 naming what
    # is missing; that is this job's success, provided the stage is there.
    set +e
    llmc build "$model" --arch "$arch" --quant "$quant" -o "$out" "$@"
    status=$?
    set -e
    if [[ $status -ne 0 && ! -f "$out/stage.json" ]]; then
      exit "$status"
    fi
    echo "stage: $out"
    ;;
  engine)
    out="build/${name}"
    if [[ -n "${LLMC_STAGE:-}" ]]; then
      llmc build --from "$LLMC_STAGE" --arch "$arch" -o "$out" "$@"
    else
      llmc build "$model" --arch "$arch" --quant "$quant" -o "$out" "$@"
    fi
    push=(llmc registry push "$out" --registry "$registry")
    if [[ -n "${LLMC_SIGN_KEY:-}" ]]; then push+=(--sign-key "$LLMC_SIGN_KEY"); fi
    if [[ -n "${LLMC_REMOTE:-}" ]]; then push+=(--remote "$LLMC_REMOTE"); fi
    "${push[@]}"
    llmc registry verify --registry "$registry"
    ;;
  *) usage ;;
esac
