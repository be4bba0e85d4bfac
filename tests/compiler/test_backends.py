"""The backend registry: every target has exactly one backend, and each implements the protocol
``llmc.compiler.build`` drives."""

from __future__ import annotations

import inspect

import pytest

from llmc.compiler.backends.protocol import Backend
from llmc.compiler.backends.registry import BACKENDS, backend_for
from llmc.engine.targets import TARGETS
from llmc.errors import BuildConfigError


def test_every_target_has_exactly_one_backend():
    for arch in TARGETS:
        accepting = [name for name, backend in BACKENDS.items() if backend.accepts(arch)]
        assert len(accepting) == 1, (arch, accepting)
    assert backend_for("cpu").name == "onnxruntime"
    assert backend_for("sm90").name == "tensorrt"
    assert backend_for("sm89").name == "tensorrt-rtx"


def test_an_unknown_target_has_no_backend():
    with pytest.raises(BuildConfigError, match="no backend builds --arch tpu"):
        backend_for("tpu")


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_backend_implements_the_protocol(name):
    backend = BACKENDS[name]
    assert backend.name == name
    for method, spec in inspect.getmembers(Backend, inspect.isfunction):
        if method.startswith("_"):
            continue
        own = getattr(type(backend), method)
        assert list(inspect.signature(own).parameters) == list(
            inspect.signature(spec).parameters
        ), method
