"""How the library reports: through `logging` under the ``attnlab`` logger, never ``print``.

Each module logs to ``logging.getLogger(__name__)``: progress and results at INFO, what needs
attention at WARNING. A program that imports attnlab sets the level or silences it as for any
library (``logging.getLogger("attnlab").setLevel(logging.WARNING)``); the package adds only a
NullHandler. The CLI installs a handler that writes INFO lines to stdout, WARNING and above to
stderr, and keeps two marks a record may carry in ``extra``:

- ``STDERR``: an INFO line for stderr (progress notes that are not the command's output);
- ``inline(end)``: its line ends with ``end`` instead of a newline (a stage on a terminal,
  completed in place).

Progress bars (tqdm, on a terminal) are no records: they show unless ``silenced()``.
"""

from __future__ import annotations

import logging
from typing import Any

LOGGER = "attnlab"
STDERR_KEY, END_KEY = "attnlab_stderr", "attnlab_end"
STDERR: dict[str, Any] = {STDERR_KEY: True}


def inline(end: str = "") -> dict[str, Any]:
    """``extra`` for a stderr line ending in ``end`` (the next line completes it)."""
    return {STDERR_KEY: True, END_KEY: end}


def silenced() -> bool:
    """Whether the program set the attnlab logger above INFO (``attnlab -q`` does): progress
    bars, which are no log records, then stay off too."""
    return logging.getLogger(LOGGER).level > logging.INFO
