"""Code written for tensorpack imports from its submodules too (``from
tensorpack.dataflow.parallel_map import MultiThreadMapData``, ``from tensorpack.dataflow.format
import LMDBData``, ``from tensorpack.dataflow.serialize import LMDBSerializer``): after changing
``tensorpack.dataflow`` to ``dataflow``, each such import must find the same public object."""
import importlib
import json

import pytest

import dataflow
from dataflow import dataset, imgaug

from ._tensorpack import run_tensorpack

# tensorpack's module -> its __all__, for every module of tensorpack.dataflow and of its imgaug
# and dataset packages (read in a subprocess: importing tensorpack patches msgpack)
LIST_MODULES = """
import importlib, json, pkgutil
import tensorpack.dataflow as tp
out = {}
def walk(package):
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.endswith("_test"):
            continue
        name = package.__name__ + "." + info.name
        module = importlib.import_module(name)
        out[name] = list(getattr(module, "__all__", []))
        if info.ispkg:
            walk(module)
walk(tp)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def tensorpack_modules():
    modules = json.loads(run_tensorpack(LIST_MODULES, timeout=120).strip().splitlines()[-1])
    assert len(modules) >= 30 and "tensorpack.dataflow.parallel_map" in modules
    return modules


# tensorpack's dataset/__init__ re-exports every global of places.py (which has no __all__),
# its imports included: not API
LEAKED = {"tensorpack.dataflow.dataset": {"RNGDataFlow", "cv2", "logger", "np", "os"}}


def _ours(tp_name):
    """Where ``dataflow`` keeps the public object tensorpack exports as ``tp_name``."""
    return {"imgaug": imgaug, "dataset": dataset}.get(tp_name.split(".")[2], dataflow)


def test_every_tensorpack_dataflow_module_path_imports_with_the_same_names(tensorpack_modules):
    missing = []
    for tp_name, names in sorted(tensorpack_modules.items()):
        ours_name = tp_name.replace("tensorpack.dataflow", "dataflow", 1)
        try:
            module = importlib.import_module(ours_name)
        except ImportError as e:
            missing.append(f"{ours_name}: {e}")
            continue
        home = _ours(tp_name)
        for n in set(names) - LEAKED.get(tp_name, set()):
            if getattr(module, n, None) is not getattr(home, n, object()):
                missing.append(f"{ours_name}.{n}")
    assert not missing


def test_submodule_imports_as_tensorpack_code_writes_them():
    from dataflow.format import CaffeLMDB, HDF5Data, LMDBData, LMDBDataDecoder, SVMLightData
    from dataflow.parallel import MultiThreadPrefetchData, PrefetchData, PrefetchDataZMQ
    from dataflow.parallel_map import MultiProcessMapDataZMQ, MultiThreadMapData
    from dataflow.serialize import HDF5Serializer, LMDBSerializer, NumpySerializer
    from dataflow.serialize import TFRecordSerializer
    assert (LMDBData, HDF5Data, LMDBDataDecoder, CaffeLMDB, SVMLightData) == (
        dataflow.LMDBData, dataflow.HDF5Data, dataflow.LMDBDataDecoder, dataflow.CaffeLMDB,
        dataflow.SVMLightData)
    assert PrefetchDataZMQ is dataflow.MultiProcessRunnerZMQ
    assert PrefetchData is dataflow.MultiProcessRunner
    assert MultiThreadPrefetchData is dataflow.MultiThreadRunner
    assert MultiThreadMapData is dataflow.MultiThreadMapData
    assert MultiProcessMapDataZMQ is dataflow.MultiProcessMapData
    assert (LMDBSerializer, NumpySerializer, TFRecordSerializer, HDF5Serializer) == (
        dataflow.LMDBSerializer, dataflow.NumpySerializer, dataflow.TFRecordSerializer,
        dataflow.HDF5Serializer)


def test_serialize_keeps_its_own_codec_and_reports_unknown_names():
    # dumps/loads of dataflow.serialize are dataflow's codec; the serializers stay out of its
    # __all__, so a star import does not shadow a tensorpack loads the caller imported
    assert "LMDBSerializer" not in dataflow.serialize.__all__
    with pytest.raises(ImportError, match="Nope"):
        from dataflow.serialize import Nope  # noqa: F401
    with pytest.raises(AttributeError, match="dataflow.serialize.*Nope"):
        dataflow.serialize.Nope


def test_names_tensorpack_code_takes_from_modules_outside_their_all():
    # tensorpack's FasterRCNN (an older common.py) subclasses transform.TransformAugmentorBase
    from dataflow.imgaug import transform
    from dataflow.imgaug.base import get_rng as imgaug_get_rng
    from dataflow.imgaug.deform import TransformFactory as deform_factory
    from dataflow.imgaug.meta import TransformFactory as meta_factory
    from dataflow.imgaug.paste import TransformFactory as paste_factory
    from dataflow.base import get_rng as base_get_rng
    from dataflow.common import get_rng as common_get_rng
    assert transform.TransformAugmentorBase is transform.ImageAugmentor is imgaug.ImageAugmentor
    assert deform_factory is meta_factory is paste_factory is imgaug.TransformFactory
    assert imgaug_get_rng is base_get_rng is common_get_rng is dataflow.get_rng


def test_star_import_gives_tensorpacks_names_and_not_our_modules(tensorpack_modules):
    ns = {}
    exec("import json as config, json as common, json as image\nfrom dataflow import *", ns)
    assert ns["config"] is ns["common"] is ns["image"] is json     # a user's own modules stay
    assert ns["MapData"] is dataflow.MapData and ns["imgaug"] is imgaug
    assert ns["dataset"] is dataset and ns["set_seed"] is dataflow.set_seed
    tp_names = {n for name, names in tensorpack_modules.items()
                if name.count(".") == 2 and name.split(".")[2] not in ("imgaug", "dataset")
                for n in names}
    assert tp_names <= set(dataflow.__all__), tp_names - set(dataflow.__all__)
