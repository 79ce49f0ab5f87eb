"""`python -m sidecar.ops.broker start|stop|status|fetch`."""

import sys

from .cli import main

sys.exit(main())
