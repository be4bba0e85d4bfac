"""What the ingress sends a replica, and the prefix keys the router places it by."""

from __future__ import annotations

from dataclasses import dataclass

from llmc.runtime.outputs import RequestOutput
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.scheduling.kv_cache_manager import ROOT_HASH, hash_block_tokens
from llmc.runtime.stats import EngineStats

#: Blocks of a prompt the router keys on: a prefix longer than this many blocks places a request
#: like its first ``MAX_PREFIX_BLOCKS`` blocks do (bounds hashing and the router's memory).
MAX_PREFIX_BLOCKS = 32


@dataclass(frozen=True)
class ReplicaRequest:
    """One generation request, as `ReplicaPool` hands it to a replica.

    Attributes:
        prompt_token_ids: the prompt, token ids.
        params: its sampling parameters.
        request_id: unique per request (the server's).
        prompt: the prompt text, or None.
        prefix_hashes: the chained hashes of the prompt's first full KV blocks
            (`prefix_hashes`), the keys of the engine's prefix cache; the router places the
            request by them.
    """

    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str
    prompt: str | None
    prefix_hashes: tuple[bytes, ...]


@dataclass(frozen=True)
class ReplicaOutput:
    """One output of a replica's request, with where it ran and that replica's state.

    Attributes:
        output: the request's cumulative output.
        replica_id: the Ray Serve replica that runs it.
        stats: that replica's engine statistics when the output left it.
    """

    output: RequestOutput
    replica_id: str
    stats: EngineStats


def prefix_hashes(
    token_ids: list[int], block_size: int, max_blocks: int = MAX_PREFIX_BLOCKS
) -> tuple[bytes, ...]:
    """The prefix-cache keys of a prompt's first full blocks, shortest prefix first.

    The same chained SHA-256 as the engine's prefix cache (``hash_block_tokens``), so that a
    replica's report of the prefixes it served and the router's lookup name the same blocks.

    Args:
        token_ids: the prompt's token ids.
        block_size: tokens per KV block (the engine's).
        max_blocks: at most this many blocks are hashed.

    Returns:
        One 32-byte hash per full block, at most ``max_blocks``; empty for a prompt shorter
        than one block.
    """
    hashes, parent = [], ROOT_HASH
    full = min(len(token_ids) // block_size, max_blocks)
    for start in range(0, full * block_size, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return tuple(hashes)
