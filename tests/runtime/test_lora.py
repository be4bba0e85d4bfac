"""Multi-LoRA on a tiny Llama engine built with ``--enable-lora``: random ``peft`` adapters,
mixed in one batch, against ``PeftModel`` in torch and against each request alone; the adapter
checks; more adapters than slots; the prefix cache per adapter; the server's LoRA interface."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.runtime.engine import LLMEngine
from llmc.runtime.llm import LLM
from llmc.runtime.lora.errors import LoRAAdapterError
from llmc.runtime.lora.lora_request import LoRARequest
from llmc.runtime.sampling_params import SamplingParams
from tests.tiny_models import make_tiny_llama

MAX_LORAS, MAX_RANK = 2, 4
PROMPTS = [[5, 17, 42, 9, 33, 71, 2], [8, 8, 100, 12], [301, 7, 7, 7, 19, 44], [3, 99, 250, 18]]
GREEDY = SamplingParams(temperature=0, max_tokens=8)


def _adapter(ckpt: Path, out: Path, seed: int, r: int, targets: list[str]) -> Path:
    """A random PEFT LoRA adapter of ``ckpt`` (B not zero, scaled up so it changes tokens)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    config = LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, init_lora_weights=False)
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.mul_(3.0)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    """(checkpoint, LoRA engine, engine without LoRA, {name: adapter dir})."""
    root = tmp_path_factory.mktemp("lora")
    ckpt = make_tiny_llama(root / "ckpt", seed=1)
    options = dict(model=str(ckpt), block_size=4, max_seq_len=64)
    engine = root / "lora_engine"
    build(BuildConfig.of(**options, enable_lora=True, max_loras=MAX_LORAS, max_lora_rank=MAX_RANK,
                         output=str(engine)))  # fmt: skip
    plain = build(BuildConfig.of(**options, output=str(root / "plain"))).engine_dir
    adapters = {
        "a": _adapter(ckpt, root / "a", 1, 4, ["q_proj", "v_proj", "o_proj", "down_proj"]),
        "b": _adapter(ckpt, root / "b", 2, 2, ["k_proj", "gate_proj", "up_proj"]),
        "c": _adapter(ckpt, root / "c", 3, 3, ["q_proj", "up_proj"]),
        "rank8": _adapter(ckpt, root / "rank8", 4, 8, ["q_proj"]),
        "head": _adapter(ckpt, root / "head", 5, 2, ["lm_head"]),
    }
    return ckpt, engine, Path(plain), adapters


def _peft_greedy(ckpt: Path, adapter: Path | None, prompt: list[int]) -> list[int]:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    out = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
    return out[0, len(prompt) :].tolist()


def _tokens(llm: LLM, prompts, loras) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, lora_request=loras)
    return [o.outputs[0].token_ids for o in outs]


def _request(adapters: dict, name: str, i: int = 1) -> LoRARequest:
    return LoRARequest(name, i, str(adapters[name]))


def test_mixed_batch_equals_peft_and_each_request_alone(lora):
    ckpt, engine, _, adapters = lora
    llm = LLM(engine)
    loras = [None, _request(adapters, "a"), _request(adapters, "b", 2), _request(adapters, "a")]
    mixed = _tokens(llm, PROMPTS, loras)
    for prompt, req, got in zip(PROMPTS, loras, mixed, strict=True):
        path = None if req is None else Path(req.lora_path)
        assert got == _peft_greedy(ckpt, path, prompt), req
        assert got == _tokens(llm, [prompt], [req])[0]
    # the adapters change the output: the test would see a slot mixed up
    assert mixed[1] != _tokens(llm, [PROMPTS[1]], [None])[0]
    assert mixed[2] != _tokens(llm, [PROMPTS[2]], [None])[0]


def test_base_output_equals_the_engine_built_without_lora(lora):
    _, engine, plain, _ = lora
    assert _tokens(LLM(engine), PROMPTS, None) == _tokens(LLM(plain), PROMPTS, None)


