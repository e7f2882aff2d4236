"""``python -m extagg``."""

import sys

from extagg.cli import main

sys.exit(main())
