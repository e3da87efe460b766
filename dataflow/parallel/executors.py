"""The executor registry: start an executor by its kind (see :mod:`.protocol` for the kinds).

The one place that knows every executor; the executors themselves never import each other.
"""
from .process_executor import ProcessExecutor
from .protocol import InlineExecutor
from .thread_executor import ThreadExecutor

__all__ = ["make_executor"]


def make_executor(kind, num_workers, make_func, **process_options):
    """Start an executor of ``kind`` ("serial", "thread" or "process")."""
    if kind == "serial":
        return InlineExecutor(make_func)
    if kind == "thread":
        return ThreadExecutor(num_workers, make_func)
    from .process_executor import ProcessExecutor
    return ProcessExecutor(num_workers, make_func, **process_options)
