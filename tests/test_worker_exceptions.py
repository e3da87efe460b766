"""A worker's exception reaches the consumer with its own class, args and attributes; the
worker's traceback is its ``__cause__``; ``SystemExit`` in a map function never ends the
consumer's program."""
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import dataflow as D
from dataflow.parallel.protocol import (UnknownWorkerException, WorkerTraceback, pack_exception,
                                      unpack_exception)

pytestmark = [pytest.mark.timeout(60)]


class BadRecord(Exception):
    """An exception whose __init__ takes other arguments than its args: pickle cannot remake it."""

    def __init__(self, code, detail):
        super().__init__(f"record {code}: {detail}")
        self.code = code
        self.detail = detail


class WithLock(Exception):
    def __init__(self, msg):
        super().__init__(msg)
        self.lock = threading.Lock()        # does not pickle
        self.count = 7


def _raising(kind):
    def f(dp):
        if dp[0] == 2:
            if kind == "bad_record":
                raise BadRecord(dp[0], {"field": "x"})
            if kind == "with_lock":
                raise WithLock("locked")
            if kind == "exit":
                sys.exit(3)
            if kind == "ghost":             # a class only the worker can import
                import types
                ghost = sys.modules.setdefault("dataflow_ghost", types.ModuleType("dataflow_ghost"))

                class Ghost(ValueError):
                    pass
                Ghost.__module__, Ghost.__qualname__ = "dataflow_ghost", "Ghost"
                ghost.Ghost = Ghost
                err = Ghost("boo")
                err.extra = 5
                raise err
        return dp
    return f


def _run(executor, kind, start_method=None):
    src = D.DataFromList([[i] for i in range(6)], shuffle=False)
    if executor == "thread":
        df = D.MultiThreadMapData(src, 2, _raising(kind), strict=True)
    else:
        df = D.MultiProcessMapData(src, 2, _raising(kind), strict=True, start_method=start_method)
    with df:
        df.reset_state()
        with pytest.raises(BaseException) as info:
            list(df)
    return info.value


EXECUTORS = [("thread", None), ("process", "fork"), ("process", "spawn"),
             ("process", "forkserver")]


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("executor, start_method", EXECUTORS)
def test_init_with_other_arguments_keeps_class_args_and_attributes(executor, start_method):
    exc = _run(executor, "bad_record", start_method)
    assert type(exc) is BadRecord
    assert exc.args == ("record 2: {'field': 'x'}",)
    assert exc.code == 2 and exc.detail == {"field": "x"}
    if executor == "process":
        assert isinstance(exc.__cause__, WorkerTraceback) and "BadRecord" in exc.__cause__.text
        assert "BadRecord: record 2" in exc.__cause__.text


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("executor, start_method", EXECUTORS[:3])
def test_unpicklable_attributes_are_dropped_with_a_note(executor, start_method):
    exc = _run(executor, "with_lock", start_method)
    assert type(exc) is WithLock and exc.args == ("locked",) and exc.count == 7
    if executor == "process":
        assert not hasattr(exc, "lock")
        assert any("lock" in n and "dropped" in n for n in exc.__notes__), exc.__notes__
        assert isinstance(exc.__cause__, WorkerTraceback)


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("executor, start_method", EXECUTORS[:3])
def test_system_exit_in_a_map_function_is_a_runtime_error(executor, start_method):
    exc = _run(executor, "exit", start_method)
    assert type(exc) is RuntimeError
    assert "SystemExit(3)" in str(exc) and "#2" in str(exc), str(exc)
    if executor == "process":
        assert "SystemExit: 3" in exc.__cause__.text


@pytest.mark.usefixtures("no_leaks")
def test_a_class_the_consumer_cannot_import_becomes_a_named_stand_in():
    exc = _run("process", "ghost", "spawn")
    assert isinstance(exc, UnknownWorkerException) and isinstance(exc, RuntimeError)
    assert type(exc).__name__ == "Ghost" and type(exc).__module__ == "dataflow_ghost"
    assert str(exc) == "dataflow_ghost.Ghost: boo" and exc.extra == 5
    assert isinstance(exc.__cause__, WorkerTraceback)


def test_pack_and_unpack_directly():
    for exc in (KeyError("k"), OSError(2, "No such file", "/x"), BadRecord(1, "d"),
                ValueError(threading.Lock())):
        got = unpack_exception(pack_exception(exc))
        assert type(got) is type(exc)
        if isinstance(exc, OSError):
            assert (got.errno, got.strerror, got.filename) == (2, "No such file", "/x")
        elif isinstance(exc, BadRecord):
            assert (got.code, got.detail, got.args) == (1, "d", exc.args)
        elif isinstance(exc, ValueError):        # an argument that does not pickle: its repr
            assert got.args[0].startswith("<unlocked _thread.lock")
            assert any("repr" in n for n in got.__notes__)


def test_an_exception_class_of_the_main_script_under_spawn(tmp_path):
    script = tmp_path / "main_exc.py"
    script.write_text(textwrap.dedent("""
        import dataflow as D

        class BadRecord(Exception):
            def __init__(self, code, detail):
                super().__init__(f"record {code}")
                self.code, self.detail = code, detail

        def f(dp):
            if dp[0] == 3:
                raise BadRecord(dp[0], "bad")
            return dp

        with D.MultiProcessMapData(D.DataFromList([[i] for i in range(6)], shuffle=False), 2, f,
                                   strict=True, start_method="spawn") as df:
            df.reset_state()
            try:
                list(df)
            except BadRecord as e:
                print(type(e) is BadRecord, e.code, e.detail, e.args)
    """))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=50, cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "True 3 bad ('record 3',)"


