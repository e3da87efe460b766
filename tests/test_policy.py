import functools
import pickle
import subprocess
import sys

import cloudpickle
import numpy as np
import pytest

import dataflow
from dataflow import BatchData, DataFromList, MapData, config
from dataflow.ops import Compose, HWC2CHW, Lambda, Normalize, OneHot, Resize, is_native, native
from dataflow.parallel import policy
from dataflow.parallel.policy import choose_executor, describe_choice


@pytest.fixture(autouse=True)
def _clean_config(monkeypatch):
    config.set_debug_mode(False)
    monkeypatch.setattr(policy, "gil_disabled", lambda: False)
    hang = config.hang_timeout()            # the suite's (conftest)
    yield
    config.set_debug_mode(False)
    config.set_hang_timeout(hang)
    config.set_worker_nice(config.DEFAULT_WORKER_NICE)


def py_fn(dp):
    return dp


@native
def native_fn(dp):
    """doc of native_fn"""
    return dp


NATIVE = [Resize(4, index=0), Normalize(0, 1, index=0)]
MIXED = [Resize(4, index=0), py_fn, HWC2CHW(index=0)]


# -- the table, row by row ------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [None, 0])
@pytest.mark.parametrize("ops", [NATIVE, MIXED, py_fn])
@pytest.mark.parametrize("mp", [False, True])
def test_no_workers_is_serial(workers, ops, mp):
    assert choose_executor(ops, workers, mp) == "serial"
    assert choose_executor(ops, workers, mp, free_threaded=True) == "serial"


@pytest.mark.parametrize("mp", [False, True])
def test_debug_mode_is_serial(mp):
    assert choose_executor(MIXED, 4, mp, debug=True) == "serial"
    assert choose_executor(NATIVE, 4, mp, debug=True, free_threaded=True) == "serial"


def test_debug_none_reads_config():
    assert choose_executor(MIXED, 4, True) == "process"
    config.set_debug_mode(True)
    assert config.debug_mode() is True
    assert choose_executor(MIXED, 4, True) == "serial"
    assert choose_executor(MIXED, 4, True, debug=False) == "process"   # explicit wins
    config.set_debug_mode(False)
    assert choose_executor(MIXED, 4, True) == "process"


def test_free_threaded_runs_python_ops_in_threads():
    assert choose_executor(MIXED, 4, True, free_threaded=True) == "thread"
    assert choose_executor(MIXED, 4, True, free_threaded=False) == "process"


def test_free_threaded_none_uses_probe(monkeypatch):
    monkeypatch.setattr(policy, "gil_disabled", lambda: True)
    assert choose_executor(MIXED, 4, True) == "thread"
    assert "GIL disabled" in describe_choice(MIXED, 4, True)
    monkeypatch.setattr(policy, "gil_disabled", lambda: False)
    assert choose_executor(MIXED, 4, True) == "process"


def test_gil_disabled_probe(monkeypatch):
    monkeypatch.undo()     # the real probe, not the fixture's stub
    monkeypatch.delattr("sys._is_gil_enabled", raising=False)
    assert policy.gil_disabled() is False
    monkeypatch.setattr("sys._is_gil_enabled", lambda: False, raising=False)
    assert policy.gil_disabled() is True
    monkeypatch.setattr("sys._is_gil_enabled", lambda: True, raising=False)
    assert policy.gil_disabled() is False


@pytest.mark.parametrize("mp", [False, True])
def test_all_native_is_thread_whatever_multiprocessing(mp):
    assert choose_executor(NATIVE, 4, mp) == "thread"
    assert choose_executor(native_fn, 1, mp) == "thread"
    assert choose_executor([], 2, mp) == "thread"


def test_python_op_follows_multiprocessing():
    assert choose_executor(MIXED, 4, False) == "thread"
    assert choose_executor(MIXED, 4, True) == "process"
    assert choose_executor(py_fn, 4, True) == "process"
    assert choose_executor(lambda dp: dp, 4, True) == "process"


def test_compose_counts_by_members():
    assert choose_executor(Compose(NATIVE), 4, True) == "thread"
    assert choose_executor(Compose(MIXED), 4, True) == "process"
    assert choose_executor([Compose(NATIVE), native_fn], 4, True) == "thread"
    assert choose_executor([Compose(NATIVE), Compose([py_fn])], 4, True) == "process"
    assert choose_executor(Compose([Compose(NATIVE), Compose([py_fn])]), 4, True) == "process"


