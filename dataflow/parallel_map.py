"""tensorpack's module path ``tensorpack.dataflow.parallel_map``: the parallel maps.

They live in :mod:`dataflow.parallel.runners`; code ported by changing the import
(``from dataflow.parallel_map import MultiThreadMapData``) finds them here under the same names.
"""
from .parallel.runners import (MultiProcessMapAndBatchData, MultiProcessMapAndBatchDataZMQ,
                               MultiProcessMapData, MultiProcessMapDataComponentSharedArray,
                               MultiProcessMapDataZMQ, MultiThreadMapData)

__all__ = ["MultiThreadMapData", "MultiProcessMapData", "MultiProcessMapDataZMQ",
           "MultiProcessMapAndBatchData", "MultiProcessMapAndBatchDataZMQ"]
# in tensorpack's module but not in its __all__ (nor in tensorpack.dataflow)
__all__ += ["MultiProcessMapDataComponentSharedArray"]
