"""dataflow: composable, tensorpack-compatible DataFlows that run map work in threads or processes.

Import everything from here: ``from dataflow import DataFromList, MapData, BatchData, ...``.
"""
from .base import (DataFlow, DataFlowReentrantGuard, DataFlowTerminated, ProxyDataFlow,
                   RNGDataFlow)
from .rng import get_rng, set_seed
from . import serialize
from . import config, ops
from .ops import native
from .raw import (DataFromGenerator, DataFromIterable, DataFromList, DataFromQueue,
                  FakeData)
from .common import (BatchData, BatchDataByShape, CacheData, ConcatData, FixedSizeData,
                     JoinData, LocallyShuffleData, MapData, MapDataComponent, PrintData,
                     RandomChooseData, RandomMixData, RepeatedData, RepeatedDataPoint,
                     SelectComponent, TestDataSpeed)
from .bucket import BucketBatchData
from .parallel.threads import MultiThreadMapData, MultiThreadRunner
from .parallel.processes import (MultiProcessMapAndBatchData, MultiProcessMapAndBatchDataZMQ,
                                 MultiProcessMapData, MultiProcessMapDataZMQ, MultiProcessRunner,
                                 MultiProcessRunnerZMQ)
from .parallel.runners import (MultiProcessPrefetchData, MultiThreadPrefetchData,  # tensorpack's
                               PrefetchData, PrefetchDataZMQ)                      # older names
from .parallel.ray import RayMapData, RayRunner          # Ray itself is imported on use
from .parallel.shm import SharedMemoryError, shared_empty
from .parallel.supervisor import WorkerCrashedError
from .stats import (enable_stats, format_stats, log_stats, print_stats, reset_stats, stats,
                    stats_enabled)

# --- on-disk formats (issue 16): NumPy, HDF5, SVMlight; optional deps imported on use ---
from .formats.npz import NumpySerializer
from .formats.hdf5 import HDF5Data, HDF5Serializer
from .formats.svmlight import SVMLightData

# --- on-disk formats (issue 16): LMDB, TFRecord; lmdb and crc32c imported on use ---
from .formats.lmdb import CaffeLMDB, LMDBData, LMDBDataDecoder, LMDBSerializer
from .formats.tfrecord import TFRecordSerializer
# what a reader built with allow_pickle=False raises for a pickle value or frame
from .formats.codec import PickleRefusedError

# --- dataset readers (issue 16): `from dataflow import dataset; dataset.Cifar10('train')` ---
from . import dataset

# --- remote dataflows over ZeroMQ (issue 16) ---
from .remote import RemoteDataZMQ, curve_keypair, send_dataflow_zmq

# tensorpack's image dataflows (OpenCV and dataflow.imgaug are imported on use)
from .image import (AugmentImageComponent, AugmentImageComponents, AugmentImageCoordinates,
                    ImageFromFile)

# tensorpack's image augmentors, as ``dataflow.imgaug`` (cheap: OpenCV is imported on first use)
from . import imgaug

# -- list(df) on dataflows of unknown length; resource errors of worker start-up (issue 15) --
from .base import EndlessError, UnknownLengthError
# -- another library's dataflow (tensorpack's) as an input of ours ---------------------------
from .base import ForeignDataFlow
from .parallel.resources import ResourceLimitError

__version__ = "0.1.0"

# ``from dataflow import *`` gives the names above, and ``imgaug`` and ``dataset``, as
# ``from tensorpack.dataflow import *`` does; not this package's modules (``config``, ``common``,
# ``image``, ...), which would replace a user's own modules of those names.
__all__ = sorted(_name for _name, _value in globals().items()
                 if not _name.startswith("_") and type(_value).__name__ != "module")
__all__ += ["dataset", "imgaug"]
