"""tensorpack's module path ``tensorpack.dataflow.format``: the readers of on-disk formats.

They live in :mod:`dataflow.formats`, one module per format; code ported by changing the import
(``from dataflow.format import LMDBData``) finds them here under the same names.
"""
from .formats.hdf5 import HDF5Data
from .formats.lmdb import CaffeLMDB, LMDBData, LMDBDataDecoder
from .formats.svmlight import SVMLightData

__all__ = ["HDF5Data", "LMDBData", "LMDBDataDecoder", "CaffeLMDB", "SVMLightData"]
