"""tensorpack's module path ``tensorpack.dataflow.parallel_map``: the parallel maps.

They live in :mod:`dataflow.parallel.runners`; code ported by changing the import
(``from dataflow.parallel_map import MultiThreadMapData``) finds them here under the same names.
"""
from .parallel.runners import (MultiProcessMapAndBatchData, MultiProcessMapAndBatchDataZMQ,
                               MultiProcessMapData, MultiProcessMapDataZMQ, MultiThreadMapData)

__all__ = ["MultiThreadMapData", "MultiProcessMapData", "MultiProcessMapDataZMQ",
           "MultiProcessMapAndBatchData", "MultiProcessMapAndBatchDataZMQ"]
