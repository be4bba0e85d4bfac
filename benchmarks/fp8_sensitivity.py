"""FP8 layer sensitivity: which decoder layers to leave out of FP8 for a top-1 agreement target.

    python benchmarks/fp8_sensitivity.py --data ../shared/data/tinyshakespeare.txt --target 0.95

A fake-quant study in torch, not an engine build: the checkpoint's ``nn.Linear`` layers get the
numerics of llmc's ``--quant fp8`` (FP8 E4M3 weights per output channel, GPTQ-rounded on the
Gram matrix of the calibration inputs; activations E4M3 with one static per-tensor scale, amax /
448; the vocabulary projection 8-bit block-32 weight-only, as ``--weight-only8 lm_head``), while
attention, norms and the rest stay float32. Calibration windows come from the first 80% of
``--data``, held-out windows from the last 20% (``llmc.calibration.data``), as in a build.

It prints top-1 agreement and mean KL against float32 for: every layer in FP8; each layer alone
in FP8 (its sensitivity); then every layer but the k most sensitive, k = 1, 2, ... until the
target is met, with the ``--exclude`` value that keeps those layers in high precision. Check the
chosen value with a real build (its accuracy report). Measured on Gemma 3 270M: the
simulation gave 90.6% top-1 with every layer in FP8 where the engine's report gives 91.45%.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from llmc.compiler.quantize.rounding import gptq_on_grid
from llmc.quant.grids import (
    FP8_E4M3,
    INT8,
    dequantize,
    fake_quant_activation,
    quantize_weight_blockwise,
    quantize_weight_per_channel,
)


def main() -> None:
    """Parse the options, calibrate, and print the study (module docstring); exit code 0."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--data", required=True, help=".txt or .jsonl (as --calib-data)")
    p.add_argument("--windows", type=int, default=8, help="held-out windows")
    p.add_argument("--calib-windows", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--target", type=float, default=0.95, help="top-1 agreement to reach")
    p.add_argument("--rounding", choices=("gptq", "nearest"), default="gptq")
    args = p.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmc.calibration.data import CALIBRATION, HELDOUT, load_windows
    from llmc.compiler.model_source import resolve_model

    torch.set_num_threads(2)
    src = resolve_model(args.model)
    kw = {"gguf_file": src.gguf_file} if src.gguf_file else {}
    tok = AutoTokenizer.from_pretrained(str(src.directory), **kw)
    model = AutoModelForCausalLM.from_pretrained(
        str(src.directory), dtype=torch.float32, attn_implementation="sdpa", **kw
    ).eval()
    held, _ = load_windows(HELDOUT, args.data, model, tok, args.windows, args.seq_len)
    calib, _ = load_windows(CALIBRATION, args.data, model, tok, args.calib_windows, args.seq_len)
    linears = {
        n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "layers." in n
    }

    @torch.inference_mode()
    def log_probs(window: np.ndarray) -> torch.Tensor:  # [T-1, vocab] float32
        return F.log_softmax(model(torch.from_numpy(window)[None]).logits[0, :-1].float(), -1)

    ref = [log_probs(w) for w in held]  # float32 weights everywhere
    # The head's own copy (Gemma ties it to the embedding table, which stays float32), 8-bit
    # block-32 weight-only as the build gives it.
    head = model.get_output_embeddings()
    head_w = dequantize(quantize_weight_blockwise(head.weight.data.T.numpy(), INT8, 32))
    head.weight = torch.nn.Parameter(torch.from_numpy(head_w).T.contiguous(), requires_grad=False)

    # Calibration: per-tensor amax and X^T X of every linear layer's input.
    amax: dict[str, float] = {}
    gram: dict[str, torch.Tensor] = {}

    def record(name: str):
        def hook(_mod, inputs):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1])
            amax[name] = max(amax.get(name, 0.0), float(x.abs().max()))
            gram[name] = gram.get(name, 0) + x.double().T @ x.double()

        return hook

    hooks = [m.register_forward_pre_hook(record(n)) for n, m in linears.items()]
    with torch.inference_mode():
        for w in calib:
            model(torch.from_numpy(w)[None])
    for h in hooks:
        h.remove()

    t0 = time.time()
    float_w = {n: m.weight.data.clone() for n, m in linears.items()}
    fp8_w = {}
    for n, w in float_w.items():  # nn.Linear keeps [N, K]; the build's MatMul B is [K, N]
        b = w.T.numpy()
        qw = quantize_weight_per_channel(b, FP8_E4M3)
        if args.rounding == "gptq":
            qw = gptq_on_grid(b, qw, gram[n].numpy())
        fp8_w[n] = torch.from_numpy(dequantize(qw)).T.contiguous()
    print(f"weights rounded ({args.rounding}) in {time.time() - t0:.0f} s", flush=True)

    def layer_of(name: str) -> int:
        return int(name.split("layers.")[1].split(".")[0])

    num_layers = 1 + max(layer_of(n) for n in linears)

    def fp8_input(x: torch.Tensor, name: str) -> torch.Tensor:  # per-tensor static E4M3 Q/DQ
        return torch.from_numpy(fake_quant_activation(x.numpy(), amax[name], FP8_E4M3))

    def evaluate(fp8_layers: set[int]) -> tuple[float, float]:
        """(top-1 agreement, mean KL in nats) with ``fp8_layers`` in FP8."""
        hooks = []
        for n, m in linears.items():
            on = layer_of(n) in fp8_layers
            m.weight.data = fp8_w[n] if on else float_w[n]
            if on:
                hooks.append(m.register_forward_pre_hook(lambda _m, a, n=n: (fp8_input(a[0], n),)))
        agree = kl = count = 0.0
        for w, r in zip(held, ref, strict=True):
            lp = log_probs(w)
            agree += float((lp.argmax(-1) == r.argmax(-1)).sum())
            kl += float((r.exp() * (r - lp)).sum())
            count += lp.shape[0]
        for h in hooks:
            h.remove()
        return agree / count, kl / count

    every = set(range(num_layers))
    top1, kl = evaluate(every)
    print(f"every layer in FP8           top-1 {top1:.4f}  KL {kl:.4f}", flush=True)
    alone = {}
    for layer in range(num_layers):
        alone[layer] = evaluate({layer})
        print(f"only layer {layer:2d} in FP8        top-1 {alone[layer][0]:.4f}  KL "
              f"{alone[layer][1]:.4f}", flush=True)  # fmt: skip
    order = sorted(alone, key=lambda layer: -alone[layer][1])  # most KL first
    for k in range(1, num_layers):
        kept = sorted(order[:k])
        top1, kl = evaluate(every - set(kept))
        print(f"{k:2d} layers high precision {kept}: top-1 {top1:.4f}  KL {kl:.4f}", flush=True)
        if top1 >= args.target:
            patterns = ",".join(f"model.layers.{layer}.*" for layer in kept)
            print(f"target {args.target} met with {k} of {num_layers} layers out of FP8:")
            print(f"  --exclude '{patterns}'")
            return
    print(f"target {args.target} not met with any layer in FP8")


if __name__ == "__main__":
    main()
