"""Read a ``--config`` YAML file: the one reader of ``llmc build`` and ``llmc serve``.

Both commands take any option from a YAML mapping and let the command line win (as ``vllm serve
--config`` does); this module only reads the file and checks it is a mapping with string keys.
What the keys mean is each config's own business (``BuildConfig.from_sources``,
``ServeConfig.from_sources``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_config_file(path: str | Path, what: str, error: type[Exception]) -> dict[str, Any]:
    """The mapping in YAML file ``path``, keys with ``-`` read as ``_`` (flag spelling).

    ``what`` names the file in messages ("build config"). Raises ``error`` for a file that
    cannot be read or parsed, or that does not hold a mapping with string keys.
    """
    import yaml

    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise error(f"cannot read {what} {path}: {e}") from e
    if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
        raise error(f"{path} must hold a mapping of option: value")
    return {k.replace("-", "_"): v for k, v in loaded.items()}