def test_adapters_the_engine_cannot_serve_are_refused(lora, tmp_path):
    _, engine, plain, adapters = lora
    llm = LLM(engine)
    with pytest.raises(LoRAAdapterError, match=r"rank 8 .*--max-lora-rank 4"):
        llm.generate("hi", GREEDY, lora_request=_request(adapters, "rank8"))
    with pytest.raises(LoRAAdapterError, match="adapts lm_head, which the engine has no LoRA"):
        llm.generate("hi", GREEDY, lora_request=_request(adapters, "head"))
    with pytest.raises(LoRAAdapterError, match="adapter_config.json not found"):
        llm.generate("hi", GREEDY, lora_request=LoRARequest("x", 9, str(tmp_path)))
    broken = tmp_path / "broken"
    shutil.copytree(adapters["a"], broken)
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(LoRAAdapterError, match="cannot be read"):
        llm.generate("hi", GREEDY, lora_request=LoRARequest("broken", 9, str(broken)))
    with pytest.raises(LoRAAdapterError, match="no LoRA slots; rebuild it with"):
        LLM(plain).generate("hi", GREEDY, lora_request=_request(adapters, "a"))
    assert not llm.engine.has_unfinished_requests()
    assert _tokens(llm, PROMPTS[:1], None) == _tokens(LLM(plain), PROMPTS[:1], None)


def test_more_adapters_than_slots_wait_for_a_slot(lora):
    _, engine_dir, _, adapters = lora
    engine = LLMEngine.from_engine_dir(engine_dir)
    loras = [_request(adapters, n, i) for i, n in enumerate(["a", "b", "c", "a"])]
    for i, (prompt, req) in enumerate(zip(PROMPTS, loras, strict=True)):
        engine.add_request(str(i), prompt, GREEDY, lora_request=req)
    finished, waited = {}, False
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].token_ids
        stats = engine.stats()
        assert len(stats.running_lora_adapters) <= MAX_LORAS
        waited |= "c" in stats.waiting_lora_adapters
    assert waited  # c queued behind a and b rather than failing
    llm = LLM.from_engine(engine)
    alone = [_tokens(llm, [p], [r])[0] for p, r in zip(PROMPTS, loras, strict=True)]
    assert [finished[str(i)] for i in range(4)] == alone


def test_prefix_cache_keeps_adapters_apart(lora):
    _, engine_dir, _, adapters = lora
    llm = LLM(engine_dir)
    prompt = list(range(10, 30))  # five full blocks of 4
    base = _tokens(llm, [prompt], None)[0]
    hits = llm.engine.stats().prefix_cache_hits
    with_a = _tokens(llm, [prompt], [_request(adapters, "a")])[0]
    assert llm.engine.stats().prefix_cache_hits == hits  # the base model's blocks are not a's
    assert _tokens(llm, [prompt], [_request(adapters, "a")])[0] == with_a
    assert llm.engine.stats().prefix_cache_hits > hits  # a's own blocks are
    assert with_a != base


def _post(url: str, body: dict) -> tuple[int, str]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_server_serves_adapters_by_model_name(lora, running_server):
    _, engine_dir, _, adapters = lora
    engine = LLMEngine.from_engine_dir(engine_dir)
    engine.add_lora(_request(adapters, "a"))
    expected = _tokens(LLM(engine_dir), PROMPTS[:2], [_request(adapters, "a"), None])
    with running_server(engine, "tiny", allow_runtime_lora_updating=True) as live:
        models = json.loads(urllib.request.urlopen(f"{live.url}/v1/models").read())["data"]
        assert [(m["id"], m["parent"]) for m in models] == [("tiny", None), ("a", "tiny")]
        for model, prompt, tokens in zip(["a", "tiny"], PROMPTS[:2], expected, strict=True):
            status, text = _post(
                f"{live.url}/v1/completions",
                {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0,
                 "return_tokens_as_token_ids": True, "logprobs": 0},
            )  # fmt: skip
            assert status == 200, text
            body = json.loads(text)
            assert body["model"] == model
            got = [int(t.split(":")[1]) for t in body["choices"][0]["logprobs"]["tokens"]]
            assert got == tokens
        status, text = _post(f"{live.url}/v1/completions", {"model": "b", "prompt": "hi"})
        assert status == 404 and json.loads(text)["error"]["code"] == "model_not_found"
        load = f"{live.url}/v1/load_lora_adapter"
        assert _post(load, {"lora_name": "b", "lora_path": str(adapters["b"])})[0] == 200
        status, text = _post(load, {"lora_name": "r8", "lora_path": str(adapters["rank8"])})
        assert status == 400 and "--max-lora-rank" in json.loads(text)["error"]["message"]
        assert _post(load, {"lora_name": "b", "lora_path": str(adapters["b"])})[0] == 400
        status, _ = _post(f"{live.url}/v1/completions", {"model": "b", "prompt": [5, 6]})
        assert status == 200
        metrics = urllib.request.urlopen(f"{live.url}/metrics").read().decode()
        assert 'vllm:lora_requests_info{max_lora="2"' in metrics
        unload = f"{live.url}/v1/unload_lora_adapter"
        assert _post(unload, {"lora_name": "a"})[0] == 200
        assert _post(unload, {"lora_name": "a"})[0] == 404
        status, _ = _post(f"{live.url}/v1/completions", {"model": "a", "prompt": "hi"})
        assert status == 404


