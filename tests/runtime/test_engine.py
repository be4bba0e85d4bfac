"""LLMEngine and LLM end to end: a paged fake model, then the torch reference runner vs HF."""

from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from llmc.errors import StepFailedError
from llmc.runtime.chat_template import ChatTemplateError
from llmc.runtime.engine import LLMEngine
from llmc.runtime.engine_config import EngineConfig
from llmc.runtime.errors import InvalidRequestError
from llmc.runtime.llm import LLM
from llmc.runtime.runners.step_inputs import StepInputs
from llmc.runtime.sampling_params import SamplingParams
from tests.tiny_models import make_tiny_llama

VOCAB = 512
EOS = 1
GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    """The tiny Llama with q and k projections scaled up: at init scale its attention is nearly
    uniform, and greedy tokens would not notice wrong positions or a wrong context."""
    from safetensors.torch import load_file, save_file

    path = make_tiny_llama(tmp_path_factory.mktemp("llama"))
    weights_file = path / "model.safetensors"
    weights = load_file(weights_file)
    for name, w in weights.items():
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            w.mul_(12.0)
    save_file(weights, weights_file, metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def tokenizer(llama_dir):
    return AutoTokenizer.from_pretrained(llama_dir)


def next_token(context: np.ndarray) -> int:
    """The fake model: a hash of the whole context, never a special token (ids 0-6)."""
    weights = np.arange(1, len(context) + 1, dtype=np.int64)
    return int((context * weights).sum() * 2654435761 % (VOCAB - 7)) + 7


class PagedFakeRunner:
    """A runner whose "KV cache" stores token ids at their slots; each sampled row reads its whole
    context back through its block table, so any paging error changes the tokens."""

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size, self.vocab_size = num_blocks, block_size, VOCAB
        self.cache = np.full(num_blocks * block_size, -1, np.int64)
        self.num_steps = 0

    def execute(self, step: StepInputs) -> np.ndarray:
        self.num_steps += 1
        self.cache[step.slot_mapping] = step.input_ids
        logits = np.zeros((len(step.logits_indices), VOCAB), np.float32)
        for row, t in enumerate(step.logits_indices):
            b = int(np.searchsorted(step.query_start_loc, t, side="right")) - 1
            pos = np.arange(step.seq_lens[b])
            slots = step.block_tables[b, pos // self.block_size] * self.block_size
            context = self.cache[slots + pos % self.block_size]
            assert (context >= 0).all()
            logits[row, next_token(context)] = 1.0
        return logits


def oracle(prompt: list[int], num_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(num_tokens):
        tokens.append(next_token(np.array(tokens)))
    return tokens[len(prompt) :]


def fake_engine(tokenizer, num_blocks=64, block_size=4, **kw) -> LLMEngine:
    cfg = EngineConfig(block_size=block_size, num_blocks=num_blocks, max_model_len=64, **kw)
    return LLMEngine(PagedFakeRunner(num_blocks, block_size), tokenizer, cfg, {EOS})


def prompt_of(i: int) -> list[int]:
    rng = np.random.default_rng(i)
    return [int(t) for t in rng.integers(7, VOCAB, size=int(rng.integers(1, 30)))]


def run(engine: LLMEngine, arrivals: dict[int, list[tuple[str, list[int], SamplingParams]]]):
    """Step the engine, adding requests at the given steps; returns the final outputs."""
    finished, step = {}, 0
    while step <= max(arrivals) or engine.has_unfinished_requests():
        for request_id, prompt, params in arrivals.get(step, []):
            engine.add_request(request_id, prompt, params)
        for out in engine.step():
            assert out.request_id not in finished
            if out.finished:
                finished[out.request_id] = out
        step += 1
    return finished


def spy_on_schedule(engine: LLMEngine) -> dict[str, int]:
    """Count preemptions and prompt chunks (scheduled tokens that do not sample)."""
    counts = {"preempted": 0, "chunks": 0}
    schedule = engine.scheduler.schedule

    def spy():
        out = schedule()
        counts["preempted"] += len(out.preempted_request_ids)
        counts["chunks"] += sum(not s.samples for s in out.scheduled)
        return out

    engine.scheduler.schedule = spy
    return counts


def test_staggered_requests_with_chunks_and_preemption_match_the_oracle(tokenizer):
    # 16 blocks of 4 tokens for up to 4 requests of up to 45 tokens, and a budget of 12 tokens.
    engine = fake_engine(tokenizer, num_blocks=16, max_num_seqs=4, max_num_batched_tokens=12)
    counts = spy_on_schedule(engine)
    requests = {
        i: [(str(i), prompt_of(i), SamplingParams(max_tokens=5 + i, **GREEDY))] for i in range(12)
    }
    finished = run(engine, requests)
    assert sorted(finished, key=int) == [str(i) for i in range(12)]
    for i in range(12):
        out = finished[str(i)].outputs[0]
        assert out.token_ids == oracle(prompt_of(i), 5 + i)
        assert out.finish_reason == "length"
        assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert counts["preempted"] > 0 and counts["chunks"] > 0
    assert engine.scheduler.block_pool.num_free_blocks == 16


def test_outputs_come_only_for_requests_that_sampled(tokenizer):
    engine = fake_engine(tokenizer, max_num_batched_tokens=8)
    engine.add_request("long", prompt_of(0)[:1] * 20, SamplingParams(max_tokens=2, **GREEDY))
    engine.add_request("short", [9, 10], SamplingParams(max_tokens=3, **GREEDY))
    assert engine.step() == []  # 8 of the 20 prompt tokens
    assert engine.step() == []  # 16 of 20
    outs = engine.step()  # last 4 tokens of "long" and all of "short"
    assert [(o.request_id, len(o.outputs[0].token_ids), o.finished) for o in outs] == [
        ("long", 1, False),
        ("short", 1, False),
    ]
    assert outs[1].prompt_token_ids == [9, 10]


def test_stop_token_id_and_stop_string(tokenizer):
    prompt = prompt_of(3)
    tokens = oracle(prompt, 12)
    engine = fake_engine(tokenizer)
    params = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[tokens[4]])
    engine.add_request("a", prompt, params)
    out = run(engine, {0: []})["a"].outputs[0]
    assert out.token_ids == tokens[:5] and out.finish_reason == "stop"

    full = tokenizer.decode(tokens)
    stop = full[10:13]
    cut = full.index(stop)
    engine.add_request("b", prompt, SamplingParams(max_tokens=12, stop=stop, **GREEDY))
    out = run(engine, {0: []})["b"].outputs[0]
    assert out.text == full[:cut]
    assert out.finish_reason == "stop"
    assert tokens[: len(out.token_ids)] == out.token_ids
    assert len(out.token_ids) < 12
    assert not engine.has_unfinished_requests()


def test_eos_stops_unless_ignored(tokenizer):
    engine = fake_engine(tokenizer)
    # The fake model never emits EOS: make it do so by stopping on the first oracle token.
    prompt = prompt_of(5)
    first = oracle(prompt, 1)[0]
    engine.scheduler.stop_checker.eos_token_ids = frozenset({first})
    engine.add_request("stops", prompt, SamplingParams(max_tokens=4, temperature=0.0))
    engine.add_request("ignores", prompt, SamplingParams(max_tokens=4, **GREEDY))
    finished = run(engine, {0: []})
    assert finished["stops"].outputs[0].token_ids == [first]
    assert finished["stops"].outputs[0].finish_reason == "stop"
    assert finished["ignores"].outputs[0].token_ids == oracle(prompt, 4)


def test_abort_frees_everything(tokenizer):
    engine = fake_engine(tokenizer)
    engine.add_request("a", prompt_of(1), SamplingParams(max_tokens=20))
    engine.add_request("b", prompt_of(2), SamplingParams(max_tokens=20))
    engine.step()
    engine.abort_request("a")
    engine.abort_request("b")
    assert not engine.has_unfinished_requests()
    assert engine.step() == []
    assert engine.scheduler.block_pool.num_free_blocks == 64
    engine.add_request("a", prompt_of(1), SamplingParams(max_tokens=1))  # the id is free again


def test_add_request_validation(tokenizer):
    engine = fake_engine(tokenizer)
    engine.add_request("x", [5], SamplingParams())
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("x", [5], SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("y", [], SamplingParams())
    with pytest.raises(ValueError, match=r"token id 512 is outside the vocabulary \[0, 512\)"):
        engine.add_request("y", [5, 512], SamplingParams())
    with pytest.raises(ValueError, match="token id -1"):
        engine.add_request("y", [-1], SamplingParams())
    with pytest.raises(
        ValueError, match="is 65 tokens, more than this engine's max_model_len of 64"
    ):
        engine.add_request("y", [5] * 60, SamplingParams(max_tokens=5))
    with pytest.raises(ValueError, match="n must be an integer >= 1, got 0"):
        engine.add_request("y", [5], SamplingParams(n=0))
    refusals = [  # (prompt, params, the field the error names)
        ([], SamplingParams(), "prompt"),
        ([5, 512], SamplingParams(), "prompt"),
        ([5], SamplingParams(stop_token_ids=[3, 512]), "stop_token_ids"),
        ([5], SamplingParams(top_p=0.0), "top_p"),
        ([5], SamplingParams(min_tokens=9, max_tokens=2), "min_tokens"),
    ]
    for prompt, params, field in refusals:
        with pytest.raises(InvalidRequestError) as refused:
            engine.add_request("y", prompt, params)
        assert refused.value.field == field and field in str(refused.value)
    with pytest.raises(ValueError, match="block_size 8 differs"):
        cfg = EngineConfig(block_size=8, num_blocks=8, max_model_len=8)
        LLMEngine(PagedFakeRunner(8, 4), tokenizer, cfg, set())
    with pytest.raises(ValueError, match="exceeds the runner's KV cache of 8 blocks"):
        cfg = EngineConfig(block_size=4, num_blocks=9, max_model_len=8)
        LLMEngine(PagedFakeRunner(8, 4), tokenizer, cfg, set())
    assert list(engine.scheduler.requests) == ["x"]


def test_llm_chat_prompts_are_the_chat_template_encoded_without_special_tokens(tokenizer):
    llm = LLM.from_engine(fake_engine(tokenizer))
    conversation = [{"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    expected = tokenizer.encode(text, add_special_tokens=False)
    params = SamplingParams(max_tokens=2, **GREEDY)
    one, two = llm.chat([conversation, conversation + conversation], params)
    assert one.prompt_token_ids == expected
    assert len(two.prompt_token_ids) > len(expected)
    assert [o.prompt_token_ids for o in llm.chat(conversation, params)] == [expected]
    template, tokenizer.chat_template = tokenizer.chat_template, "{{ raise_exception('no') }}"
    try:
        with pytest.raises(ChatTemplateError, match="Cannot apply the chat template: no"):
            llm.chat(conversation, params)
    finally:
        tokenizer.chat_template = template
    assert not llm.engine.has_unfinished_requests()


def test_llm_generate_keeps_input_order_and_accepts_token_prompts(tokenizer):
    llm = LLM.from_engine(fake_engine(tokenizer, max_num_seqs=2))
    params = [SamplingParams(max_tokens=m, **GREEDY) for m in (7, 2, 4)]
    prompts = ["To be, or not", {"prompt_token_ids": prompt_of(9)}, "héllo wörld ✓ 日本"]
    outs = llm.generate(prompts, params)
    assert [o.prompt for o in outs] == [prompts[0], None, prompts[2]]
    assert [len(o.outputs[0].token_ids) for o in outs] == [7, 2, 4]
    assert outs[0].prompt_token_ids == tokenizer.encode(prompts[0])
    assert outs[1].outputs[0].token_ids == oracle(prompt_of(9), 2)
    assert all(o.finished for o in outs)

    single = llm.generate("To be, or not", SamplingParams(max_tokens=7, **GREEDY))
    assert single[0].outputs[0].token_ids == outs[0].outputs[0].token_ids

    with pytest.raises(ValueError, match="2 sampling params for 3 prompts"):
        llm.generate(prompts, params[:2])
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate(["ok", {"prompt_token_ids": [5] * 70}])
    assert not llm.engine.has_unfinished_requests()  # the valid first prompt was withdrawn


def test_llm_generate_aborts_all_its_requests_when_a_step_fails(tokenizer):
    engine = fake_engine(tokenizer, max_num_seqs=1)  # "1" waits while "0" runs
    execute = engine.runner.execute
    calls = []

    def fail_third_step(step: StepInputs) -> np.ndarray:
        calls.append(step)
        if len(calls) == 3:
            raise RuntimeError("injected runner failure")
        return execute(step)

    engine.runner.execute = fail_third_step
    llm = LLM.from_engine(engine)
    prompts = [{"prompt_token_ids": prompt_of(1)}, {"prompt_token_ids": prompt_of(2)}]
    params = SamplingParams(max_tokens=5, **GREEDY)
    with pytest.raises(StepFailedError, match="injected runner failure") as failure:
        llm.generate(prompts, params)
    assert failure.value.request_ids == ("0",)  # the step's; "1" was waiting
    assert isinstance(failure.value.__cause__, RuntimeError)
    assert not engine.has_unfinished_requests() and engine.stats().num_free_blocks == 64
    out = llm.generate(prompts, params)  # the engine keeps serving
    assert [o.outputs[0].token_ids for o in out] == [oracle(prompt_of(i), 5) for i in (1, 2)]


def test_from_engine_dir_defaults_and_overrides(llama_dir, tmp_path):
    """A real built engine: its build limits are the defaults, overrides win, bad ones fail."""
    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig

    out = tmp_path / "engine"
    build(
        BuildConfig.of(
            model=str(llama_dir), block_size=4, max_seq_len=48, max_batch=5,
            max_num_tokens=64, output=str(out),
        )
    )  # fmt: skip
    engine = LLMEngine.from_engine_dir(out, num_blocks=30)
    cfg = engine.config
    assert (cfg.block_size, cfg.num_blocks, cfg.max_model_len) == (4, 30, 48)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (5, 64)
    assert engine.scheduler.config.max_decode_wait_steps == 8  # a cpu engine: prefill first
    engine = LLMEngine.from_engine_dir(out, num_blocks=20, max_model_len=40, max_num_seqs=3)
    assert (engine.config.num_blocks, engine.max_model_len, engine.config.max_num_seqs) == (
        20,
        40,
        3,
    )
    with pytest.raises(ValueError, match="max_model_len 49 exceeds the engine's max_seq_len 48"):
        LLMEngine.from_engine_dir(out, max_model_len=49)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_num_seq'"):
        LLMEngine.from_engine_dir(out, max_num_seq=3)
    llm = LLM(out, seed=3, num_blocks=20)
    assert llm.engine.config.seed == 3


# ---- the torch reference runner: greedy tokens equal HF generate ----------------------------

TORCH_PROMPTS = [prompt_of(20), prompt_of(21)[:5], prompt_of(29)]  # 26, 5 and 28 tokens
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def hf_reference(llama_dir) -> list[list[int]]:
    """HF ``generate(do_sample=False)`` continuations of TORCH_PROMPTS (EOS stops both)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    out = []
    for prompt in TORCH_PROMPTS:
        ids = torch.tensor([prompt])
        gen = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS
        )
        out.append(gen[0, len(prompt) :].tolist())
    return out


def torch_engine(llama_dir, tokenizer, num_blocks=64, **kw) -> LLMEngine:
    from llmc.compiler.frontend.torch_runner import TorchRunner

    runner = TorchRunner(llama_dir, num_blocks=num_blocks, block_size=4)
    cfg = EngineConfig(block_size=4, num_blocks=num_blocks, max_model_len=64, **kw)
    return LLMEngine(runner, tokenizer, cfg, {EOS})


GREEDY_TORCH = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)


def test_torch_runner_greedy_equals_hf_generate(llama_dir, tokenizer, hf_reference):
    engine = torch_engine(llama_dir, tokenizer)
    for i, prompt in enumerate(TORCH_PROMPTS):
        engine.add_request(str(i), prompt, GREEDY_TORCH)
        assert run(engine, {0: []})[str(i)].outputs[0].token_ids == hf_reference[i]


def test_torch_runner_staggered_batch_equals_hf_generate(llama_dir, tokenizer, hf_reference):
    # A small budget and pool: prompts are chunked and requests preempted while others decode.
    engine = torch_engine(
        llama_dir, tokenizer, num_blocks=16, max_num_seqs=3, max_num_batched_tokens=10
    )
    counts = spy_on_schedule(engine)
    arrivals = {i: [(str(i), p, GREEDY_TORCH)] for i, p in enumerate(TORCH_PROMPTS)}
    finished = run(engine, arrivals)
    assert [finished[str(i)].outputs[0].token_ids for i in range(3)] == hf_reference
    assert counts["preempted"] > 0 and counts["chunks"] > 0


def test_stop_string_across_a_token_boundary_with_and_without_the_stop_string(tokenizer):
    prompt = prompt_of(3)
    tokens = oracle(prompt, 12)
    pieces = [tokenizer.decode(tokens[: i + 1]) for i in range(12)]
    # A stop string made of the last 2 characters of token 4's text and the first 2 of token 5's.
    k = next(i for i in range(3, 11) if len(pieces[i]) - len(pieces[i - 1]) >= 2)
    k = k if len(pieces[k + 1]) - len(pieces[k]) >= 2 else k + 1
    stop = pieces[k][-2:] + pieces[k + 1][len(pieces[k]) : len(pieces[k]) + 2]
    cut = pieces[k + 1].index(stop)
    assert cut < len(pieces[k]) < cut + len(stop)  # it spans tokens k and k + 1
    engine = fake_engine(tokenizer)
    for include in (False, True):
        params = SamplingParams(
            max_tokens=12, stop=[stop], include_stop_str_in_output=include, **GREEDY
        )
        out = run(engine, {0: [(str(include), prompt, params)]})[str(include)].outputs[0]
        assert out.text == pieces[k + 1][: cut + len(stop) * include]
        assert out.token_ids == tokens[: k + 2] and out.finish_reason == "stop"
        assert out.stop_reason == stop


def test_min_tokens_defers_stop_token_ids_and_stop_strings(tokenizer):
    prompt = prompt_of(3)
    tokens = oracle(prompt, 12)
    engine = fake_engine(tokenizer)
    # The fake model's row is one-hot: a masked stop id leaves all-zero logits, whose argmax is
    # token 0. Expected: replay the fake model with that rule.
    stop_id, context, expected = tokens[1], list(prompt), []
    while len(expected) < 12:
        token = next_token(np.array(context))
        if token == stop_id and len(expected) < 4:
            token = 0
        expected.append(token)
        context.append(token)
        if token == stop_id:
            break
    params = SamplingParams(max_tokens=12, stop_token_ids=[stop_id], min_tokens=4, **GREEDY)
    out = run(engine, {0: [("a", prompt, params)]})["a"].outputs[0]
    assert out.token_ids == expected and expected[1] == 0
    assert out.stop_reason == (stop_id if expected[-1] == stop_id else None)
    full = tokenizer.decode(tokens)
    stop = tokenizer.decode(tokens[:1])  # in the first token's text only
    params = SamplingParams(max_tokens=12, stop=[stop], min_tokens=3, **GREEDY)
    out = run(engine, {0: [("b", prompt, params)]})["b"].outputs[0]
    assert len(out.token_ids) >= 3
    assert out.text.startswith(full[: len(stop)])  # the early occurrence was not a stop


def test_n_greedy_completions_and_abort_of_a_forked_request(tokenizer):
    llm = LLM.from_engine(fake_engine(tokenizer))
    (out,) = llm.generate({"prompt_token_ids": prompt_of(4)}, SamplingParams(n=3, **GREEDY))
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert [o.token_ids for o in out.outputs] == [oracle(prompt_of(4), 16)] * 3
    assert out.finished and all(o.finish_reason == "length" for o in out.outputs)

    engine = fake_engine(tokenizer, max_num_seqs=2)
    engine.add_request("n", prompt_of(4), SamplingParams(n=3, max_tokens=20, **GREEDY))
    engine.add_request("other", prompt_of(5), SamplingParams(max_tokens=20, **GREEDY))
    first, other = engine.step()  # the prompt of "n" forks 3 completions; "other" prefills
    assert (first.request_id, len(first.outputs), other.request_id) == ("n", 3, "other")
    assert not first.finished
    stats = engine.stats()
    # running: n's parent and "other"; waiting: n's 2 forked completions (max_num_seqs = 2)
    assert (stats.num_running, stats.num_waiting) == (2, 2)
    engine.abort_request("n")
    engine.abort_request("other")
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_free_blocks) == (0, 0, 64)
    assert engine.step() == [] and not engine.has_unfinished_requests()


def test_a_cpu_engine_is_served_with_a_step_budget_of_at_most_384_tokens():
    from llmc.runtime.serving_defaults import CPU_STEP_TOKENS, default_step_tokens
    from tests.manifests import make_manifest

    assert CPU_STEP_TOKENS == 384
    cpu = "cpu", "onnxruntime"
    assert default_step_tokens(make_manifest(*cpu, max_num_tokens=2048)) == 384
    assert default_step_tokens(make_manifest(*cpu, max_num_tokens=64)) == 64
    gpu = make_manifest("sm90", "tensorrt", max_num_tokens=2048)
    assert default_step_tokens(gpu) == 2048  # a TensorRT plan's budget is its own


def test_a_cpu_engine_is_served_prefill_first_and_a_gpu_engine_decodes_first():
    from llmc.runtime.serving_defaults import default_decode_wait
    from tests.manifests import make_manifest

    assert default_decode_wait(make_manifest("cpu", "onnxruntime")) == 8
    assert default_decode_wait(make_manifest("sm90", "tensorrt")) == 0
