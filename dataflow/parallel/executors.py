"""The executor registry: start an executor by its kind (see :mod:`.protocol` for the kinds).

The one place that knows every executor; the executors themselves never import each other.
Ray itself is imported only when a Ray executor starts (:mod:`.ray` does not import it).
"""
from .process_executor import ProcessExecutor
from .protocol import PROCESS, RAY, SERIAL, THREAD, InlineExecutor
from .ray import RayExecutor
from .thread_executor import ThreadExecutor

__all__ = ["make_executor"]


def make_executor(kind, num_workers, make_func, **process_options):
    """Start an executor of ``kind`` (``SERIAL``, ``THREAD``, ``PROCESS`` or ``RAY``);
    ``process_options`` go to the process or Ray executor."""
    if kind == SERIAL:
        return InlineExecutor(make_func)
    if kind == THREAD:
        return ThreadExecutor(num_workers, make_func)
    if kind == PROCESS:
        return ProcessExecutor(num_workers, make_func, **process_options)
    if kind == RAY:
        return RayExecutor(num_workers, make_func, **process_options)
    raise ValueError(f"unknown executor kind {kind!r}")
