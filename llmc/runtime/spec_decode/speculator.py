"""Speculative decoding in the engine loop: drafts before the step, the draft model after the
schedule (spec_decode.py has the rules, the proposers the methods).

Per step: `before_schedule` gives each running decode that may speculate its drafts (n-gram:
the tokens themselves; draft model: as many placeholders, so the scheduler allocates the slots
the draft writes), the scheduler trims them to the step's token budget, then `after_schedule`
runs the draft model over the scheduled sequences' placeholders. Speculation stays off while
more sequences run and wait than ``SpeculativeConfig.max_batch_size`` (vLLM's
``disable_by_batch_size``, with measured defaults): verifying k tokens is nearly free while a
step reads weights for few tokens, not when it is already wide.
"""

from __future__ import annotations

from pathlib import Path

from llmc.engine.files import DRAFT_DIR
from llmc.errors import EngineConfigError
from llmc.runtime.runners.engine_loader import LoadedEngine, load_engine
from llmc.runtime.runners.runner import Runner
from llmc.runtime.scheduling.scheduler_output import SchedulerOutput
from llmc.runtime.sequence import Sequence
from llmc.runtime.spec_decode.draft_proposer import DraftProposer
from llmc.runtime.spec_decode.ngram_proposer import NgramProposer
from llmc.runtime.spec_decode.rules import num_drafts_allowed
from llmc.runtime.spec_decode.speculative_config import SpeculativeConfig


class Speculator:
    """Proposes drafts for one engine.

    Args:
        config: the method and its settings.
        max_model_len: the engine's longest sequence (drafts never pass it).
        draft_runner: the draft model's runner, for ``method="draft"``.
        max_step_tokens: most tokens per draft runner call.

    Raises:
        ValueError: ``method="draft"`` without a draft runner.
    """

    def __init__(
        self,
        config: SpeculativeConfig,
        max_model_len: int,
        draft_runner: Runner | None = None,
        max_step_tokens: int = 512,
    ) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self._ngram = None
        self._draft = None
        if config.method == "ngram":
            self._ngram = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
        elif draft_runner is None:
            raise ValueError('speculative method "draft" needs a draft engine')
        else:
            self._draft = DraftProposer(draft_runner, max_step_tokens)

    def before_schedule(self, running: list[Sequence], num_waiting: int = 0) -> None:
        """Set every running sequence's ``draft_token_ids`` for the next step ([] where it may
        not speculate). Off when the running and waiting sequences together are more than
        ``max_batch_size``: waiting ones join the next steps, and a draft model that started
        would first have to catch up on every running prompt."""
        k = self.config.num_speculative_tokens
        off = len(running) + num_waiting > self.config.max_batch_size
        for seq in running:
            n = 0 if off else num_drafts_allowed(seq, k, self.max_model_len)
            if n == 0:
                seq.draft_token_ids = []
            elif self._ngram is not None:
                seq.draft_token_ids = self._ngram.propose(seq.token_ids(0, seq.num_tokens), n)
            else:
                seq.draft_token_ids = [0] * n  # placeholders: the draft model fills them

    def after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        """Run the draft model for the scheduled sequences with drafts (no-op for n-gram).

        Raises:
            What the draft runner raises.
        """
        if self._draft is None:
            return
        planned = [p for p in scheduler_output.scheduled if p.num_draft_tokens]
        if planned:
            self._draft.propose([p.seq for p in planned], [p.num_draft_tokens for p in planned])


def load_speculator(
    spec: SpeculativeConfig,
    path: str | Path,
    loaded: LoadedEngine,
    max_model_len: int,
    max_step_tokens: int,
    threads: int | None,
) -> Speculator:
    """The `Speculator` of the engine loaded from ``path``; a draft model is loaded over the
    target's KV blocks (same block ids, ``loaded.runner.num_blocks`` of them), ``threads`` as
    the target's.

    Raises:
        EngineConfigError: no draft engine recorded, or one with another block size or
            vocabulary than the target's.
        EngineCorruptError: the recorded draft's manifest no longer has its digest.
        llmc.errors.EngineError: the draft engine cannot be loaded (as ``load_engine``).
    """
    if spec.method != "draft":
        return Speculator(spec, max_model_len)
    expected = None
    if spec.model:
        draft_path = Path(spec.model)
    else:  # the engine's own draft (llmc build --draft), as its manifest recorded it
        record = loaded.manifest.draft
        if record is None:
            raise EngineConfigError(
                f"{path} has no draft engine: build it with `llmc build MODEL --draft QUANT`, "
                'or name one in the speculative config ("model": DIR)'
            )
        draft_path = Path(path) / DRAFT_DIR
        expected = record["manifest_sha256"]
    draft = load_engine(draft_path, num_blocks=loaded.runner.num_blocks, threads=threads,
                        max_model_len=max_model_len,
                        expected_manifest_sha256=expected)  # fmt: skip
    for name in ("block_size", "vocab_size"):
        mine, theirs = getattr(loaded.runner, name), getattr(draft.runner, name)
        if mine != theirs:
            raise EngineConfigError(
                f"the draft engine {draft_path} has {name} {theirs}, not {mine}: build the draft "
                "from the same checkpoint with the same --block-size"
            )
    return Speculator(spec, max_model_len, draft.runner, max_step_tokens)
