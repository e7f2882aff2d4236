"""``python -m extagg``."""

from extagg.cli import run

run()
