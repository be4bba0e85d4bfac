"""llmc engines as Ray Serve replicas on a real local Ray cluster (127.0.0.1, 2 CPUs): llmc's
OpenAI app in front (the openai client unchanged, the same greedy text as one ``llmc serve``,
the same errors), each shared prefix kept on one replica, a burst scaling 1 -> 2 replicas, and a
shutdown that drains."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from llmc.deploy.ray.app import build_application  # noqa: E402
from llmc.deploy.ray.run import PROXY_CHECK_ENV, start_serve  # noqa: E402
from llmc.runtime.server.serve_config import ServeConfig  # noqa: E402

if TYPE_CHECKING:
    from tests.conftest import ServerFactory

MODEL = "tiny-llama"
#: Two system prompts of several KV blocks each (the router keys on full blocks).
PREFIXES = [
    "You are a terse assistant for a shipping company. Answer in one line. " * 2,
    "Translate every sentence the user gives you into formal French prose. " * 2,
]
APP = "llmc-test"
ENGINE_OPTIONS = {"max_num_seqs": 4, "kv_cache_memory": 0.01, "replica_num_cpus": 0}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local Ray cluster with Serve's HTTP proxy on a free port; yields the proxy's URL."""
    port = _free_port()
    saved = {k: os.environ.get(k) for k in PROXY_CHECK_ENV}
    os.environ.update(PROXY_CHECK_ENV)  # read by the cluster's processes, started here
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key)
        else:
            os.environ[key] = value
    start_serve("127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _num_replicas(app: str, states: tuple[str, ...] = ("RUNNING",)) -> int:
    deployment = serve.status().applications[app].deployments["LLMCEngine"]
    return sum(deployment.replica_states.get(state, 0) for state in states)


#: A replica the autoscaler asked for, running or on its way (its process and engine loading).
WANTED = ("STARTING", "RUNNING", "UPDATING", "RECOVERING")


def _complete(url: str, prompt: str, **body) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, **body}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def app(cluster: str, tiny_llama_engine: Path) -> str:
    """One application, autoscaling 1 -> 2 engine replicas on ongoing requests; its URL."""
    options = {
        **ENGINE_OPTIONS,
        "min_replicas": 1,
        "max_replicas": 2,
        "target_ongoing_requests": 1,
        "upscale_delay_s": 0,
        "shutdown_timeout": 60,
    }
    application = build_application(
        tiny_llama_engine, ServeConfig.from_dict(options), model_name=MODEL
    )
    serve.run(application, name=APP, route_prefix="/llmc")
    url, deadline = f"{cluster}/llmc", time.monotonic() + 180
    while not _answers(f"{url}/health"):  # the HTTP proxy may still be starting (a busy host)
        assert time.monotonic() < deadline, "Ray Serve's HTTP proxy did not answer in 180 s"
        time.sleep(1)
    return url


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def burst(app: str) -> tuple[int, list[dict], float]:
    """Replicas before a burst (6 clients sending long requests back to back until the
    autoscaler asks for a second replica, or 120 s), the burst's responses, and the seconds until
    it asked. Ray's autoscaler averages ongoing requests over seconds: the load must last. The
    second replica's start (a process loading the engine: minutes on a loaded 2-core host) is not
    the burst's: the test waits for it after."""
    before = _num_replicas(APP)
    start, scaled = time.monotonic(), threading.Event()

    def client(i: int) -> list[dict]:
        responses = []
        while not scaled.is_set() and time.monotonic() - start < 120:
            responses.append(_complete(app, f"story {i}:", max_tokens=60, ignore_eos=True))
        return responses

    with ThreadPoolExecutor(6) as pool:
        clients = [pool.submit(client, i) for i in range(6)]
        while _num_replicas(APP, WANTED) < 2 and time.monotonic() - start < 120:
            time.sleep(0.5)
        scaled_after = time.monotonic() - start
        scaled.set()
        return before, [r for c in clients for r in c.result()], scaled_after


def test_a_burst_scales_one_replica_to_two(burst: tuple[int, list[dict], float]):
    before, responses, scaled_after = burst
    assert before == 1
    assert _num_replicas(APP, WANTED) == 2, f"no second replica {scaled_after:.0f} s in a burst"
    deadline = time.monotonic() + 300
    while _num_replicas(APP) < 2:  # the replica asked for starts and serves
        assert time.monotonic() < deadline, f"the second replica did not run: {serve.status()}"
        time.sleep(1)
    assert responses and {r["choices"][0]["finish_reason"] for r in responses} == {"length"}


