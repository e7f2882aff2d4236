"""extagg.io: files in and out — input scans through ``pyarrow.dataset``, ``--where``
expressions, result writers, the external sort of results, and ``aggregate_files``."""

from extagg.io.inputs import InputScan, open_input
from extagg.io.output import ResultWriter
from extagg.io.run import FileQuery, aggregate_files, plan_query
from extagg.io.where import parse_expression

__all__ = [
    "FileQuery",
    "InputScan",
    "ResultWriter",
    "aggregate_files",
    "open_input",
    "parse_expression",
    "plan_query",
]
