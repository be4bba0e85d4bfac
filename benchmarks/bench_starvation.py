"""Latency of a short request beside one that starves it without llmc's bounds:
thousands of stop strings, or n = 128 long completions. In-process, through `LLMEngine.step`, no
server.

    python benchmarks/bench_starvation.py                    # the tests' tiny Llama, built here
    python benchmarks/bench_starvation.py --engine engines/gemma-3-270m-cpu-float32-none

The probe: a 4-token prompt asking for 4 greedy tokens (EOS ignored). Its latency is the wall
time from `add_request` to the step that finishes it, and the number of steps in between.
Scenarios, each measured with llmc as it is ("new" columns) and with a baseline without the
bounds ("old" columns) on the same host:

- *alone*: the probe by itself;
- *stops*: the probe added once a request with ``--stops`` (10,000) random stop strings (never
  found) has decoded ``--head-start`` steps;
- *n=128*: the same beside an ``--n`` (128) completion request of ``--long-tokens`` (200) tokens.

The baseline: stop strings searched one ``str.find`` per string per step (reproduced here;
llmc's `StopMatcher` runs one Aho-Corasick automaton), and no cap on forked completions
(``max_num_forked_seqs = max_num_seqs``). The build time of the stop strings' automaton, paid
once in ``add_request`` on the engine thread, is printed too. Each cell is the median of
``--repeat`` (3) rounds. Numbers vary with the load of the machine (2 shared cores): compare the
columns of one run. The baseline's n=128 cell runs about ``n / max_num_seqs * long_tokens``
steps: with a real engine, lower ``--long-tokens`` or ``--repeat``.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.tiny_models

from llmc.runtime import output_processor  # noqa: E402
from llmc.runtime.engine import LLMEngine  # noqa: E402
from llmc.runtime.sampling_params import SamplingParams  # noqa: E402
from llmc.runtime.scheduling.scheduler import Scheduler  # noqa: E402
from llmc.runtime.stop_matcher import StopMatch, StopMatcher  # noqa: E402

PROBE_PROMPT = [11, 12, 13, 14]


class FindEachStop:
    """The baseline stop-string search: one ``str.find`` per stop string over the new characters and
    the ``len(stop) - 1`` before them."""

    def __init__(self, stops: list[str]) -> None:
        self.stops, self.text = stops, ""

    def feed(self, new_text: str, search: bool = True) -> StopMatch | None:
        self.text += new_text
        best = None
        for stop in self.stops if search else ():
            index = self.text.find(stop, max(len(self.text) - len(new_text) - len(stop) + 1, 0))
            if index >= 0 and (best is None or index < best.start):
                best = StopMatch(index, stop)
        return best


class OldStopMatcher(StopMatcher):
    """A `StopMatcher` whose scanners search as the baseline does (`FindEachStop`), for the "old"
    column."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = list(dict.fromkeys(stops))
        self.max_len = max(map(len, self.stops), default=0)

    def scanner(self) -> FindEachStop:  # type: ignore[override]
        return FindEachStop(self.stops)


def tiny_engine(root: Path) -> LLMEngine:
    """The tests' tiny Llama (2 layers, hidden 64), built for cpu under ``root`` (about 15 s)."""
    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig
    from tests.tiny_models import make_tiny_llama

    model = make_tiny_llama(root / "model")
    config = BuildConfig.of(
        model=str(model), block_size=16, max_seq_len=512, output=str(root / "e")
    )
    return LLMEngine.from_engine_dir(build(config).engine_dir)


def set_fork_limit(engine: LLMEngine, limit: int | None) -> None:
    """Replace the (idle) engine's scheduler by one with ``max_num_forked_seqs = limit``
    (`EngineConfig` does not carry the field)."""
    config = dataclasses.replace(engine.scheduler.config, max_num_forked_seqs=limit)
    engine.scheduler = Scheduler(config, engine.scheduler.stop_checker.eos_token_ids)


def run_until_done(engine: LLMEngine, request_id: str) -> int:
    """Step until ``request_id`` finishes; the number of steps."""
    for num_steps in range(1, 100_000):
        if any(o.request_id == request_id and o.finished for o in engine.step()):
            return num_steps
    raise RuntimeError(f"{request_id} did not finish")


def probe(engine: LLMEngine, background: SamplingParams | None, head_start: int) -> dict:
    """The probe's latency beside ``background`` (None: alone); the engine is idle after."""
    build_s = 0.0
    if background is not None:
        t = time.perf_counter()
        engine.add_request("background", PROBE_PROMPT * 4, background)
        build_s = time.perf_counter() - t
        for _ in range(head_start):
            engine.step()
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    t = time.perf_counter()
    engine.add_request("probe", PROBE_PROMPT, greedy)
    num_steps = run_until_done(engine, "probe")
    latency_s = time.perf_counter() - t
    engine.abort_request("background")
    return {"latency_ms": latency_s * 1e3, "steps": num_steps, "build_ms": build_s * 1e3}


def cpu_model() -> str:
    """``lscpu``'s Model name."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if "Model name" in ln), "?")


def main() -> None:
    """Build or load the engine, run the three scenarios, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", help="engine directory (default: build the tiny Llama)")
    parser.add_argument("--stops", type=int, default=10_000, help="stop strings (scenario b)")
    parser.add_argument("--n", type=int, default=128, help="completions (scenario c)")
    parser.add_argument("--long-tokens", type=int, default=200, help="background max_tokens")
    parser.add_argument("--head-start", type=int, default=5, help="background steps first")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per cell (median)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        if args.engine:
            engine = LLMEngine.from_engine_dir(args.engine)
        else:
            engine = tiny_engine(Path(tmp))
        rng = random.Random(0)
        stops = ["".join(rng.choices("abcdefghij", k=12)) + "§" for _ in range(args.stops)]
        long = dict(max_tokens=args.long_tokens, temperature=0.0, ignore_eos=True)
        scenarios = {
            "alone": None,
            f"{args.stops} stop strings": SamplingParams(stop=stops, **long),
            f"n={args.n}, {args.long_tokens} tokens": SamplingParams(n=args.n, **long),
        }
        probe(engine, None, 0)  # warm-up
        rows = []
        for name, background in scenarios.items():
            results = []
            for old in (False, True):
                output_processor.StopMatcher = OldStopMatcher if old else StopMatcher
                set_fork_limit(engine, engine.scheduler.config.max_num_seqs if old else None)
                rounds = [probe(engine, background, args.head_start) for _ in range(args.repeat)]
                results.append({k: statistics.median(r[k] for r in rounds) for k in rounds[0]})
            rows.append((name, *results))
        output_processor.StopMatcher = StopMatcher

    print(f"CPU: {cpu_model()}")
    print(
        f"engine: {args.engine or 'tiny Llama (2 layers, hidden 64), cpu build'}, "
        f"max_num_seqs {engine.config.max_num_seqs}"
    )
    head = f"{'probe (4 tokens) beside':<28} {'new ms':>9} {'steps':>6} {'old ms':>9} {'steps':>6}"
    print(head + f" {'build ms new/old':>17}")
    for name, new, old in rows:
        build = f"{new['build_ms']:.0f}/{old['build_ms']:.0f}"
        print(
            f"{name:<28} {new['latency_ms']:9.1f} {new['steps']:6.0f} "
            f"{old['latency_ms']:9.1f} {old['steps']:6.0f} {build:>17}"
        )


if __name__ == "__main__":
    main()
