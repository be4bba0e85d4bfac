"""The contract between build and run: what an engine is, below both the compiler and the runtime.

- ``manifest``: ``manifest.json`` (``EngineManifest``) and the ``ManifestCore`` it shares with
  the portable TensorRT stage (``stage``: ``stage.json``, ``StageManifest``);
- ``files``: the engine directory's files, confined, listed and hashed;
- ``plan`` and ``split``: the execution plan of a segmented CPU engine (``plan.json``) and how a
  graph is cut into it;
- ``plugin``: the ``llmc::PagedAttention`` contract, ``PluginAttributes`` its one definition;
- ``kv_cache``: KV-cache dtypes (plugin attribute, numpy, ONNX) and geometry;
- ``targets``: the target registry (``TARGETS``: ``cpu``, ``sm80`` ... ``sm120``), one module per
  kind of target behind the ``Target`` protocol: backend, dtypes, execution providers, compute
  capability, host check;
- ``host``: ``check_runs_here``, whether this host runs an engine, dispatched to its target's
  check, which reads ``isa`` (CPU features, executed), ``gpu`` (CUDA devices, TensorRT) and
  ``provider`` (ONNX Runtime execution providers).

The compiler writes these, the runtime and the registry read them; this package imports neither
(``pyproject.toml``'s import-linter contracts, ``tests/test_layers.py``).
"""
