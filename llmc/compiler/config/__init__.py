"""The options of ``llmc build``, one dataclass per concern (``BuildConfig`` composes them).

    source.py        SourceOptions       the checkpoint and the engine's dtype
    export.py        ExportOptions       serving limits and KV-cache block size
    quantization.py  QuantOptions        the Q/DQ format and its per-format knobs
    calibration.py   CalibrationOptions  calibration and accuracy-report text, cache
    target.py        TargetOptions       the target (cpu or a GPU arch) and its backend's options
    destination.py   DestinationOptions  where the engine is written and published

Each field is an ``option``: its default, its ``--help`` text and its choices. A field's name is
its flag (``block_size``: ``--block-size``) in every group.
"""
