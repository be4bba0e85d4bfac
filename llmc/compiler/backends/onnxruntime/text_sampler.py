"""Calibration text sampled from the model through llmc's own batched runtime.

A build without ``--calib-data`` calibrates on text the model writes itself. Sampling it with
transformers' eager ``generate`` needs the whole model in memory and on 2 cores took 533 s for a
Qwen3-0.6B-shaped checkpoint; here the build's float graph, its weights rounded to 8 bits
(``sampler_engine``: a quarter of the float32 bytes in memory), runs in the runtime that serves
engines (``LLMEngine``: in-flight batching over the paged KV cache), so sampling costs what
serving those tokens costs. The sampler engine is written on the first ``sample`` and reused.

Sampling rule (as ``llmc.calibration.data.sample_texts``): pure ancestral sampling from BOS
(temperature 1, no top-k/top-p/min-p truncation), EOS masked until the text has its full length
(``min_tokens``), text ``i`` seeded with ``seed + i`` so a seed gives the same texts at any
batch size. Special tokens are dropped from the decoded texts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from llmc.calibration.data import HfTextSampler, TextSampler
from llmc.calibration.text_cache import CachedTextSampler
from llmc.compiler.backends.onnxruntime.sampler_engine import write_sampler_engine

if TYPE_CHECKING:
    from llmc.compiler.config.build_config import BuildConfig
    from llmc.compiler.stages.export import FloatGraph
    from llmc.compiler.stages.load import LoadedModel
    from llmc.compiler.stages.quantize import CalibrationTexts

#: Sequences sampled at once: the KV cache is sized for this many, not for every text.
MAX_NUM_SEQS = 16


class EngineTextSampler(TextSampler):
    """Samples from an engine graph (``onnx.ModelProto`` with plugin nodes; its weights as
    external data in ``weights_dir``, or in the proto) with ``tokenizer``, through its 8-bit
    weight-only engine written into ``work_dir``.

    Raises ValueError (from ``sample``) if the tokenizer has neither BOS nor EOS to start from.
    """

    prefix_stable = True  # text i is seeded with seed + i

    def __init__(
        self,
        graph: onnx.ModelProto,
        weights_dir: Path | None,
        tokenizer: Any,
        block_size: int,
        threads: int,
        work_dir: Path,
    ) -> None:
        self.graph = graph
        self.weights_dir = weights_dir
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.threads = threads
        self.work_dir = work_dir
        self._engine_dir: Path | None = None

    def engine_dir(self) -> Path:
        """The sampler engine's directory, written on the first call."""
        if self._engine_dir is None:
            self._engine_dir = write_sampler_engine(
                self.graph, self.weights_dir, self.work_dir, self.threads
            )
        return self._engine_dir

    def sample(self, num_texts: int, max_new_tokens: int, seed: int) -> list[str]:
        """``num_texts`` texts of ``max_new_tokens`` tokens each, decoded."""
        from llmc.runtime.engine import LLMEngine
        from llmc.runtime.engine_config import EngineConfig
        from llmc.runtime.llm import LLM
        from llmc.runtime.runners.ort_runner import OrtRunner
        from llmc.runtime.sampling_params import SamplingParams

        tok = self.tokenizer
        start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        if start is None:
            raise ValueError("the tokenizer has no BOS or EOS token to start sampling from")
        max_len = 1 + max_new_tokens
        per_seq = -(-max_len // self.block_size)
        num_seqs = min(MAX_NUM_SEQS, num_texts)
        runner = OrtRunner(self.engine_dir(), per_seq * num_seqs, threads=self.threads)
        config = EngineConfig(
            block_size=self.block_size,
            num_blocks=per_seq * num_seqs,
            max_model_len=max_len,
            max_num_seqs=num_seqs,
            max_num_batched_tokens=max(num_seqs, 256),
            max_num_forked_seqs=num_seqs,
            enable_prefix_caching=False,
        )
        eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        llm = LLM.from_engine(LLMEngine(runner, tok, config, eos))
        params = [
            SamplingParams(
                temperature=1.0,
                top_p=1.0,
                top_k=None,
                min_p=0.0,
                seed=seed + i,
                max_tokens=max_new_tokens,
                min_tokens=max_new_tokens,
            )
            for i in range(num_texts)
        ]
        outs = llm.generate([{"prompt_token_ids": [start]}] * num_texts, params)
        return [tok.decode(o.outputs[0].token_ids, skip_special_tokens=True) for o in outs]


def sampling_model(
    model: LoadedModel,
    graph: FloatGraph,
    texts: CalibrationTexts | None,
    config: BuildConfig,
):
    """What samples text where a build has no file for it: the loaded transformers model
    (``HfTextSampler``), or for a streamed build (weights on the meta device) the float graph
    run in llmc's runtime (``EngineTextSampler``), its texts kept for the build and in the
    calibration cache directory (``CachedTextSampler``). None when nothing is sampled."""
    if texts is None or (texts.calibration.path and texts.heldout.path):
        return None
    if model.streamed is None:
        inner: TextSampler = HfTextSampler(model.hf_model, model.tokenizer)
    else:
        inner = EngineTextSampler(
            graph.proto,
            graph.weights_dir,
            model.tokenizer,
            config.export.block_size,
            config.target.threads,
            work_dir=graph.weights_dir,
        )
    directory = Path(config.calibration.cache_dir).expanduser() / "texts"
    return CachedTextSampler(inner, model.resolved.checkpoint_digest, directory)
