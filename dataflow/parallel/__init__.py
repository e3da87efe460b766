"""Map work in parallel: threads, processes or Ray actors behind one mapper.

One datapoint's path through ``MultiProcessMapData(ds, 2, f)``::

    source ds ──> mapper (mapper.py, consumer thread: chunks, order, errors, buffer bound)
                    │ submit(run, [(seq, index, dp), ...])
                    v
                  executor (process_executor.py; threads: thread_executor.py; Ray: ray.py)
                    │ task message over ZeroMQ (transport.py)
                    v
                  worker (worker.py, its own process): run_chunk(f, ...) (protocol.py)
                    │ results: small values in the message, arrays in shared memory (shm.py)
                    v
                  executor.get() ──> mapper ──> the consumer's ``for dp in df``

Which executor runs a map is chosen once (policy.py, the run-in-thread table) and made by kind
(executors.py); the dataflows with tensorpack's names live in runners.py.
"""
# tensorpack's ``tensorpack.dataflow.parallel`` module holds its runners, under these names: code
# ported by changing the import (``from dataflow.parallel import PrefetchDataZMQ``) finds them here.
from .runners import (MultiProcessPrefetchData, MultiProcessRunner, MultiProcessRunnerZMQ,
                      MultiThreadPrefetchData, MultiThreadRunner, PrefetchData, PrefetchDataZMQ)

__all__ = ["PrefetchData", "MultiProcessPrefetchData", "MultiProcessRunner",
           "MultiProcessRunnerZMQ", "MultiThreadRunner", "PrefetchDataZMQ",
           "MultiThreadPrefetchData"]
