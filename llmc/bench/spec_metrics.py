"""Speculative decoding's counters of the server under test, read from its ``/metrics`` (vLLM's
names, which llmc serves too) before and after a run, so ``llmc bench`` reports the run's
drafted and accepted tokens."""

from __future__ import annotations

from dataclasses import dataclass

NAMES = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}


@dataclass(frozen=True)
class SpecDecodeCounts:
    """Cumulative counts (or a run's share of them): verifications, drafted tokens, accepted
    drafted tokens."""

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float

    def __sub__(self, earlier: SpecDecodeCounts) -> SpecDecodeCounts:
        return SpecDecodeCounts(
            self.num_drafts - earlier.num_drafts,
            self.num_draft_tokens - earlier.num_draft_tokens,
            self.num_accepted_tokens - earlier.num_accepted_tokens,
        )

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens (0 without drafts)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verification: the accepted drafts plus the target's own (vLLM's "mean
        acceptance length"); 0 without drafts."""
        if not self.num_drafts:
            return 0.0
        return 1.0 + self.num_accepted_tokens / self.num_drafts


def scrape_spec_decode(base_url: str, api_key: str | None, timeout_s: float = 10.0):
    """The server's `SpecDecodeCounts`, or None when ``/metrics`` cannot be read or does not
    export them (a server without speculative decoding, or another server)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{base_url}/metrics", headers=headers, timeout=timeout_s)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in NAMES:
                values[NAMES[name]] = values.get(NAMES[name], 0.0) + sample.value
    return SpecDecodeCounts(**values) if len(values) == len(NAMES) else None