def test_adapters_ship_signed_with_the_engine_through_the_registry(lora, tmp_path):
    from dataclasses import replace

    from llmc.errors import EngineCorruptError, SignatureError
    from llmc.registry.local import LocalRegistry
    from llmc.registry.signing import generate_keypair, sign_entry, verify_entry
    from llmc.runtime.lora.stored import store_adapter

    _, engine_dir, _, adapters = lora
    engine = tmp_path / "engine"
    shutil.copytree(engine_dir, engine)
    store_adapter(engine, "a", adapters["a"])
    with pytest.raises(LoRAAdapterError, match="rank 8"):
        store_adapter(engine, "r8", adapters["rank8"])
    registry = LocalRegistry(tmp_path / "registry")
    public = generate_keypair(tmp_path / "key.pem")
    entry = registry.release(registry.store(engine), lambda e: sign_entry(e, tmp_path / "key.pem"))
    assert sorted(entry.lora_files) == [
        "lora/a/adapter_config.json",
        "lora/a/adapter_model.safetensors",
    ]
    verify_entry(entry, public, "the engine")
    forged = dict(entry.lora_files, **{"lora/a/adapter_model.safetensors": "0" * 64})
    with pytest.raises(SignatureError):
        verify_entry(replace(entry, lora_files=forged), public, "the engine")
    checkout = registry.checkout(entry)
    llm = LLM(checkout)  # the stored adapter is loaded under its name
    assert [r.lora_name for r in llm.engine.list_loras()] == ["a"]
    expected = _tokens(LLM(engine_dir), [PROMPTS[1]], [_request(adapters, "a")])
    served = LoRARequest("a", 1, str(checkout / "lora" / "a"))
    assert _tokens(llm, [PROMPTS[1]], [served]) == expected
    weights = checkout / "lora" / "a" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.unlink()  # a hard link to the blob: replaced, not written through
    weights.write_bytes(bytes(data))
    with pytest.raises(EngineCorruptError, match="edited after the engine was published"):
        registry.checkout(entry)
    assert registry.verify()  # the tampered checkout is reported


def test_lora_builds_refuse_a_provider_that_cannot_feed_the_slots():
    from llmc.errors import BuildConfigError

    for options in (dict(dtype="bfloat16"), dict(execution_provider="openvino")):
        config = BuildConfig.of(model="x", enable_lora=True, **options)
        with pytest.raises(BuildConfigError, match="CPU EP in float32"):
            config.validate()
    BuildConfig.of(model="x", enable_lora=True, arch="sm89").validate()  # GPU stages: bf16 slots


def test_lora_options_leave_an_engine_without_lora_as_it_was():
    """Without --enable-lora the slot options change nothing: not the build's hash (so not the
    engine's identity in the registry), not the graph (``test_base_output_equals...``)."""
    plain = BuildConfig.of(model="x").hash()
    assert BuildConfig.of(model="x", max_loras=8, max_lora_rank=64).hash() == plain
    assert BuildConfig.of(model="x", enable_lora=True).hash() != plain
