"""The run-in-thread table: where the map work of an op chain runs.

Situations, first matching row wins:

1. ``num_parallel_workers`` is None or 0                -> ``"serial"``
2. debug mode (:func:`dataflow.config.debug_mode`)     -> ``"serial"``
3. free-threaded Python with the GIL disabled          -> ``"thread"``
4. every op native                                     -> ``"thread"``
5. a Python op and ``python_multiprocessing=False``    -> ``"thread"``
6. a Python op and ``python_multiprocessing=True``     -> ``"process"`` (the whole chain)

Native ops (built-in ops with ``native = True``, functions marked with :func:`dataflow.native`)
release the GIL, so threads run them in parallel and they never need a process. One Python op
sends the whole chain to processes when the user allows it. A :class:`~dataflow.ops.Compose`
counts by its members. The functions here are pure: they decide, the caller logs and acts.
"""
import sys

from .. import config
from .._helpers import is_int
from ..ops.base import _flatten, is_native, op_name
from .protocol import PROCESS, SERIAL, THREAD

__all__ = ["choose_executor", "describe_choice", "gil_disabled", "is_native",
           "SERIAL", "THREAD", "PROCESS"]


def gil_disabled():
    """Whether this is a free-threaded Python build running with the GIL disabled."""
    probe = getattr(sys, "_is_gil_enabled", None)
    return probe is not None and not probe()


def _decide(ops, num_parallel_workers, python_multiprocessing, debug, free_threaded):
    ops = _flatten(ops, "choose_executor")
    n = num_parallel_workers
    if n is not None and (not is_int(n) or n < 0):
        raise ValueError(f"num_parallel_workers must be None or an int >= 0, got {n!r}")
    if not n:
        return SERIAL, f"num_parallel_workers={n!r}"
    if config.debug_mode() if debug is None else debug:
        return SERIAL, "debug mode is on"
    if gil_disabled() if free_threaded is None else free_threaded:
        return THREAD, "free-threaded Python with the GIL disabled"
    python_op = next((op for op in ops if not is_native(op)), None)
    if python_op is None:
        return THREAD, f"all {len(ops)} ops are native"
    kind = PROCESS if python_multiprocessing else THREAD
    return kind, (f"Python op {op_name(python_op)!r} with "
                  f"python_multiprocessing={bool(python_multiprocessing)}")


def choose_executor(ops, num_parallel_workers, python_multiprocessing, *, debug=None,
                    free_threaded=None):
    """Where to run ``ops`` (a callable or a list of callables): ``"serial"``, ``"thread"`` or
    ``"process"``, by the table in the module doc.

    ``debug`` defaults to :func:`dataflow.config.debug_mode`; ``free_threaded`` to
    :func:`gil_disabled`. An empty op list counts as all native. Raises ``TypeError`` for an op
    that is not callable and ``ValueError`` for a bad ``num_parallel_workers``.
    """
    return _decide(ops, num_parallel_workers, python_multiprocessing, debug, free_threaded)[0]


def describe_choice(ops, num_parallel_workers, python_multiprocessing, *, debug=None,
                    free_threaded=None):
    """The choice of :func:`choose_executor` with its reason, as one line for a log, e.g.
    ``"process: Python op 'my_fn' with python_multiprocessing=True"``."""
    kind, why = _decide(ops, num_parallel_workers, python_multiprocessing, debug, free_threaded)
    return f"{kind}: {why}"
