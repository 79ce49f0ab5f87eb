"""`python -m sidecar` is the same as the `dlq-sidecar` command."""

import sys

from sidecar.cli import main

sys.exit(main())