def _replica_counts(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    pattern = r'^llmc:replica_requests_total\{model_name="[^"]+",replica="([^"]+)"\} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.M)}


def test_each_prefix_stays_on_one_replica(app: str, burst):
    for prefix in PREFIXES:
        before = _replica_counts(app)
        for question in ("Where is my parcel?", "How long does it take?", "Is it insured?"):
            _complete(app, prefix + question)
        after = _replica_counts(app)
        grew = {r: after[r] - before.get(r, 0) for r in after if after[r] > before.get(r, 0)}
        assert list(grew.values()) == [3], f"{prefix[:20]!r} spread over replicas: {grew}"
    assert len(_replica_counts(app)) <= 2


def test_openai_client_and_greedy_text_equal_one_server(
    app: str, tiny_llama_engine: Path, running_server: ServerFactory
):
    from llmc.runtime.engine import LLMEngine

    prompt, messages = "The capital of France is", [{"role": "user", "content": "hi"}]
    client = openai.OpenAI(base_url=f"{app}/v1", api_key="unused")
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stream=True
    )
    streamed = "".join(chunk.choices[0].text for chunk in stream)
    assert whole.choices[0].text == streamed
    chat = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0
    )
    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    with running_server(engine, MODEL) as single:
        one = openai.OpenAI(base_url=f"{single.url}/v1", api_key="unused")
        want = one.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
        want_chat = one.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=4, temperature=0
        )
    assert whole.choices[0].text == want.choices[0].text
    assert chat.choices[0].message.content == want_chat.choices[0].message.content


def test_errors_and_metrics_are_the_servers(app: str):
    too_long = httpx.post(
        f"{app}/v1/completions",
        json={"model": MODEL, "prompt": "word " * 400, "max_tokens": 4},
    )
    assert too_long.status_code == 400, too_long.text
    assert "maximum context length" in too_long.json()["error"]["message"]
    unknown = httpx.post(
        f"{app}/v1/completions", json={"model": "other", "prompt": "x", "max_tokens": 1}
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["type"]
    assert httpx.get(f"{app}/health").status_code == 200
    metrics = httpx.get(f"{app}/metrics").text
    assert "vllm:kv_cache_usage_perc" in metrics and "vllm:prompt_tokens_total" in metrics


def test_shutdown_drains(app: str):
    """A request in flight when the application is deleted runs to its end."""
    with ThreadPoolExecutor(1) as pool:
        late = pool.submit(_complete, app, "a long story:", max_tokens=100, ignore_eos=True)
        time.sleep(1.0)
        deleting = threading.Thread(target=serve.delete, args=(APP,))
        deleting.start()
        assert late.result()["choices"][0]["finish_reason"] == "length"
        deleting.join(120)


def test_the_router_keys_are_the_engine_prefix_cache_keys(tiny_llama_engine: Path):
    """The hashes a request is placed by name the blocks its prompt leaves in the engine's
    prefix cache (what the replica that served it holds)."""
    from llmc.deploy.ray.request import prefix_hashes
    from llmc.runtime.engine import LLMEngine
    from llmc.runtime.sampling_params import SamplingParams

    engine = LLMEngine.from_engine_dir(tiny_llama_engine, num_blocks=32)
    ids = engine.tokenizer(PREFIXES[0]).input_ids
    engine.add_request("r", ids, SamplingParams(max_tokens=1))
    while engine.has_unfinished_requests():
        engine.step()
    block_size = engine.config.block_size
    hashes = prefix_hashes(ids, block_size)
    assert len(hashes) == len(ids) // block_size > 1
    pool = engine.scheduler.kv_cache_manager.block_pool
    assert all(pool.get_cached_block(h) is not None for h in hashes)
    assert prefix_hashes(ids[:-block_size], block_size) == hashes[:-1]


def test_replica_statistics_sum_as_one_pool():
    from llmc.deploy.ray.pool import sum_stats
    from llmc.runtime.stats import EngineStats

    # running, waiting, KV usage, prefix queries, hits, preemptions, free blocks, blocks
    half_used = EngineStats(1, 2, 0.5, 10, 5, 1, 50, 100)
    idle = EngineStats(3, 0, 0.0, 20, 15, 0, 300, 300)
    pooled = sum_stats([half_used, idle])
    assert (pooled.num_running, pooled.num_waiting, pooled.num_preemptions) == (4, 2, 1)
    assert (pooled.prefix_cache_queries, pooled.prefix_cache_hits) == (30, 20)
    assert pooled.kv_cache_usage == pytest.approx(50 / 400)
    assert sum_stats([]).kv_cache_usage == 0.0
