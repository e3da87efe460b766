"""Map work in worker processes: for Python functions that hold the GIL.

The process dataflows (:class:`MultiProcessMapData`, :class:`MultiProcessRunner`,
:class:`MultiProcessMapAndBatchData`, tensorpack's ``...ZMQ`` names) run their work in a
:class:`~.process_executor.ProcessExecutor`. Where the pieces live: the dataflows in
:mod:`.runners`, starting workers and shipping objects to them in :mod:`.start`, the worker's
body in :mod:`.worker`, the consumer's executor in :mod:`.process_executor`. Their public names stay importable from here.

Start methods: see :func:`~.start.default_start_method` (``"fork"`` while no other thread runs,
``"forkserver"`` otherwise, ``"spawn"`` where neither exists). Functions and dataflows are shipped
with cloudpickle, so lambdas and closures work with every start method; with ``"fork"`` they are
inherited without pickling.
"""
# Re-exports of what used to be defined here.
from .process_executor import SHM_BUDGET, ProcessExecutor  # noqa: F401
from .runners import (MultiProcessMapAndBatchData, MultiProcessMapAndBatchDataZMQ,
                      MultiProcessMapData, MultiProcessMapDataZMQ, MultiProcessRunner,
                      MultiProcessRunnerZMQ)
from .start import default_start_method

__all__ = ["ProcessExecutor", "MultiProcessMapData", "MultiProcessMapDataZMQ",
           "MultiProcessRunner", "MultiProcessRunnerZMQ", "MultiProcessMapAndBatchData",
           "MultiProcessMapAndBatchDataZMQ", "default_start_method"]
