"""Map work in threads: for functions that release the GIL (numpy, OpenCV, I/O).

The thread dataflows (:class:`MultiThreadMapData`, :class:`MultiThreadRunner`) live in
:mod:`.runners`, the executor (:class:`ThreadExecutor`) in :mod:`.thread_executor`; their names
stay importable from here.
"""
# Re-exports of what used to be defined here.
from .._helpers import available_cpus, dataflow_length  # noqa: F401
from .copies import Constant, CopiesRunner, OwnCopy, OwnDataFlow  # noqa: F401
from .executors import make_executor
from .runners import MultiThreadMapData, MultiThreadRunner
from .thread_executor import ThreadExecutor

__all__ = ["ThreadExecutor", "MultiThreadMapData", "MultiThreadRunner", "available_cpus",
           "make_executor"]
