"""Text a build samples from its model, sampled once: in memory for the build (calibration,
the accuracy-target search and the accuracy report ask for the same held-out windows) and on
disk under the calibration cache directory for the next build of the same checkpoint.

A build without ``--calib-data`` samples 64 calibration and 16 held-out texts of 288 tokens;
on 2 cores that is most of its wall time (Gemma 3 270M: over 800 s for the calibration texts,
then the held-out ones twice, once for the search and once for the report). Sampled text
depends only on the checkpoint, the sampler (``TextSampler.kind``, llmc's version) and its
arguments, so it is kept by those. A sampler whose text ``i`` is seeded on its own
(``prefix_stable``) serves a request for fewer texts from the first ones kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from llmc.calibration.data import TextSampler
from llmc.version import __version__


class CachedTextSampler(TextSampler):
    """``inner``'s texts for checkpoint ``model_digest``, kept in memory and (``directory`` not
    None) as JSON files in ``directory``. Raises what ``inner.sample`` raises; an unreadable
    cache file is sampled anew and rewritten."""

    def __init__(self, inner: TextSampler, model_digest: str, directory: Path | None) -> None:
        self.inner, self.model_digest, self.directory = inner, model_digest, directory
        self._kept: dict[str, list[str]] = {}

    @property
    def kind(self) -> str:
        return self.inner.kind

    @property
    def prefix_stable(self) -> bool:
        return self.inner.prefix_stable

    def sample(self, num_texts: int, max_new_tokens: int, seed: int) -> list[str]:
        """``inner.sample``'s texts, from memory or disk where they were sampled before."""
        name = self._name(num_texts, max_new_tokens, seed)
        texts = self._kept.get(name) or self._read(name)
        if texts is None or len(texts) < num_texts:
            texts = self.inner.sample(num_texts, max_new_tokens, seed)
            self._write(name, texts)
        self._kept[name] = texts
        return texts[:num_texts]

    def _name(self, num_texts: int, max_new_tokens: int, seed: int) -> str:
        """The file name of a request: the texts' key (any count when prefix-stable)."""
        count = None if self.prefix_stable else num_texts
        parts = [self.model_digest, self.kind, __version__, max_new_tokens, seed, count]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32] + ".json"

    def _read(self, name: str) -> list[str] | None:
        if self.directory is None:
            return None
        try:
            texts = json.loads((self.directory / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        ok = isinstance(texts, list) and all(isinstance(t, str) for t in texts)
        return texts if ok else None

    def _write(self, name: str, texts: list[str]) -> None:
        """Write atomically (a temporary file renamed), so a reader sees all texts or none;
        nothing when the disk refuses."""
        if self.directory is None:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(texts, f)
            os.replace(tmp, self.directory / name)
        except OSError:  # the cache is a convenience: a full or read-only disk skips it
            pass
