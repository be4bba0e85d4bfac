"""Hostile checkpoints are refused before any weight is read, by name.

Each hostile file is the tiny Llama checkpoint (``tests.tiny_models``) with its safetensors
header or its ``config.json`` rewritten: tensors sharing bytes, data past the end of the file, a
length that is not its shape's, an unknown dtype, a header length past the file, a config whose
dimensions are not the tensors' or that implies a model no host holds, and a ``--max-seq-len``
past the model's ``max_position_embeddings``. Each is refused with a message naming the file,
the tensor or option, and the rule broken; the build's own entry points (``build``, ``llmc
build``) are used where the refusal's place on the real path is what is checked.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from llmc.cli import build_parser, main
from llmc.compiler import build as build_module
from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.frontend.model_source import resolve_model
from llmc.compiler.memory import plan as memory_plan
from llmc.compiler.memory.plan import plan_memory
from llmc.compiler.weights.checkpoint_weights import index_safetensors
from llmc.errors import BuildConfigError, ModelSourceError
from tests.tiny_models import make_tiny_llama

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama (hidden 64, 2 layers, vocabulary 512, untied, max_position_embeddings
    512); read-only: each test rewrites a copy."""
    return make_tiny_llama(tmp_path_factory.mktemp("checks") / "model")


def read_safetensors(path: Path) -> tuple[dict, bytes]:
    """(header, data region) of the safetensors file ``path``."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_safetensors(path: Path, header: dict, data: bytes) -> None:
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)


def hostile(
    tiny: Path,
    dest: Path,
    header: Callable[[dict, bytes], None] | None = None,
    config: dict | None = None,
) -> Path:
    """A copy of ``tiny`` in ``dest`` with ``header(header, data)`` applied to its safetensors
    header (in place) and ``config`` merged into its config.json."""
    shutil.copytree(tiny, dest)
    if header is not None:
        h, data = read_safetensors(dest / WEIGHTS)
        header(h, data)
        write_safetensors(dest / WEIGHTS, h, data)
    if config is not None:
        path = dest / "config.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | config))
    return dest


def refused(model: Path, *fragments: str) -> str:
    """``resolve_model`` refuses ``model`` with a ModelSourceError holding every fragment."""
    with pytest.raises(ModelSourceError) as raised:
        resolve_model(str(model))
    message = str(raised.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


# --- the safetensors header -------------------------------------------------------------------


def test_overlapping_tensors_are_refused_naming_both(tiny, tmp_path):
    def share(h: dict, _: bytes) -> None:
        h["model.embed_tokens.weight"]["data_offsets"] = h["lm_head.weight"]["data_offsets"]

    model = hostile(tiny, tmp_path / "m", share)
    refused(model, str(model / WEIGHTS), "model.embed_tokens.weight", "lm_head.weight", "overlap")


def test_the_build_refuses_overlapping_tensors_before_any_output(tiny, tmp_path):
    def share(h: dict, _: bytes) -> None:
        h["model.embed_tokens.weight"]["data_offsets"] = h["lm_head.weight"]["data_offsets"]

    model = hostile(tiny, tmp_path / "m", share)
    out = tmp_path / "engine"
    with pytest.raises(ModelSourceError, match="overlap"):
        build(BuildConfig.of(model=str(model), block_size=4, max_seq_len=64, output=str(out)))
    assert not out.exists()


def test_data_past_the_end_of_the_file_is_refused(tiny, tmp_path):
    def past(h: dict, data: bytes) -> None:
        h["model.norm.weight"]["data_offsets"] = [len(data), len(data) + 256]  # [64] float32

    model = hostile(tiny, tmp_path / "m", past)
    refused(model, str(model / WEIGHTS), "model.norm.weight", "past the end")
    # The streamed build's index reads the header through the same checks.
    with pytest.raises(ModelSourceError, match=r"model\.norm\.weight.*past the end"):
        index_safetensors([model / WEIGHTS])


def test_a_gap_or_bytes_past_the_last_tensor_are_refused(tiny, tmp_path):
    # The safetensors library refuses both: a file the in-memory load cannot read never builds.
    model = hostile(tiny, tmp_path / "m")
    header, data = read_safetensors(model / WEIGHTS)
    write_safetensors(model / WEIGHTS, header, data + bytes(4))
    refused(model, str(model / WEIGHTS), "4 bytes past its last tensor")
    first = min(
        (h for n, h in header.items() if n != "__metadata__"), key=lambda h: h["data_offsets"]
    )
    first["data_offsets"] = [o + 4 for o in first["data_offsets"]]
    write_safetensors(model / WEIGHTS, header, bytes(4) + data)
    refused(model, str(model / WEIGHTS), "gap of 4 bytes at the start")


def test_a_length_that_is_not_the_shapes_is_refused(tiny, tmp_path):
    def widen(h: dict, _: bytes) -> None:
        h["model.norm.weight"]["shape"] = [65]  # 260 bytes of float32 in a 256-byte range

    model = hostile(tiny, tmp_path / "m", widen)
    refused(model, str(model / WEIGHTS), "model.norm.weight", "256 bytes", "260")


def test_an_unknown_dtype_is_refused(tiny, tmp_path):
    def q4(h: dict, _: bytes) -> None:
        h["model.norm.weight"]["dtype"] = "Q4"

    model = hostile(tiny, tmp_path / "m", q4)
    refused(model, str(model / WEIGHTS), "model.norm.weight", "dtype 'Q4'", "F32")


def test_a_header_length_past_the_file_is_refused(tiny, tmp_path):
    model = hostile(tiny, tmp_path / "m")
    raw = (model / WEIGHTS).read_bytes()
    (model / WEIGHTS).write_bytes(struct.pack("<Q", 2 * len(raw)) + raw[8:])
    refused(model, str(model / WEIGHTS), "header length", "past the end")


def test_a_truncated_header_is_refused(tiny, tmp_path):
    model = hostile(tiny, tmp_path / "m")
    raw = (model / WEIGHTS).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    (model / WEIGHTS).write_bytes(raw[: 8 + n // 2])  # cut inside the header
    refused(model, str(model / WEIGHTS), "header length", "past the end")
    (model / WEIGHTS).write_bytes(raw[:5])
    refused(model, str(model / WEIGHTS), "8-byte header length")


def test_a_header_that_is_not_json_is_refused(tiny, tmp_path):
    model = hostile(tiny, tmp_path / "m")
    raw = (model / WEIGHTS).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    (model / WEIGHTS).write_bytes(raw[:8] + b"\xff" * n + raw[8 + n :])
    refused(model, str(model / WEIGHTS), "not valid JSON")


# --- the config against the tensors -----------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        ({"intermediate_size": 256}, ["intermediate_size", "model.layers.0.mlp.gate_proj.weight"]),
        ({"num_key_value_heads": 4}, ["num_key_value_heads", "self_attn.k_proj.weight"]),
        ({"vocab_size": 1024}, ["vocab_size", "model.embed_tokens.weight"]),
        ({"num_hidden_layers": 3}, ["num_hidden_layers 3", "layers 0-1"]),
    ],
)
def test_config_dims_that_are_not_the_tensors_are_refused(tiny, tmp_path, config, fragments):
    model = hostile(tiny, tmp_path / "m", config=config)
    refused(model, str(model / "config.json"), *fragments, "does not match")


def test_a_billion_wide_config_is_refused_before_torch_allocates(tiny, tmp_path):
    model = hostile(tiny, tmp_path / "m", config={"hidden_size": 10**9})
    refused(model, str(model / "config.json"), "hidden_size 1000000000", "[512, 64]")


def test_gguf_metadata_that_is_not_the_tensors_is_refused(tmp_path):
    import gguf
    import numpy as np

    def write(path: Path, width: int, layers: int) -> Path:
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_embedding_length(width)
        w.add_block_count(layers)
        w.add_context_length(256)
        w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))  # ggml [8, 4]
        w.add_tensor("blk.0.ffn_up.weight", np.zeros((2, 8), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    good = resolve_model(str(write(tmp_path / "good.gguf", 8, 1)))
    assert good.dims.max_position_embeddings == 256
    wide = write(tmp_path / "wide.gguf", 10**9, 1)
    refused(wide, f"{wide} (GGUF metadata)", "hidden_size 1000000000", "token_embd.weight")
    deep = write(tmp_path / "deep.gguf", 8, 2)
    refused(deep, "num_hidden_layers 2", "layers 0 (blk.N.*)")


def test_the_memory_plan_refuses_a_config_no_host_holds(tiny, tmp_path):
    # Tensor names of no family the config check knows: only the memory plan sees the size.
    def rename(h: dict, _: bytes) -> None:
        for name in [n for n in h if n != "__metadata__"]:
            h["transformer." + name.removeprefix("model.")] = h.pop(name)

    model = hostile(tiny, tmp_path / "m", rename, config={"hidden_size": 10**9})
    src = resolve_model(str(model))
    with pytest.raises(BuildConfigError) as raised:
        plan_memory(src, "none", cpu=True, limit_gb=None)
    message = str(raised.value)
    for fragment in (str(model / "config.json"), "hidden_size 1000000000", "GB in float32"):
        assert fragment in message, message


def test_the_memory_plan_refuses_a_build_over_the_host_memory(tiny, monkeypatch):
    src = resolve_model(str(tiny))
    monkeypatch.setattr(memory_plan, "host_memory_bytes", lambda: 10**8)
    with pytest.raises(BuildConfigError, match=r"0\.1 GB of memory"):
        plan_memory(src, "none", cpu=True, limit_gb=None)
    # --max-build-memory is the user's figure: it wins over the host's.
    assert plan_memory(src, "none", cpu=True, limit_gb=2.0).need_bytes < 2e9


# --- --max-seq-len against max_position_embeddings -------------------------------------------


class _Reached(Exception):
    """Raised in place of the stage after the limits are fitted: the build got that far."""


def _stop_after_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    def stop(config: BuildConfig):
        raise _Reached(config)

    monkeypatch.setattr(build_module, "read_texts", stop)


def test_max_seq_len_past_max_position_embeddings_is_refused(tiny, tmp_path):
    out = tmp_path / "engine"
    with pytest.raises(BuildConfigError) as raised:
        build(BuildConfig.of(model=str(tiny), max_seq_len=4096, output=str(out)))
    message = str(raised.value)
    for fragment in ("--max-seq-len 4096", "max_position_embeddings 512", "--allow-long-max"):
        assert fragment in message, message
    assert not out.exists()


def test_max_seq_len_past_max_position_embeddings_is_built_with_the_override(tiny, monkeypatch):
    _stop_after_the_limits(monkeypatch)
    config = BuildConfig.of(model=str(tiny), max_seq_len=1024, allow_long_max_seq_len=True)
    with pytest.raises(_Reached) as reached:
        build(config)
    assert reached.value.args[0].export.max_seq_len == 1024


def test_the_default_max_seq_len_is_the_models_up_to_4096(tiny, tmp_path, monkeypatch):
    _stop_after_the_limits(monkeypatch)
    with pytest.raises(_Reached) as reached:
        build(BuildConfig.of(model=str(tiny)))
    assert reached.value.args[0].export.max_seq_len == 512
    long = make_tiny_llama(tmp_path / "long", max_position_embeddings=32768)
    with pytest.raises(_Reached) as reached:
        build(BuildConfig.of(model=str(long)))
    assert reached.value.args[0].export.max_seq_len == 4096


def test_the_cli_refuses_a_long_max_seq_len_and_offers_the_override(tiny, tmp_path, capsys):
    args = build_parser().parse_args(["build", "m", "--allow-long-max-seq-len"])
    assert args.allow_long_max_seq_len is True
    code = main(["build", str(tiny), "--max-seq-len", "4096", "-o", str(tmp_path / "e")])
    assert code == 2
    assert "max_position_embeddings 512" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["build", "-h"])
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert "--allow-long-max-seq-len accept a --max-seq-len past" in help_text
    assert "positions past the model's training length" in help_text
