"""Run ``llmc serve`` in a child process for a benchmark: start on a free port of 127.0.0.1, wait
until it answers, stop it with SIGTERM (its graceful drain)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from llmc.errors import LlmcError


class ServeProcessError(LlmcError):
    """``llmc serve`` exited or did not answer in time; the message holds its stderr tail."""


class ServeProcess:
    """``llmc serve ENGINE --port P *extra_args`` as a context manager.

    Args:
        engine_dir: the engine directory.
        extra_args: further ``llmc serve`` flags (``--no-prefix-caching``, ...).
        startup_timeout_s: how long to wait for ``GET /health`` to answer 200, seconds.

    Attributes:
        url: ``http://127.0.0.1:<port>`` once started.

    Raises (on entering):
        ServeProcessError: if the server exits (e.g. an unknown flag) or does not answer in time.
    """

    def __init__(
        self, engine_dir: str | Path, extra_args: list[str], startup_timeout_s: float = 300.0
    ) -> None:
        self.engine_dir = str(engine_dir)
        self.extra_args = list(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.url = ""
        self._proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()

    def __enter__(self) -> ServeProcess:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "llmc.cli", "serve", self.engine_dir, "--port", str(port)]
        self._proc = subprocess.Popen(
            [*cmd, *self.extra_args], stdout=self._log, stderr=subprocess.STDOUT, env=os.environ
        )
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._healthy():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise ServeProcessError(
                    f"`llmc serve {' '.join(self.extra_args)}` did not start: {self.log_tail()}"
                )
            time.sleep(0.2)
        return self

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def metric(self, name: str) -> float | None:
        """The sum of the samples of ``name`` (e.g. ``vllm:prefix_cache_hits_total``) on
        ``/metrics``; None when the server does not export it."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.url + "/metrics", timeout=10).text
        values = [
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]
        return sum(values) if values else None

    def log_tail(self, num_chars: int = 2000) -> str:
        """The last ``num_chars`` characters the server wrote to stdout and stderr."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-num_chars:]

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
