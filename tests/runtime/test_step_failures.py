"""A step that raises, in any part (planning, the runner, recording the results), aborts the
requests it held, frees their blocks, and leaves the engine serving; seeds are uint64 and the
per-completion seeds of n > 1 wrap instead of overflowing."""

import pytest

from llmc.errors import StepFailedError
from llmc.runtime.sampling.sampler import Sampler
from llmc.runtime.sampling_params import MAX_SEED, SamplingParams
from llmc.runtime.sequence import Sequence
from tests.runtime.test_engine import GREEDY, fake_engine, oracle, prompt_of, run

PROMPT = [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]  # three full blocks of 4, and 1


def test_a_failed_schedule_aborts_every_request_and_caches_no_unwritten_block(tiny_tokenizer):
    # The fake runner reads each context back from its cache and asserts every slot was
    # written: a block left in the prefix cache unwritten would fail the second run.
    eng = fake_engine(tiny_tokenizer)
    schedule = eng.scheduler.schedule
    calls = []

    def plan_then_fail():  # noqa: ANN202
        planned = schedule()  # blocks allocated and entered in the prefix cache
        calls.append(planned)
        if len(calls) == 1:
            raise RuntimeError("injected scheduler failure")
        return planned

    eng.scheduler.schedule = plan_then_fail  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=5, **GREEDY)
    eng.add_request("a", PROMPT, params)
    eng.add_request("b", prompt_of(3), params)
    with pytest.raises(StepFailedError, match="injected scheduler failure") as failure:
        eng.step()
    assert failure.value.request_ids == ("a", "b")
    assert len(calls[0].scheduled) == 2  # both were planned, with blocks
    stats = eng.stats()
    assert not eng.has_unfinished_requests() and stats.num_free_blocks == 64
    assert stats.num_running == stats.num_waiting == 0

    again = run(eng, {0: [("a2", PROMPT, params)]})["a2"]
    assert again.num_cached_tokens == 0  # none of the failed plan's blocks
    assert again.outputs[0].token_ids == oracle(PROMPT, 5)


def test_a_failure_while_recording_results_aborts_the_step_and_the_engine_goes_on(
    tiny_tokenizer,
):
    eng = fake_engine(tiny_tokenizer, max_num_seqs=1)  # "b" waits while "a" runs
    update = eng.outputs.update
    calls = []

    def fail_third(seq):  # noqa: ANN001, ANN202
        calls.append(seq.request_id)
        if len(calls) == 3:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected detokenizer failure")
        return update(seq)

    eng.outputs.update = fail_third  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=5, **GREEDY)
    eng.add_request("a", prompt_of(1), params)
    eng.add_request("b", prompt_of(2), params)
    eng.step()
    eng.step()
    with pytest.raises(StepFailedError, match="injected detokenizer failure") as failure:
        eng.step()
    assert failure.value.request_ids == ("a",)
    assert "a" not in eng.outputs and eng.stats().num_running == 0
    finished = run(eng, {0: []})
    assert list(finished) == ["b"] and finished["b"].outputs[0].token_ids == oracle(prompt_of(2), 5)
    assert eng.stats().num_free_blocks == 64


@pytest.mark.parametrize("seed", [-1, MAX_SEED + 1, 10**30, True, 1.0])
def test_seeds_outside_uint64_are_refused_naming_the_field(seed):
    with pytest.raises(ValueError, match=r"^seed must be None or an integer in \[0, 2\*\*64 - 1\]"):
        SamplingParams(seed=seed).validate()
    with pytest.raises(ValueError, match="seed must be"):
        Sampler(seed=seed)


def test_per_completion_seeds_wrap_modulo_2_64():
    params = SamplingParams(n=3, seed=MAX_SEED)
    params.validate()
    assert [params.completion_seed(i) for i in range(3)] == [MAX_SEED, 0, 1]
    assert SamplingParams(seed=7).completion_seed(2) == 9  # vLLM's seed + index
    assert SamplingParams().completion_seed(1) is None
    seqs = [Sequence("r", [5], params, index=i) for i in range(3)]
    assert [s.generator.initial_seed() for s in seqs] == [MAX_SEED, 0, 1]
    assert Sampler(seed=MAX_SEED)._generator.initial_seed() == MAX_SEED
