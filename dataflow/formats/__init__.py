"""On-disk formats that tensorpack reads and writes: one module per format.

Every optional dependency (h5py, lmdb, scikit-learn, ...) is imported when a class that needs
it is used, never when this package is imported.
"""
# --- NumPy, HDF5, SVMlight (issue 16, helper 16) ---
from .npz import NumpySerializer
from .hdf5 import HDF5Data, HDF5Serializer
from .svmlight import SVMLightData

# --- the value codec, LMDB, TFRecord (issue 16, helper 16a) ---
from . import codec
from .lmdb import CaffeLMDB, LMDBData, LMDBDataDecoder, LMDBSerializer
from .tfrecord import TFRecordSerializer
