"""The offline Python API: ``LLM(engine_dir).generate(prompts, SamplingParams(...))`` (as vLLM)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count
from pathlib import Path
from typing import Any

from llmc.runtime.chat_template import encode_chat
from llmc.runtime.engine import LLMEngine
from llmc.runtime.lora.lora_request import LoRARequest
from llmc.runtime.outputs import RequestOutput
from llmc.runtime.sampling_params import SamplingParams

# A prompt is text, or pre-tokenized as {"prompt_token_ids": [...]} (vLLM's TokensPrompt).
Prompt = str | dict[str, list[int]]
# A conversation: chat messages, oldest first ({"role": "user", "content": "Hi"}).
Conversation = list[dict[str, Any]]


class LLM:
    """Generate completions for a batch of prompts with one engine.

    Args:
        engine_dir: an engine directory built by ``llmc build``.
        expected_manifest_sha256: the sha256 (hex) its ``manifest.json`` must have (e.g. the
            registry's, ``ResolvedEngine.manifest_sha256``); None: not checked.
        engine_options: the other keyword arguments of `LLMEngine.from_engine_dir`
            (``max_num_seqs``, ``max_model_len``, ``seed``, ``num_blocks`` ...), passed on as
            they are.

    Raises:
        TypeError, ValueError: as `LLMEngine.from_engine_dir`.
    """

    def __init__(
        self,
        engine_dir: str | Path,
        *,
        expected_manifest_sha256: str | None = None,
        **engine_options: Any,
    ) -> None:
        engine = LLMEngine.from_engine_dir(
            engine_dir, expected_manifest_sha256=expected_manifest_sha256, **engine_options
        )
        self._init(engine)

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        """Wrap an engine that is already built (tests, custom runners)."""
        llm = cls.__new__(cls)
        llm._init(engine)
        return llm

    def _init(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._request_ids = count()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion, batched by the engine.

        Args:
            prompts: a prompt or a list of them; text is tokenized with the engine's tokenizer
                (with its special tokens, e.g. BOS), ``{"prompt_token_ids": [...]}`` is used as is.
            sampling_params: one `SamplingParams` for all prompts, or one per prompt; None means
                ``SamplingParams()``.
            use_tqdm: show a progress bar over finished requests.
            lora_request: the LoRA adapter of every prompt (``LoRARequest``), or one per
                prompt (None: the base model), on an engine built with ``--enable-lora``.

        Returns:
            One finished `RequestOutput` per prompt, in the order of ``prompts``.

        Raises:
            ValueError: if the number of sampling params or LoRA requests differs from the
                number of prompts, or a request is invalid, its adapter included (nothing is left
                queued then).
            llmc.errors.StepFailedError: a model step failed; every request of this call is
                aborted (see `LLMEngine.step`).
        """
        if isinstance(prompts, str | dict):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        elif len(sampling_params) != len(prompts):
            raise ValueError(
                f"{len(sampling_params)} sampling params for {len(prompts)} prompts; "
                "give one for all or one per prompt"
            )

        loras = _per_prompt(lora_request, len(prompts))
        request_ids = []
        try:
            for prompt, params, lora in zip(prompts, sampling_params, loras, strict=True):
                request_id = str(next(self._request_ids))
                text, token_ids = self._tokenize(prompt)
                self.engine.add_request(request_id, token_ids, params, text, lora_request=lora)
                request_ids.append(request_id)
        except Exception:
            for request_id in request_ids:
                self.engine.abort_request(request_id)
            raise

        finished: dict[str, RequestOutput] = {}
        progress = _progress_bar(len(request_ids)) if use_tqdm else None
        try:
            while len(finished) < len(request_ids) and self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        if progress is not None:
                            progress.update(1)
        except Exception:
            for request_id in request_ids:  # the step's own were aborted by the engine
                self.engine.abort_request(request_id)
            raise
        finally:
            if progress is not None:
                progress.close()
        return [finished[request_id] for request_id in request_ids]

    def chat(
        self,
        conversations: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate the assistant's reply to each conversation (vLLM's ``LLM.chat``): its
        prompt is the model's chat template applied to the messages (`render_chat`).

        Args:
            conversations: a conversation (a list of ``{"role": ..., "content": ...}``
                messages, oldest first) or a list of them.
            sampling_params, use_tqdm: as `generate`.

        Returns:
            One finished `RequestOutput` per conversation, in order.

        Raises:
            ChatTemplateError: (a ValueError) the template refused a conversation; nothing is
                queued then.
            ValueError, StepFailedError: as `generate`.
        """
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        tokenizer = self.engine.tokenizer
        prompts = [{"prompt_token_ids": encode_chat(tokenizer, c)} for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.engine.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return None, list(prompt["prompt_token_ids"])
        raise ValueError(
            f"a prompt must be a str or a dict with 'prompt_token_ids', got {type(prompt).__name__}"
        )


def _progress_bar(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="Processed prompts", unit="req")


def _per_prompt(lora_request, num_prompts: int) -> list:
    """One LoRA request (or None) per prompt; ValueError for a list of another length."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    if len(lora_request) != num_prompts:
        raise ValueError(
            f"{len(lora_request)} LoRA requests for {num_prompts} prompts; give one for all or "
            "one per prompt"
        )
    return list(lora_request)
