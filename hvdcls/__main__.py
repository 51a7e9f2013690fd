"""`python -m hvdcls` is the `hvdcls` command (used under launchers: same interpreter on every rank)."""
import sys

from hvdcls.cli import main

sys.exit(main())
