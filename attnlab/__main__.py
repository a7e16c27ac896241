"""`python -m attnlab` (and `torchrun -m attnlab`) runs the CLI."""

import sys

from attnlab.cli import main

sys.exit(main())