MAIN_SCRIPT = """
import dataclasses, sys
from dataflow import DataFromList, MultiProcessMapData

class MyErr(Exception):
    pass

@dataclasses.dataclass
class P:
    x: int

def fails(dp):
    if dp[0] == 3:
        raise MyErr("three")
    return dp

def wraps(dp):
    return [P(dp[0])]

for method in sys.argv[1:]:
    src = DataFromList([[k] for k in range(8)], shuffle=False)
    with MultiProcessMapData(src, 2, fails, strict=True, start_method=method) as df:
        df.reset_state()
        try:
            list(df)
        except MyErr:
            print(method, "caught")
    with MultiProcessMapData(src, 2, wraps, strict=True, start_method=method) as df:
        df.reset_state()
        print(method, all(type(dp[0]) is P for dp in df))
"""


@pytest.mark.timeout(60)
def test_classes_of_the_main_script_come_back_as_themselves_on_every_start_method(tmp_path):
    # a forked worker shares the consumer's __main__: what it names there is pickled by
    # reference (by value, cloudpickle made a new class, and `except MyErr` missed the error)
    script = tmp_path / "main_classes.py"
    script.write_text(MAIN_SCRIPT)
    out = subprocess.run([sys.executable, str(script), "fork", "spawn", "forkserver"],
                         capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["fork", "caught", "fork", "True", "spawn", "caught", "spawn",
                                  "True", "forkserver", "caught", "forkserver", "True"]


class LoadError(Exception):
    pass


class LoadsOnlyHere:
    """A map function that cannot be loaded in another process."""

    def __call__(self, dp):
        return dp

    def __getstate__(self):
        return {"pid": os.getpid()}

    def __setstate__(self, state):
        if os.getpid() != state["pid"]:
            raise LoadError("this map function cannot be loaded in a worker")


@pytest.mark.timeout(60)
def test_a_map_function_that_cannot_be_loaded_in_a_spawned_worker_raises_its_own_error(no_leaks):
    # loaded in the worker's own code, so the failure reaches the consumer with its type and
    # traceback (it failed in multiprocessing's start-up: an exit code and nothing else)
    src = D.DataFromList([[k] for k in range(6)], shuffle=False)
    with D.MultiProcessMapData(src, 2, LoadsOnlyHere(), strict=True,
                               start_method="spawn") as df:
        df.reset_state()
        with pytest.raises(LoadError, match="cannot be loaded in a worker") as info:
            list(df)
    assert isinstance(info.value.__cause__, WorkerTraceback)
    assert "__setstate__" in str(info.value.__cause__)


class NewWantsArguments(Exception):
    def __new__(cls, a, b):
        return super().__new__(cls, a, b)

    def __init__(self, a, b):
        super().__init__(a)
        self.b = b


def test_an_exception_whose_new_wants_other_arguments_keeps_its_class():
    # rebuilt without its __new__ (which wants b too): its class, args and attributes, no
    # stand-in claiming the class cannot be imported
    exc = unpack_exception(pack_exception(NewWantsArguments(1, 2)))
    assert type(exc) is NewWantsArguments and exc.args == (1,) and exc.b == 2
    assert not getattr(exc, "__notes__", None)


@pytest.mark.parametrize("make", [
    lambda f: D.MultiThreadMapData(D.DataFromList([[i] for i in range(3)], shuffle=False), 2, f,
                                   strict=True),
    lambda f: D.MultiThreadRunner(
        lambda: D.MapData(D.DataFromList([[i] for i in range(3)], shuffle=False), f), 1, 1)],
    ids=["MultiThreadMapData", "MultiThreadRunner"])
def test_threads_stop_when_a_dataflow_that_raised_is_dropped_without_close(make):
    # A worker thread kept the WorkerError it had handed over, whose exception, raised in the
    # consumer, held the consumer's frames and the dataflow in them: the dataflow was never
    # collected, so close() never ran and the threads lived on.
    import gc
    import weakref

    def f(dp):
        if dp[0] == 2:
            raise KeyError(dp[0])
        return dp

    before = set(threading.enumerate())
    df = make(f)
    df.reset_state()
    with pytest.raises(KeyError):
        list(df)
    started = set(threading.enumerate()) - before
    assert started, "the dataflow started no thread"
    gone = weakref.ref(df)
    del df
    gc.collect()
    assert gone() is None, "the dataflow was not collected"
    for t in started:
        t.join(timeout=10)
    assert not [t.name for t in started if t.is_alive()]


def test_a_copy_of_a_main_class_comes_back_as_the_scripts_class(monkeypatch):
    # a worker that does not share the script's __main__ (a Ray actor) pickles the class by
    # value: `except MyError` in the script did not catch the copy that came back
    main = type(sys)("__main__")

    class MyError(Exception):
        pass

    MyError.__module__, MyError.__qualname__ = "__main__", "MyError"
    main.MyError = MyError
    copy = type("MyError", (Exception,), {"__module__": "__main__", "__qualname__": "MyError",
                                          "code": None})
    exc = copy("boom")
    exc.code = 7
    monkeypatch.setitem(sys.modules, "__main__", main)
    got = unpack_exception(pack_exception(exc))
    assert type(got) is MyError and got.args == ("boom",) and got.code == 7
