"""Read a ``--config`` YAML file: the one reader of ``llmc build`` and ``llmc serve``.

Both commands take any option from a YAML mapping and let the command line win (as ``vllm serve
--config`` does); this module only reads the file and checks it is a mapping with string keys.
What the keys mean is each config's own business (``BuildConfig.from_sources``,
``ServeConfig.from_sources``); when they refuse a value, `short_repr` is how they echo it.

A config file is a few lines of option: value, so the reader refuses what no config needs and
an attacker's file would: more than ``MAX_CONFIG_BYTES``, more than ``MAX_CONFIG_NODES`` values
once every alias is expanded (a nine-line "billion laughs" file expands to 9^9 strings: cheap to
load, since PyYAML shares an alias's object, but every walk over it, a ``repr`` in an error
message included, runs for minutes and takes GBs), or nesting deeper than
``MAX_CONFIG_DEPTH`` (PyYAML composes nodes recursively). Anchors and aliases within those
bounds load as usual: they are ordinary YAML for sharing a list or a group of options.
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import Event

#: Largest config file read, bytes.
MAX_CONFIG_BYTES = 1 << 20
#: Most values (scalars, lists, mappings) in a config, each alias counted as the values it repeats.
MAX_CONFIG_NODES = 10_000
#: Deepest nesting of lists and mappings in a config.
MAX_CONFIG_DEPTH = 32


def read_config_file(path: str | Path, what: str, error: type[Exception]) -> dict[str, Any]:
    """The mapping in YAML file ``path``, keys with ``-`` read as ``_`` (flag spelling).

    ``what`` names the file in messages ("build config"). Raises ``error`` for a file that
    cannot be read or parsed, one larger than ``MAX_CONFIG_BYTES``, one past ``MAX_CONFIG_NODES``
    or ``MAX_CONFIG_DEPTH`` (`_BoundedLoader`), or one that does not hold a mapping with string
    keys.
    """
    try:
        with open(path, "rb") as f:  # at most one byte past the cap, even from /dev/zero
            text = f.read(MAX_CONFIG_BYTES + 1)
        if len(text) <= MAX_CONFIG_BYTES:
            loaded = yaml.load(text, Loader=_BoundedLoader) or {}
    # ValueError: values PyYAML parses but Python cannot build (an int of 5000 digits, month 13).
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise error(f"cannot read {what} {path}: {e}") from e
    if len(text) > MAX_CONFIG_BYTES:
        raise error(f"{what} {path} is larger than {MAX_CONFIG_BYTES} bytes")
    if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
        raise error(f"{path} must hold a mapping of option: value")
    return {k.replace("-", "_"): v for k, v in loaded.items()}


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a document of more than ``MAX_CONFIG_NODES`` nodes once its
    aliases are expanded, or nested deeper than ``MAX_CONFIG_DEPTH``.

    It counts while composing, before any Python object is built: a node counts one, an alias
    counts the nodes of the node it names (recorded when that node was composed), so the count
    is the expanded size at the cost of the file's own. An alias inside the node it names
    (``&a [*a]``) would expand forever: refused. Raises ``ComposerError`` (a ``YAMLError``)
    with the position in the file.
    """

    def __init__(self, stream: bytes) -> None:
        super().__init__(stream)
        self._num_nodes = 0
        self._depth = 0
        self._anchor_sizes: dict[str, int] = {}  # anchor -> nodes an alias to it repeats

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self.anchors and event.anchor not in self._anchor_sizes:
                self._refuse(event, "recursive alias: it names a node that contains it")
            # An undefined anchor counts nothing here; PyYAML refuses it.
            self._count(event, self._anchor_sizes.get(event.anchor, 0))
            return super().compose_node(parent, index)
        start = self._num_nodes
        self._count(event, 1)
        self._depth += 1
        if self._depth > MAX_CONFIG_DEPTH:
            self._refuse(event, f"lists and mappings nested deeper than {MAX_CONFIG_DEPTH}")
        node = super().compose_node(parent, index)
        self._depth -= 1
        if event.anchor is not None:
            self._anchor_sizes[event.anchor] = self._num_nodes - start
        return node

    def _count(self, event: Event, num_nodes: int) -> None:
        self._num_nodes += num_nodes
        if self._num_nodes > MAX_CONFIG_NODES:
            self._refuse(
                event,
                f"more than {MAX_CONFIG_NODES} values once aliases are expanded "
                "(a config is a few lines of option: value)",
            )

    def _refuse(self, event: Event, problem: str) -> None:
        raise ComposerError(None, None, problem, event.start_mark)


_SHORT = reprlib.Repr()
_SHORT.maxlevel = 2
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 4


def short_repr(value: Any, max_chars: int = 80) -> str:
    """``repr(value)`` in at most ``max_chars`` characters, for an error that echoes a config
    value: the value may be any size (a YAML list, a string on the command line), the message
    stays one line. Reads only the first few items of each container (``reprlib``), so the
    cost does not grow with ``value``."""
    text = _SHORT.repr(value)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."