def test_describe_choice_names_the_reason():
    assert describe_choice(MIXED, 4, True) == \
        "process: Python op 'py_fn' with python_multiprocessing=True"
    assert describe_choice(MIXED, 4, False) == \
        "thread: Python op 'py_fn' with python_multiprocessing=False"
    assert describe_choice(NATIVE, 4, True) == "thread: all 2 ops are native"
    assert describe_choice(MIXED, None, True) == "serial: num_parallel_workers=None"
    assert describe_choice(MIXED, 3, True, debug=True) == "serial: debug mode is on"
    assert describe_choice([Lambda(py_fn, index=1)], 2, True).startswith("process: Python op "
                                                                       "'py_fn'")
    assert describe_choice([OneHot(3), native(np.sqrt)], 2, True) == \
        "thread: all 2 ops are native"


def test_bad_arguments():
    with pytest.raises(TypeError, match="op #1 is not callable"):
        choose_executor([py_fn, 3], 2, False)
    with pytest.raises(TypeError, match="callable or a list"):
        choose_executor(3, 2, False)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="num_parallel_workers"):
            choose_executor(NATIVE, bad, False)


@pytest.mark.parametrize("bad", ["Auto", -3, 2.5, True])
def test_mapdata_and_batchdata_refuse_a_bad_worker_count(bad):
    # BatchData without per_batch_map ignored any value; MapData's message left out "auto"
    src = DataFromList([[1]])
    with pytest.raises(ValueError, match='MapData: num_parallel_workers must be None, "auto" '
                                         'or an int >= 0'):
        MapData(src, py_fn, num_parallel_workers=bad)
    with pytest.raises(ValueError, match='BatchData: num_parallel_workers must be None, "auto" '
                                         'or an int >= 0'):
        BatchData(src, 1, num_parallel_workers=bad)


@pytest.mark.parametrize("bad", ["yes", "False", None, 1])
def test_mapdata_and_batchdata_refuse_a_multiprocessing_flag_that_is_no_bool(bad):
    # "False" and 1 were taken by their truth, serial maps accepted anything
    src = DataFromList([[1]])
    for make, who in ((lambda: MapData(src, py_fn, python_multiprocessing=bad), "MapData"),
                      (lambda: BatchData(src, 1, python_multiprocessing=bad), "BatchData")):
        with pytest.raises(TypeError, match=f"{who}: python_multiprocessing must be True or "
                                            f"False, got {bad!r}"):
            make()
    assert MapData(src, py_fn, python_multiprocessing=np.bool_(True)).executor == "serial"


@pytest.mark.parametrize("bad", [-1, "x", 1.5])
def test_a_serial_mapdata_checks_max_restarts_as_a_parallel_one(bad):
    with pytest.raises(ValueError, match=f"max_restarts must be an int >= 0, got {bad!r}"):
        MapData(DataFromList([[1]]), py_fn, max_restarts=bad)


def test_a_worker_count_beyond_any_machine_is_refused_when_built():
    # 10**20 was taken, and reset_state() then ran until the system refused a thread
    src = DataFromList([[1]])
    with pytest.raises(ValueError, match=r"MapData: num_parallel_workers .* \(at most 4096\)"):
        MapData(src, py_fn, num_parallel_workers=10 ** 20)
    for make in (lambda: dataflow.MultiThreadMapData(src, 5000, py_fn),
                 lambda: dataflow.MultiProcessMapData(src, 10 ** 6, py_fn)):
        with pytest.raises(ValueError, match="the number of workers must be an int from 1 to "
                                             "4096"):
            make()


@pytest.mark.parametrize("make, name", [
    (lambda: DataFromList([[1]], shuffle="False"), "DataFromList: shuffle"),
    (lambda: BatchData(DataFromList([[1]]), 1, remainder="no"), "BatchData: remainder"),
    (lambda: BatchData(DataFromList([[1]]), 1, use_list="False"), "BatchData: use_list"),
    (lambda: dataflow.MultiThreadMapData(DataFromList([[1]]), 2, py_fn, strict="False"),
     "strict"),
    (lambda: dataflow.MultiProcessMapData(DataFromList([[1]]), 2, py_fn, ordered="yes"),
     "ordered"),
    (lambda: dataflow.BucketBatchData(DataFromList([[1]]), [2], [1, 1], drop_remainder="False"),
     "BucketBatchData: drop_remainder"),
])
def test_a_yes_no_argument_given_as_a_string_is_refused(make, name):
    # "False" is a true string: DataFromList(shuffle="False") shuffled
    with pytest.raises(TypeError, match=f"{name} must be True or False, got"):
        make()


