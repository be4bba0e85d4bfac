"""``llmc bench``: a load generator for OpenAI-compatible servers (ours, vLLM, llama.cpp ...),
measuring TTFT, TPOT, inter-token and end-to-end latency and throughput with the definitions of
vLLM's ``vllm bench serve``."""

from llmc.bench.client import RequestResult, Target, send_request
from llmc.bench.config import BenchConfig, BenchConfigError
from llmc.bench.dataset import BenchRequest, make_requests
from llmc.bench.metrics import BenchResult, LatencyStats, summarize
from llmc.bench.runner import BenchRun, BenchTargetError, first_model, run_bench, run_requests

__all__ = [
    "BenchConfig",
    "BenchConfigError",
    "BenchRequest",
    "BenchResult",
    "BenchRun",
    "BenchTargetError",
    "LatencyStats",
    "RequestResult",
    "Target",
    "first_model",
    "make_requests",
    "run_bench",
    "run_requests",
    "send_request",
    "summarize",
]
