"""``python -m llmc``: the ``llmc`` command."""

import sys

from llmc.cli import main

sys.exit(main())
