"""The tokenizer files an engine ships: ``tokenizer/`` and ``generation_config.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmc.compiler.frontend.model_source import ModelSource, extra_eos_token_ids, sha256_files


def generation_config(src: ModelSource, hf_model: Any, tokenizer: Any) -> dict[str, Any]:
    """The model's generation config as a dict, its ``eos_token_id`` every end-of-sequence id
    (sorted ints) the model, its tokenizer and the alias (``extra_eos_token_ids``) name."""
    gen = hf_model.generation_config.to_dict() if hf_model.generation_config is not None else {}
    eos = gen.get("eos_token_id", hf_model.config.eos_token_id)
    eos = [*(eos if isinstance(eos, list) else [eos]), tokenizer.eos_token_id]
    eos += extra_eos_token_ids(src, tokenizer)
    gen["eos_token_id"] = sorted({int(e) for e in eos if e is not None})
    return gen


def write_tokenizer_files(tokenizer: Any, generation: dict[str, Any], engine_dir: Path) -> str:
    """Save ``tokenizer`` (``engine_dir/tokenizer/``) and ``generation``
    (``generation_config.json``); returns the tokenizer files' sha256 (hex, in name order)."""
    tokenizer.save_pretrained(engine_dir / "tokenizer")
    (engine_dir / "generation_config.json").write_text(
        json.dumps(generation, indent=1, default=str)
    )
    return sha256_files(sorted((engine_dir / "tokenizer").iterdir()))
