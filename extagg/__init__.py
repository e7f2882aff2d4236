"""extagg: aggregate more data than fits in memory."""

from extagg.errors import CorruptFileError, MemoryLimitError, SpillError

__all__ = ["CorruptFileError", "MemoryLimitError", "SpillError"]
__version__ = "0.1.0"
