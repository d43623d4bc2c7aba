"""`python -m proxy.cli`: the `islwatch` command."""

import sys

from proxy.cli import main

sys.exit(main())