# -- the native marker ----------------------------------------------------------------------------

def test_native_marks_function_in_place():
    assert is_native(native_fn) and not is_native(py_fn)

    def f(x):
        return x
    assert native(f) is f and is_native(f)     # the function itself is marked
    assert native_fn.__name__ == "native_fn" and native_fn.__doc__ == "doc of native_fn"
    assert native_fn([1]) == [1]
    assert policy.is_native is is_native and dataflow.native is native


def test_native_pickles_by_reference_and_by_value():
    assert pickle.loads(pickle.dumps(native_fn)) is native_fn
    f = native(lambda x, y=2: x * y)
    g = cloudpickle.loads(cloudpickle.dumps(f))
    assert is_native(g) and g(3) == 6 and g(3, y=5) == 15


def test_native_wraps_what_cannot_be_marked():
    w = native(np.sqrt)                        # a ufunc: shared, so not marked in place
    assert is_native(w) and not is_native(np.sqrt)
    assert w.__wrapped__ is np.sqrt and w.__name__ == "sqrt"
    assert w(np.float64(9.0)) == 3.0
    w2 = pickle.loads(pickle.dumps(w))
    assert is_native(w2) and w2(np.float64(16.0)) == 4.0

    class Model:
        def predict(self, x):
            return x + 1
    m = native(Model().predict)                # bound methods cannot be marked
    assert is_native(m) and m(1) == 2 and m.__name__ == "predict"
    import inspect
    assert list(inspect.signature(m).parameters) == ["x"]


def test_native_marks_methods_and_classes_and_partials():
    class Op:
        @native
        def __call__(self, x):
            return x

    @native
    class Callable:
        def __call__(self, x):
            return x

    assert is_native(Op().__call__) and is_native(Callable())
    p = functools.partial(py_fn)
    assert native(p) is p and is_native(p) and not is_native(py_fn)

    class Plain:
        def __call__(self, x):
            return x * 2
    obj = Plain()
    w = native(obj)                            # an object is wrapped, not modified
    assert w is not obj and is_native(w) and not is_native(obj) and w(4) == 8
    assert is_native(cloudpickle.loads(cloudpickle.dumps(w)))
    assert is_native(functools.partial(native_fn)) and not is_native(functools.partial(py_fn))
    with pytest.raises(TypeError, match="needs a callable"):
        native(3)


def test_native_on_a_builtin_op_overrides_its_classification():
    class Slow(dataflow.ops.Op):
        def apply(self, x):
            return x
    assert not is_native(Slow())
    assert is_native(native(Slow()))
    assert native(Slow(index=0))([5, 6]) == [5, 6]


# -- config ---------------------------------------------------------------------------------------

def test_config_storage():
    fresh = subprocess.run([sys.executable, "-c", "from dataflow import config; "
                            "print(config.hang_timeout(), config.DEFAULT_HANG_TIMEOUT)"],
                           capture_output=True, text=True, timeout=60)
    assert fresh.stdout.split() == ["300.0", "300.0"], fresh.stderr
    config.set_hang_timeout(12)
    assert config.hang_timeout() == 12.0 and isinstance(config.hang_timeout(), float)
    config.set_hang_timeout(float("inf"))
    assert config.hang_timeout() == float("inf")
    for bad in (0, -1, float("nan"), "5", None, True):
        with pytest.raises(ValueError, match="set_hang_timeout"):
            config.set_hang_timeout(bad)
    with pytest.raises(TypeError):
        config.set_debug_mode(1)
    assert config.worker_nice() == 10
    for ok in (0, 19, 3):
        config.set_worker_nice(ok)
        assert config.worker_nice() == ok
    for bad in (-1, 20, 1.5, "3", None, True):
        with pytest.raises(ValueError, match="set_worker_nice"):
            config.set_worker_nice(bad)
    assert config.worker_nice() == 3
    assert dataflow.config is config
