"""The process executor: MultiProcessMapData, the runners and MultiProcessMapAndBatchData.

What every executor shares (strict, ordered, error policies, shutdown) is in test_parallel.py;
here is what only worker processes have: payloads crossing a process boundary and shared memory,
start methods, shipping functions and dataflows, worker crashes, worker random streams, and
resources (processes, fds, mappings, files) across many dataflows.

Functions that run in workers are made inside other functions (see ``_by_value``), so that
cloudpickle ships them by value and a worker never imports this module (and pytest with it):
worker start-up then takes milliseconds, which the cycle test needs.
"""
import collections
import contextlib
import gc
import hashlib
import multiprocessing as mp
import os
import re
import signal
import struct
import sys
import tempfile
import threading
import time
import weakref
import zlib

import numpy as np
import pytest

import dataflow as D
from .conftest import descendants, memfd_mappings

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(30)]

START_METHODS = ["fork", "spawn", "forkserver"]
OUR_FILE_PREFIXES = ("dataflow", "psm_", "wnsm_")


def _our_files():
    found = set()
    for d in ("/dev/shm", tempfile.gettempdir()):
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            continue
        found |= {f"{d}/{n}" for n in names if n.startswith(OUR_FILE_PREFIXES)}
    return found


@pytest.fixture(scope="module", autouse=True)
def files_before_module():
    """/dev/shm and the temporary directory must gain no file of ours during the whole module."""
    before = _our_files()
    yield before
    gc.collect()
    assert _our_files() <= before, f"left behind: {sorted(_our_files() - before)}"


@pytest.fixture(scope="module", autouse=True)
def zmq_send_helper_thread():
    """Source arrays of 64 KiB or more go to the workers without a copy, for which pyzmq starts,
    once per process, a thread that frees them once sent (``zmq.utils.garbage``). Start it up
    front so that it does not count as a leak of the first test that sends such an array."""
    from zmq.utils.garbage import gc as zmq_gc
    assert mapped([[np.zeros(1 << 17, np.uint8)]], lambda dp: [dp[0].size], num_proc=1) == \
        [[1 << 17]]
    assert zmq_gc.is_alive()


def _by_value(factory):
    """Replace ``factory`` by what it returns: a function defined inside another function is
    shipped to workers by value."""
    return factory()


def source(items):
    return D.DataFromList(list(items), shuffle=False)


def numbers(n):
    return source([i] for i in range(n))


def mapped(items, func, num_proc=2, **kw):
    """All datapoints of one strict, ordered pass of ``func`` over ``items`` in processes."""
    kw.setdefault("strict", True)
    kw.setdefault("ordered", True)
    with D.MultiProcessMapData(source(items), num_proc, func, **kw) as df:
        df.reset_state()
        return list(df)


# -- exact comparison ---------------------------------------------------------------------------
def assert_array_identical(got, want, where="array"):
    assert type(got) is np.ndarray, f"{where}: got a {type(got).__name__}"
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
    assert got.tobytes() == want.tobytes(), f"{where}: contents differ"   # bitwise: NaN, -0.0
    assert got.flags.writeable, f"{where}: not writable"
    if want.ndim >= 2 and want.flags.f_contiguous and not want.flags.c_contiguous:
        assert got.flags.f_contiguous, f"{where}: Fortran order lost"


def assert_same(got, want, where="dp"):
    """Equal values of exactly the same types, recursively (floats compared bitwise)."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, np.ndarray):
        assert_array_identical(got, want, where)
    elif isinstance(want, np.generic):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), where
    elif isinstance(want, float):
        assert struct.pack("<d", got) == struct.pack("<d", want), f"{where}: {got!r} != {want!r}"
    elif isinstance(want, complex):
        assert struct.pack("<dd", got.real, got.imag) == struct.pack("<dd", want.real, want.imag)
    elif isinstance(want, dict):
        assert len(got) == len(want), f"{where}: keys {list(got)} != {list(want)}"
        for (gk, gv), (wk, wv) in zip(got.items(), want.items()):
            assert_same(gk, wk, f"{where} key")
            assert_same(gv, wv, f"{where}[{wk!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


# -- 1. payloads --------------------------------------------------------------------------------
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128", ">i4", ">f8", ">c16"]
VARIANTS = ["0d", "empty", "empty3d", "small", "large", "fortran_small", "fortran_large",
            "strided_small", "strided_large", "reversed_large"]


@_by_value
def make_array():
    def values(dtype, n, seed):
        rng = np.random.default_rng(seed)
        dt = np.dtype(dtype)
        native = dt.newbyteorder("=")
        if dt.kind == "b":
            return rng.integers(0, 2, n).astype(bool)
        if dt.kind in "iu":
            info = np.iinfo(native)
            out = rng.integers(info.min, info.max, n, dtype=native, endpoint=True)
            out[:2] = [info.min, info.max][:n]
            return out.astype(dt)
        real = native if dt.kind == "f" else np.dtype(f"f{native.itemsize // 2}")
        info = np.finfo(real)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, info.tiny, info.max, info.min])

        def floats():
            out = (rng.standard_normal(n) * 1000).astype(real)
            k = min(n, len(specials))
            out[:k] = specials[rng.permutation(len(specials))[:k]].astype(real)
            return out
        if dt.kind == "f":
            return floats().astype(dt)
        out = np.empty(n, native)
        out.real, out.imag = floats(), floats()
        return out.astype(dt)

    def make_array(dtype, variant):
        seed = zlib.crc32(f"{dtype}/{variant}".encode())
        if variant == "0d":
            return values(dtype, 1, seed).reshape(())
        if variant == "empty":
            return values(dtype, 0, seed)
        if variant == "empty3d":
            return values(dtype, 0, seed).reshape(3, 0, 2)
        if variant == "small":
            return values(dtype, 15, seed).reshape(3, 5)
        if variant == "large":                   # >= 16 KiB for every dtype: shared memory
            return values(dtype, 64 * 300, seed).reshape(64, 300)
        if variant == "fortran_small":
            return np.asfortranarray(values(dtype, 24, seed).reshape(4, 6))
        if variant == "fortran_large":
            return np.asfortranarray(values(dtype, 64 * 300, seed).reshape(64, 300))
        if variant == "strided_small":
            return values(dtype, 60, seed).reshape(6, 10)[::2, 1::3]
        if variant == "strided_large":
            return values(dtype, 300 * 600, seed).reshape(300, 600)[::2, 1::3]
        if variant == "reversed_large":
            return values(dtype, 40000, seed)[::-1]
        raise AssertionError(variant)
    return make_array


def test_arrays_of_every_numeric_dtype_and_layout_round_trip():
    cases = [(dt, v) for dt in DTYPES for v in VARIANTS]
    sent = {case: make_array(*case) for case in cases}
    assert not sent["int16", "strided_large"].flags.contiguous         # really views
    assert sent["int16", "reversed_large"].strides[0] < 0
    assert sent["int16", "strided_large"].nbytes >= 16 * 1024

    # the worker echoes the array it received and returns the one it built (a view, when the
    # variant is a view); both must equal what this process builds
    out = mapped([[dt, v, sent[dt, v]] for dt, v in cases],
                 lambda dp: [dp[0], dp[1], dp[2], make_array(dp[0], dp[1])])
    assert [(dp[0], dp[1]) for dp in out] == cases
    for (dt, v), (_, _, echoed, built) in zip(cases, out):
        want = make_array(dt, v)
        assert_array_identical(built, want, f"{dt}/{v} built in the worker")
        assert_array_identical(echoed, want, f"{dt}/{v} sent through the worker")
    del out, sent


SIZES = [0, 1, 63, 64, 65, 16 * 1024 - 1, 16 * 1024, 16 * 1024 + 1, 1 << 20, (8 << 20) + 1]


def test_array_sizes_around_every_threshold():
    """Inline vs shared memory (16 KiB), alignment (64 B), one results message (8 MiB); several
    arrays per datapoint, several datapoints per message and a datapoint over a message."""
    def pattern(n, seed):
        return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed) % 251).astype(np.uint8)

    out = mapped([[i] for i in range(len(SIZES))],
                 lambda dp: [dp[0], pattern(SIZES[dp[0]], dp[0]), pattern(3 << 20, dp[0] + 100),
                             pattern(SIZES[-1 - dp[0]], dp[0] + 200)])
    for i, (index, a, b, c) in enumerate(out):
        assert index == i
        assert_array_identical(a, pattern(SIZES[i], i), f"size {SIZES[i]}")
        assert_array_identical(b, pattern(3 << 20, i + 100), "3 MiB")
        assert_array_identical(c, pattern(SIZES[-1 - i], i + 200), f"size {SIZES[-1 - i]}")
    del out


@pytest.mark.timeout(40)
def test_64_mib_each_way():
    n = (64 << 20) // 8

    def big(seed):
        a = np.arange(n, dtype=np.uint64)
        a *= np.uint64(0x9E3779B97F4A7C15)
        a += np.uint64(seed)
        return a

    def work(dp):
        received = hashlib.sha256(dp[1]).hexdigest()
        made = big(dp[0])
        return [received, made, hashlib.sha256(made).hexdigest()]

    sent = big(7)
    sent_digest = hashlib.sha256(sent).hexdigest()
    [(received, made, made_digest)] = mapped([[11, sent]], work, num_proc=1)
    del sent
    assert received == sent_digest
    assert type(made) is np.ndarray and made.dtype == np.uint64 and made.shape == (n,)
    assert made.nbytes == 64 << 20 and made.flags.writeable
    mult, seed = np.uint64(0x9E3779B97F4A7C15), np.uint64(11)
    for start in (0, 1, n // 3, n // 2 - 1, n - 5):
        idx = np.arange(start, start + 5, dtype=np.uint64)
        assert (made[start:start + 5] == idx * mult + seed).all(), start
    assert hashlib.sha256(made).hexdigest() == made_digest
    del made


@_by_value
def nested_value():
    def nested_value(i):
        return {
            "i": i, "neg": -i - 1, "zero": 0,
            "ints": [2**63 - 1, 2**63, 2**64 - 1, 2**64 + i, -2**63, -2**63 - 1 - i,
                     10**40 * (i + 1), -(10**40) * (i + 1)],
            "floats": [1.5 * i, -0.0, float("inf"), float("-inf"), float("nan"), 5e-324],
            "complex": complex(i, -1.5),
            "str": ["", f"ünï©ødé {i} 🙂", "\x00nul\x00"],
            "bytes": [b"", bytes(range(256)), b"\x00" * i],
            "none": None, "bools": (True, False), "bool_list": [False, True, True],
            "tuple": (i, (i + 1, [i + 2, (i + 3,)]), ()),
            "empty": [[], [[]], [{}], {}, ()],
            "keys": {i: "int", -2**70: "big int", 1.25: "float", (i, "t"): "tuple",
                     b"k": "bytes", None: "none"},
        }
    return nested_value


def test_python_values_keep_value_and_type():
    def shape(i):
        v = nested_value(i)
        return [v, i] if i % 3 == 0 else (v, i) if i % 3 == 1 else {"v": v, "i": i}
    out = mapped([[i] for i in range(12)], lambda dp: shape(dp[0]))
    for i, dp in enumerate(out):
        assert_same(dp, shape(i), f"datapoint {i}")


@_by_value
def numpy_scalars():
    def numpy_scalars(i):
        return [np.bool_(i % 2 == 0), np.int8(-128 + i), np.int16(-i), np.int32(2**31 - 1 - i),
                np.int64(-2**63 + i), np.uint8(255 - i), np.uint16(i), np.uint32(2**32 - 1),
                np.uint64(2**64 - 1 - i), np.float16(1.5 + i), np.float32(-0.0),
                np.float64(float("nan")), np.float64(i / 3), np.complex64(1 + 2j * i),
                np.complex128(complex(i, float("inf")))]
    return numpy_scalars


def test_numpy_scalars_keep_their_type():
    out = mapped([[i] for i in range(6)], lambda dp: numpy_scalars(dp[0]))
    for i, dp in enumerate(out):
        assert_same(dp, numpy_scalars(i), f"datapoint {i}")
        assert type(dp[-3]) is np.float64 and type(dp[0]) is np.bool_


# -- 2. received arrays -------------------------------------------------------------------------
def test_results_are_writable_plain_ndarrays_that_outlive_the_dataflow():
    baseline = memfd_mappings()

    def f(dp):
        i = dp[0]
        shared = D.shared_empty((32, 64), np.float64)
        shared[...] = i
        return {"inline": np.full(7, i, np.int32), "shared_memory": np.full((100, 100), i, np.int16),
                "fortran": np.asfortranarray(np.full((90, 70), i, np.float32)),
                "zero_d": np.array(i, np.uint8), "shared_empty": shared}

    with D.MultiProcessMapData(numbers(20), 2, f, strict=True, ordered=True) as df:
        df.reset_state()
        out = list(df)
        assert memfd_mappings() > baseline              # large arrays really are shared memory
    # the workers are gone; the arrays stay valid, and are ours to change
    for i, dp in enumerate(out):
        for key, a in dp.items():
            assert type(a) is np.ndarray and a.flags.writeable, key
            assert (a == i).all(), key
            a[...] = 100 + i
    for i, dp in enumerate(out):                  # each write stayed in its own array
        assert all((a == 100 + i).all() for a in dp.values())
    del out, dp, a
    gc.collect()
    assert memfd_mappings() == baseline


# -- 3. many results alive at once --------------------------------------------------------------
@_by_value
def row_pattern():
    def row_pattern(i):
        return ((np.arange(64 * 1024, dtype=np.uint32) + i * 7919) % 251).astype(np.uint8) \
            .reshape(64, 1024)
    return row_pattern


@pytest.mark.timeout(30)
def test_many_results_kept_alive_are_never_overwritten():
    n = 400
    expected = [row_pattern(i) for i in range(n)]

    def check(dps):
        assert sorted(dp[1] for dp in dps) == list(range(n))
        for a, i in dps:
            assert type(a) is np.ndarray and a.shape == (64, 1024) and a.dtype == np.uint8
            assert np.array_equal(a, expected[i]), f"datapoint {i} was overwritten"

    with D.MultiProcessMapData(numbers(n), 2, lambda dp: [row_pattern(dp[0]), dp[0]],
                               buffer_size=16, strict=True) as df:
        df.reset_state()
        kept = list(df)                 # every one held until the end of the pass
        check(kept)
        for a, _ in kept:
            a[...] = 0xEE               # scribble: nothing of it may show up later
        del kept, a
        kept = list(df)                 # the segments are handed back and reused
        check(kept)
        del kept
        # keep a one-row view of a few datapoints only: their segments must stay theirs while
        # the others are released and reused, in this pass and the next
        rows = [(dp[0][5], dp[1]) for dp in df if dp[1] % 50 == 0]
        check(list(df))
        assert sorted(i for _, i in rows) == list(range(0, n, 50))
        for row, i in rows:
            assert np.array_equal(row, expected[i][5]), f"row of datapoint {i} was overwritten"
        del rows, row


@pytest.mark.timeout(30)
def test_results_held_beyond_the_shared_memory_budget():
    """The consumer holds more than all workers' shared-memory budgets together: the pool must
    grow rather than the pipeline stall, and nothing still held may be written over."""
    from dataflow.parallel import processes
    budget = getattr(processes, "SHM_BUDGET", 64 << 20)
    n = 2 * budget // (1 << 20) + 32               # 1 MiB results, two workers

    def f(dp):
        a = np.full((1024, 1024), dp[0] % 251, np.uint8)
        a[0, :8] = np.frombuffer(np.int64(dp[0]).tobytes(), np.uint8)
        return [a, dp[0]]

    with D.MultiProcessMapData(numbers(n), 2, f, strict=True) as df:
        df.reset_state()
        for _ in range(2):
            kept = list(df)
            assert sorted(i for _, i in kept) == list(range(n))
            for a, i in kept:
                assert a[0, :8].view(np.int64)[0] == i, f"datapoint {i} was overwritten"
                assert (a[1:] == i % 251).all(), f"datapoint {i} was overwritten"
            del kept, a


@pytest.mark.timeout(30)
def test_pool_stays_near_the_budget_when_results_are_dropped():
    """A consumer that drops each result: segments go back to their worker as soon as they are
    free (not only with its next task), so the pool stays small, and hot, however much data
    flows through it."""
    from dataflow.parallel import processes
    n, size = 300, 4 << 20                         # 1.2 GB through two workers

    def f(dp):
        return np.full(size // 4, float(dp[0]), np.float32)

    with D.MultiProcessMapData(numbers(n), 2, f) as df:
        df.reset_state()
        seen = 0
        for a in df:
            assert a[0] == a[-1]
            seen += 1
        del a
        assert seen == n
        pools = [w["pool_bytes"] for w in D.stats(df)["parallel"]["worker_stats"]]
    assert len(pools) == 2 and max(pools) > 0
    for pool in pools:
        # 0 for a worker that got no work (a CI rehearsal with two suites on the 2 cores once
        # started the second worker after the first had taken all 300 datapoints)
        assert pool <= processes.SHM_BUDGET + 4 * size, pools


def test_results_of_one_chunk_split_across_messages_arrive_whole_and_in_order():
    """The results of a chunk whose arrays pass the message size go in several messages; a
    datapoint is never split, and one larger than a message travels on its own."""
    import socket
    from dataflow.parallel import transport
    from dataflow.parallel.mapper import OK
    from dataflow.parallel.shm import SegmentPool, SegmentReader
    big = transport.MESSAGE_BYTES // 3 + 1         # two fit in a message, three do not
    sizes = [big, big, big, 10, transport.MESSAGE_BYTES + 5, big, 3]
    results = [(i, OK, [np.full(size, i, np.uint8), i]) for i, size in enumerate(sizes)]
    mine, theirs = socket.socketpair()
    with mine, theirs:
        frames = transport.encode_results(results, {i: i for i in range(len(sizes))}, 0.0,
                                          SegmentPool(theirs), "f")
        reader = SegmentReader(0, mine, collections.deque())
        decoded = [transport.decode_results(frame, reader)[0] for frame in frames]
        # [big, big] [big, 10] [too big for any] [big, 3]
        assert [[seq for seq, _, _ in msg] for msg in decoded] == [[0, 1], [2, 3], [4], [5, 6]]
        for seq, kind, (a, i) in (r for msg in decoded for r in msg):
            assert kind == OK and i == seq and a.size == sizes[seq] and (a == seq).all()
        del decoded, a
        reader.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux-only")
def test_zeromq_io_thread_runs_as_batch():
    """Waking ZeroMQ's I/O thread for each message must not preempt the sender (see
    transport.make_context)."""
    from dataflow.parallel import transport
    if not transport._can_run_threads_as_batch():
        pytest.skip("this system does not let a thread switch to SCHED_BATCH")

    def io_threads():
        out = set()
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    if f.read().startswith("ZMQbg/IO"):
                        out.add(int(tid))
            except FileNotFoundError:
                pass
        return out

    before = io_threads()
    context = transport.make_context()
    endpoints = transport.Endpoints()
    a, b = transport.make_socket(context), transport.make_socket(context)
    try:
        a.bind(endpoints("batch-test"))
        b.connect(endpoints("batch-test"))
        b.send(b"ping")                 # once through, the I/O thread is up and named
        assert a.recv() == b"ping"
        new = io_threads() - before
        assert len(new) == 1
        assert os.sched_getscheduler(new.pop()) == os.SCHED_BATCH
    finally:
        a.close()
        b.close()
        context.term()
        endpoints.remove()


# -- 4. shared_empty ----------------------------------------------------------------------------
def shared_of_shape(dp):
    return [D.shared_empty(dp[0])]


@pytest.mark.parametrize("shape, error, match", [
    # inside a worker a negative shape gave an empty array (numpy.empty refuses it), and one
    # beyond memory reserved its blocks until the kernel's OOM killer ended the worker
    ((2, -3), ValueError, r"negative dimensions are not allowed, got shape \(2, -3\)"),
    ((10**6, 10**6), MemoryError, "could not reserve .* bytes of shared memory for a result "
                                  r"\(more than the memory available\)"),
])
def test_shared_empty_in_a_worker_refuses_what_numpy_empty_refuses(shape, error, match):
    with D.MultiProcessMapData(D.DataFromList([[shape]], shuffle=False), 1, shared_of_shape,
                               strict=True) as df:
        df.reset_state()
        with pytest.raises(error, match=match):
            list(df)


def test_shared_empty_in_a_worker():
    def f(dp):
        i = dp[0]
        a = D.shared_empty((128, 256), np.float32)
        a[...] = np.arange(256, dtype=np.float32) + i
        b = D.shared_empty((40000,))
        b[:] = i
        small = D.shared_empty((3,), np.int64)
        small[:] = i
        unused = D.shared_empty((64, 1024), np.uint8)      # allocated, not returned
        unused[...] = 1
        return [i, a, b[:30000], b[1:], a.T, a[::2], small, D.shared_empty((0, 4), np.int8),
                b.dtype.str]

    def check(dps):
        for i, (index, a, head, tail, at, every_other, small, empty, b_dtype) in enumerate(dps):
            assert index == i and b_dtype == np.dtype(float).str
            want = np.broadcast_to(np.arange(256, dtype=np.float32) + i, (128, 256))
            assert_array_identical(a, np.ascontiguousarray(want))
            assert_array_identical(head, np.full(30000, i, float))
            assert_array_identical(tail, np.full(39999, i, float))
            assert_array_identical(at, np.asfortranarray(want.T))
            assert_array_identical(every_other, np.ascontiguousarray(want[::2]))
            assert_array_identical(small, np.full(3, i, np.int64))
            assert_array_identical(empty, np.zeros((0, 4), np.int8))

    with D.MultiProcessMapData(numbers(60), 2, f, buffer_size=8, strict=True,
                               ordered=True) as df:
        df.reset_state()
        kept = list(df)
        check(kept)
        del kept
        check(list(df))


def test_arrays_the_worker_keeps_are_copied_not_lent():
    """A map function that keeps its results and writes to them later (a reused output buffer,
    a cache) must not change what the consumer holds, whether the array came from shared_empty
    or from an ordinary numpy call that the worker's allocator put in shared memory."""
    n = 40

    @_by_value
    def keeper():
        kept = []

        def f(dp):
            i = dp[0]
            if kept and i <= kept[-1][1]:           # a new pass: scribble on the last one's
                for a, _ in kept:
                    a[...] = -1
                kept.clear()
            a = D.shared_empty(1 << 18, np.float32) if i % 2 else np.empty(1 << 18, np.float32)
            a[...] = i
            kept.append((a, i))
            return [a, i]
        return f

    with D.MultiProcessMapData(numbers(n), 1, keeper, buffer_size=8, strict=True,
                               ordered=True) as df:
        df.reset_state()
        first = list(df)
        second = list(df)                           # its first call scribbles on the first's
        for got in (first, second):
            assert [i for _, i in got] == list(range(n))
            for a, i in got:
                assert (a == i).all(), f"datapoint {i} was written over by its worker"
        del first, second, got, a


def test_large_results_are_made_in_shared_memory_in_the_worker(monkeypatch):
    """With the switch on, the map function's numpy allocations are made in shared memory and
    its results arrive intact, sent in place; a process forked inside the map function allocates
    as usual. The switch is forced on (the patch reaches forked workers): whether it pays is the
    trial's decision, tested on its own, and the benchmark's to measure."""
    from dataflow.parallel import allocator
    if not allocator.available():
        pytest.skip("this numpy has no memory-handler API (numpy < 1.22)")
    monkeypatch.setattr(allocator.ZeroCopySwitch, "observe",
                        lambda self, datapoints, array_bytes: setattr(self, "on", True))

    @_by_value
    def f():
        def handler_name():
            try:
                from numpy._core.multiarray import get_handler_name
            except ImportError:
                from numpy.core.multiarray import get_handler_name
            return get_handler_name()

        def f(dp):
            i = dp[0]
            a = np.full((512, 1024), i, np.float32)          # 2 MiB
            child = None
            if i % 25 == 0:            # what a process forked here allocates with
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.write(w, handler_name().encode())
                    os._exit(0)
                os.close(w)
                os.waitpid(pid, 0)
                child = os.read(r, 100).decode()
                os.close(r)
            return [a, i, handler_name(), child]
        return f

    names, children, seen = collections.Counter(), set(), []
    with D.MultiProcessMapData(numbers(400), 1, f, strict=True, ordered=True,
                               start_method="fork") as df:
        df.reset_state()
        for a, i, name, child in df:
            assert a.shape == (512, 1024) and (a == i).all()
            seen.append(i)
            names[name] += 1
            children.add(child)
        del a
    assert seen == list(range(400))
    assert names["dataflow_shared_memory"] == 399, names    # all but the first chunk
    assert children - {None} == {"default_allocator"}


def test_allocator_serves_large_allocations_from_the_pool():
    """The NumPy handler, in this process: malloc, calloc and realloc of 256 KiB or more come
    from segments of the pool, smaller ones from the heap; freeing only queues the address, and
    the pool takes the segment back before its next allocation."""
    import socket
    from dataflow.parallel import allocator
    from dataflow.parallel.shm import SegmentPool
    if not allocator.available():
        pytest.skip("this numpy has no memory-handler API (numpy < 1.22)")
    mine, theirs = socket.socketpair()
    with mine, theirs:
        pool = SegmentPool(theirs)
        active = allocator.allocating_in(pool)
        assert active is not None
        with active():
            big = np.full(1 << 18, 7, np.float32)                 # 1 MiB: malloc
            zeros = np.zeros(1 << 18, np.float32)                 # calloc
            grown = np.full(1 << 16, 3, np.float32)               # 256 KiB, then realloc
            before_realloc = grown.ctypes.data
            grown.resize(1 << 18, refcheck=False)
            small = np.full(1000, 1.0)
            huge = np.empty(allocator.MAX_BYTES + 1, np.uint8)   # left to the heap
        assert big.ctypes.data in pool.lent and zeros.ctypes.data in pool.lent
        assert grown.ctypes.data in pool.lent and small.ctypes.data not in pool.lent
        assert huge.ctypes.data not in pool.lent
        del huge
        assert (big == 7).all() and (zeros == 0).all() and (grown[:1 << 16] == 3).all()
        assert list(pool.freed) == [before_realloc]   # given back by realloc, not yet taken
        addresses = {big.ctypes.data, zeros.ctypes.data, grown.ctypes.data}
        del big, zeros, grown, small
        assert set(pool.freed) >= addresses
        pool._take_back()
        assert not pool.lent and not pool.freed
        assert all(not seg.held_here and not seg.with_consumer
                   for seg in pool._segments.values())
        for seg in pool._segments.values():      # a worker's pool lives as long as the worker
            seg.mm.close()


def test_zero_copy_switch_trial():
    from dataflow.parallel.allocator import LARGE_RESULT, ZeroCopySwitch
    clock = [0.0]

    class Switch(ZeroCopySwitch):
        WARM_UP, TRIAL_CHUNKS, TRIAL_SECONDS = 1, 1, 0.0

        @staticmethod
        def clock():
            return clock[0]

    sw = Switch(pool=None)
    sw._active = lambda: contextlib.nullcontext()      # no real allocator needed here

    def chunk(sw, seconds):
        with sw.chunk():
            used = sw._used
            clock[0] += seconds(used)
        sw.observe(1, LARGE_RESULT)
        return used

    for _ in range(5):                     # small results: never tried
        with sw.chunk():
            pass
        sw.observe(10, 10 * 1000)
        assert not sw.on
    sw.observe(10, 10 * LARGE_RESULT)              # large: the trial starts, on first
    used = [chunk(sw, lambda on: 0.001 if on else 0.002) for _ in range(4)]
    assert used == [True, False, True, False]              # alternating, one warm-up each
    assert sw.on                                           # on was cheaper: kept
    sw = Switch(pool=None)
    sw._active = lambda: contextlib.nullcontext()
    sw.observe(1, LARGE_RESULT)
    for _ in range(4):
        chunk(sw, lambda on: 0.003 if on else 0.002)
    assert not sw.on                                       # off was cheaper
    for _ in range(3):                                     # and it stays off until a retry
        assert not chunk(sw, lambda on: 0.001)
    assert not sw.on


def test_shared_empty_outside_a_worker_is_numpy_empty():
    before = memfd_mappings()
    a = D.shared_empty((3, 4), np.int16)
    assert type(a) is np.ndarray and a.shape == (3, 4) and a.dtype == np.int16
    assert a.flags.c_contiguous and a.flags.writeable and a.flags.owndata
    b = D.shared_empty(5)
    assert b.dtype == np.empty(5).dtype and b.shape == (5,)
    assert memfd_mappings() == before
    # in a thread worker too
    with D.MultiThreadMapData(numbers(4), 2, lambda dp: [D.shared_empty((2, 2), np.uint8)],
                              strict=True) as df:
        df.reset_state()
        out = list(df)
    assert all(dp[0].flags.owndata and dp[0].shape == (2, 2) for dp in out)
    assert memfd_mappings() == before
    del a, b, out


# -- 5. start methods ---------------------------------------------------------------------------
def thread_niceness(dp):
    """[[thread name, nice], ...] of the threads of the calling process (Linux)."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                nice = int(f.read().rsplit(")", 1)[1].split()[16])
        except FileNotFoundError:      # a thread that just ended
            continue
        out.append([name, nice])
    return [os.nice(0), out]


@pytest.mark.skipif(not hasattr(os, "nice"), reason="os.nice is POSIX-only")
@pytest.mark.parametrize("method", START_METHODS)
def test_workers_run_at_a_lower_priority_than_the_consumer(method):
    """dataflow.config.set_worker_nice: workers started afterwards lower their priority by that
    much (default 10); 0 keeps the consumer's. On Linux, where niceness is per thread, a
    worker's ZeroMQ I/O thread keeps the consumer's priority, to send results at once."""
    if method not in mp.get_all_start_methods():
        pytest.skip(f"{method} is not available here")
    linux = sys.platform.startswith("linux")
    mine = os.nice(0)
    try:
        for increment in (D.config.DEFAULT_WORKER_NICE, 0, 3):
            D.config.set_worker_nice(increment)
            with D.MultiProcessMapData(numbers(6), 2, thread_niceness if linux else
                                       lambda dp: [os.nice(0)], strict=True,
                                       start_method=method) as df:
                df.reset_state()
                out = list(df)
            assert {dp[0] for dp in out} == {min(19, mine + increment)}, increment
            if linux:
                io = {nice for dp in out for name, nice in dp[1] if name.startswith("ZMQbg/IO")}
                assert io == {mine}, (increment, out[0][1])
    finally:
        D.config.set_worker_nice(D.config.DEFAULT_WORKER_NICE)


@pytest.mark.parametrize("methods, chosen, threads, expected", [
    (["fork", "spawn", "forkserver"], None, 1, "fork"),            # Linux, as tensorpack
    (["fork", "spawn", "forkserver"], None, 2, "forkserver"),      # a thread runs: no fork
    (["fork", "spawn", "forkserver"], "fork", 2, "forkserver"),    # a default looked up
    (["fork", "spawn", "forkserver"], "spawn", 1, "spawn"),        # mp.set_start_method
    (["spawn", "fork", "forkserver"], None, 1, "spawn"),           # macOS: fork is unsafe
    (["spawn"], None, 1, "spawn"),                                  # Windows
])
def test_default_start_method(monkeypatch, methods, chosen, threads, expected):
    # MapData (which has no start_method) forked on macOS, and ignored mp.set_start_method
    from dataflow.parallel import start
    monkeypatch.setattr(start.mp, "get_all_start_methods", lambda: list(methods))
    monkeypatch.setattr(start.mp, "get_start_method", lambda allow_none=False: chosen)
    monkeypatch.setattr(start.threading, "active_count", lambda: threads)
    monkeypatch.setattr(start, "_only_fork_safe_threads", lambda: threads == 1)
    assert start.default_start_method() == expected


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is Linux's default")
def test_pyzmqs_garbage_collector_thread_does_not_stop_forking():
    # pyzmq starts it, once per process, to free large messages sent without a copy (a large
    # source array sent to a worker); every later pipeline used to start through the fork server
    from zmq.utils.garbage import gc as zmq_gc
    from dataflow.parallel import start
    with D.MultiProcessMapData(D.DataFromList([[np.zeros(1 << 17, np.uint8)]]), 1,
                               lambda dp: [dp[0].size], strict=True) as df:
        df.reset_state()
        assert list(df) == [[1 << 17]]
    assert zmq_gc.is_alive()
    if threading.active_count() != 2:
        pytest.fail(f"other threads run: {[t.name for t in threading.enumerate()]}")
    assert start.default_start_method() == "fork"
    leave = threading.Event()
    t = threading.Thread(target=leave.wait, args=(10,))
    t.start()
    try:
        assert start.default_start_method() == "forkserver"    # any other thread still counts
    finally:
        leave.set()
        t.join(10)


def test_spawns_of_other_threads_keep_their_main_module():
    # our workers start without the main module; multiprocessing's function that leaves it out
    # was swapped in for everyone meanwhile, and another thread's spawned process could not
    # find the functions of its __main__ (3 of 33 failed in one run)
    import multiprocessing.spawn as mp_spawn
    from dataflow.parallel import start
    main_keys = {"init_main_from_path", "init_main_from_name"}
    assert main_keys & set(mp_spawn.get_preparation_data("t")), "no main module to compare"
    inside, leave = threading.Event(), threading.Event()
    seen = []

    def starting_ours():
        with start._without_main_module("spawn"):
            seen.append(set(mp_spawn.get_preparation_data("t")))
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=starting_ours)
    t.start()
    try:
        assert inside.wait(10)
        assert main_keys & set(mp_spawn.get_preparation_data("t"))
    finally:
        leave.set()
        t.join(10)
    assert not main_keys & seen[0]


@pytest.mark.parametrize("method", START_METHODS)
def test_start_methods_ship_lambdas_and_closures(method):
    if method not in mp.get_all_start_methods():
        pytest.skip(f"{method} is not available here")
    offset = 1000
    table = np.arange(10) * 3

    def closure(dp):
        return [dp[0] + offset, int(table[dp[0]]), os.getppid(),
                np.full(8192, dp[0], np.float32)]          # 32 KiB: shared memory

    with D.MultiProcessMapData(numbers(10), 2, closure, strict=True, ordered=True,
                               start_method=method) as df:
        assert df.executor == "process" and df.start_method == method
        df.reset_state()
        for _ in range(2):
            out = list(df)
            assert [dp[:2] for dp in out] == [[i + offset, 3 * i] for i in range(10)]
            assert all((dp[3] == i).all() for i, dp in enumerate(out))
            parents = {dp[2] for dp in out}
            # the start method is really used: fork and spawn make children of this process,
            # the fork server makes its own
            if method == "forkserver":
                assert os.getpid() not in parents
            else:
                assert parents == {os.getpid()}
    with D.MultiProcessMapData(numbers(10), 2, lambda dp: [dp[0] * 2], strict=True,
                               ordered=True, start_method=method) as df:
        df.reset_state()
        assert list(df) == [[2 * i] for i in range(10)]
    del out


@pytest.mark.parametrize("method", START_METHODS)
def test_map_function_that_cannot_be_pickled(method):
    lock = threading.Lock()
    f = lambda dp: [dp[0], lock.locked()]      # noqa: E731
    with D.MultiProcessMapData(numbers(5), 2, f, strict=True, ordered=True,
                               start_method=method) as df:
        if method == "fork":                   # inherited, never pickled
            df.reset_state()
            assert list(df) == [[i, False] for i in range(5)]
        else:
            with pytest.raises(TypeError, match="cannot be sent to worker processes") as info:
                df.reset_state()
            assert "lock" in str(info.value)
            # a note says why it was pickled and the ways out
            note, = info.value.__notes__
            assert f"start_method={method!r} starts workers as new processes" in note
            assert "start_method='fork'" in note and "chosen because" not in note
            del info


def test_an_unpicklable_map_function_under_the_default_method_says_why_it_was_pickled():
    lock = threading.Lock()
    f = lambda dp: [dp[0], lock.locked()]      # noqa: E731
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)  # another thread: fork is not chosen
    other.start()
    try:
        with D.MultiProcessMapData(numbers(3), 2, f, strict=True) as df:
            with pytest.raises(TypeError, match="cannot be sent to worker processes") as info:
                df.reset_state()
            note, = info.value.__notes__
            assert ("chosen because other threads run in this process" in note) == \
                (mp.get_all_start_methods()[0] == "fork")
            del info
    finally:
        stop.set()
        other.join()


def test_a_runner_whose_dataflow_cannot_be_pickled_names_the_dataflow():
    # the message named the runner's internal OwnCopy object
    def gen():
        yield [1]
    with D.MultiProcessRunnerZMQ(D.DataFromGenerator(gen()), 1, start_method="spawn") as df:
        with pytest.raises(TypeError, match=r"the dataflow <dataflow.raw.DataFromGenerator "
                                            r"object .*> cannot be sent to worker processes: "
                                            r".*generator"):
            df.reset_state()


@pytest.mark.parametrize("make", [
    lambda m: D.MultiProcessMapData(numbers(3), 2, lambda dp: dp, start_method=m),
    lambda m: D.MultiProcessRunnerZMQ(numbers(3), 2, start_method=m),
    lambda m: D.MultiProcessMapAndBatchData(numbers(4), 2, lambda dp: dp, 2, start_method=m),
], ids=["map", "runner", "map_and_batch"])
def test_invalid_start_method_raises_value_error(make):
    df = None
    with pytest.raises(ValueError, match="start_method"):
        df = make("threads")
        df.reset_state()
    if df is not None:
        df.close()


# -- 6. what cannot be serialised ---------------------------------------------------------------
# (anything that pickles crosses: see test_pickle_path.py; a lock does not pickle)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("bad", ["lock", "object"])
def test_unserialisable_result_names_datapoint_and_type(bad, on_error):
    def f(dp):
        if dp[0] != 3:      # its neighbours hand objects to the message's one pickle
            return [dp[0], {"tags": {dp[0]}}]
        class Opaque:                                   # noqa: E306
            def __init__(self):
                self.lock = threading.Lock()
        return [dp[0], {"mask": threading.Lock() if bad == "lock" else Opaque()}]

    got = []
    with D.MultiProcessMapData(numbers(8), 2, f, strict=True, ordered=True,
                               on_error=on_error) as df:
        df.reset_state()
        with pytest.raises(TypeError) as info:
            for dp in df:
                got.append(dp[0])
    assert got == [0, 1, 2]
    msg = str(info.value)
    assert "#3" in msg and ("'lock'" if bad == "lock" else "'Opaque'") in msg, msg
    del info


@pytest.mark.parametrize("bad", ["lock", "object"])
def test_unserialisable_source_datapoint_names_its_index(bad):
    class Opaque:
        def __init__(self):
            self.lock = threading.Lock()
    items = [[i] for i in range(8)]
    items[4] = [4, threading.Lock() if bad == "lock" else Opaque()]
    with D.MultiProcessMapData(source(items), 2, lambda dp: dp, strict=True) as df:
        df.reset_state()
        with pytest.raises(TypeError) as info:
            list(df)
    msg = str(info.value)
    assert "#4" in msg and "source" in msg, msg
    assert ("'lock'" if bad == "lock" else "'Opaque'") in msg, msg
    del info


class FirstPassHasAnUnsendableDatapoint(D.DataFlow):
    def __init__(self, n):
        self.n, self.passes = n, 0

    def __len__(self):
        return self.n

    def __iter__(self):
        self.passes += 1
        for i in range(self.n):
            yield [i, threading.Lock()] if self.passes == 1 and i == 4 else [i]


@pytest.mark.timeout(20)
def test_pass_after_an_unsendable_source_datapoint():
    ds = FirstPassHasAnUnsendableDatapoint(8)
    df = D.MultiProcessMapData(ds, 2, lambda dp: dp, strict=True, buffer_size=1)
    t = None
    try:
        df.reset_state()
        with pytest.raises(TypeError, match="#4"):
            list(df)
        outcome = []

        def second_pass():
            try:
                outcome.append(sorted(dp[0] for dp in df))
            except RuntimeError as e:       # closed while hung
                outcome.append(e)
        t = threading.Thread(target=second_pass, daemon=True)
        t.start()
        t.join(3)               # bounded: a correct second pass takes milliseconds
        assert not t.is_alive(), "the second pass hangs"
        assert outcome == [list(range(8))]
    finally:
        df.close()              # wakes a hung pass: it leaves with RuntimeError
        if t is not None:
            t.join(5)


# -- 7. threads and processes in one interpreter ------------------------------------------------
@pytest.mark.parametrize("method", [None, "fork"])
def test_process_map_over_thread_map(method):
    inner = D.MultiThreadMapData(numbers(200), 2, lambda dp: [dp[0] * 3], strict=True)
    with D.MultiProcessMapData(inner, 2, lambda dp: [dp[0] + 1, os.getpid()], strict=True,
                               start_method=method) as df:
        df.reset_state()
        for _ in range(2):
            out = list(df)
            assert sorted(dp[0] for dp in out) == [3 * i + 1 for i in range(200)]
            assert os.getpid() not in {dp[1] for dp in out}
    inner.close()


def test_thread_map_over_process_map():
    inner = D.MultiProcessMapData(numbers(200), 2, lambda dp: [dp[0] * 3, os.getpid()],
                                  strict=True)
    with D.MultiThreadMapData(inner, 2, lambda dp: [dp[0] + 1, dp[1]], strict=True) as df:
        df.reset_state()
        for _ in range(2):
            out = list(df)
            assert sorted(dp[0] for dp in out) == [3 * i + 1 for i in range(200)]
            assert os.getpid() not in {dp[1] for dp in out}
    inner.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("method", [None, "fork", "spawn"])
def test_process_dataflow_started_while_thread_workers_are_busy(method):
    entered, gate = threading.Event(), threading.Event()

    def held(dp):
        entered.set()
        gate.wait(20)
        return dp

    tdf = D.MultiThreadMapData(numbers(50), 2, held, strict=True, buffer_size=10)
    tdf.reset_state()
    it = iter(tdf)
    got = []
    consumer = threading.Thread(target=lambda: got.extend(it), daemon=True)
    consumer.start()
    try:
        assert entered.wait(10)             # worker threads are now inside the map function
        with D.MultiProcessMapData(numbers(100), 2, lambda dp: [dp[0] * 2], strict=True,
                                   ordered=True, start_method=method) as pdf:
            pdf.reset_state()
            assert list(pdf) == [[2 * i] for i in range(100)]
            assert consumer.is_alive()          # the thread dataflow was busy all along
    finally:
        gate.set()
        consumer.join(20)
        tdf.close()
    assert not consumer.is_alive()
    assert sorted(dp[0] for dp in got) == list(range(50))


@pytest.mark.timeout(15)
@pytest.mark.parametrize("method", [
    "fork",
    "forkserver",
])
def test_thread_map_inside_a_process_runner(method):
    inner = D.MultiThreadMapData(numbers(40), 2, lambda dp: [dp[0] * 2], strict=True)
    with D.MultiProcessRunnerZMQ(D.BatchData(inner, 4), 1, start_method=method) as df:
        df.reset_state()
        batches = list(df)
    assert len(batches) == 10
    assert sorted(int(v) for b in batches for v in b[0]) == [2 * i for i in range(40)]


# -- 8. runners ---------------------------------------------------------------------------------
RUNNERS = {
    "zmq": lambda ds: D.MultiProcessRunnerZMQ(ds, num_proc=2),
    "plain": lambda ds: D.MultiProcessRunner(ds, num_prefetch=10, num_proc=2),
}


def test_runner_aliases():
    assert D.PrefetchDataZMQ is D.MultiProcessRunnerZMQ
    assert D.PrefetchData is D.MultiProcessRunner
    assert D.MultiProcessPrefetchData is D.MultiProcessRunner
    assert issubclass(D.MultiProcessRunnerZMQ, D.MultiProcessRunner)
    assert D.MultiProcessMapDataZMQ is D.MultiProcessMapData


@pytest.mark.timeout(15)
@pytest.mark.parametrize("kind", sorted(RUNNERS))
def test_runner_workers_each_run_their_own_copy(kind):
    ds = D.MapData(numbers(10), lambda dp: [dp[0], os.getpid()])
    per_worker = collections.defaultdict(list)
    with RUNNERS[kind](ds) as df:
        assert df.executor == "process" and len(df) == 10
        df.reset_state()
        passes = 0
        deadline = time.monotonic() + 10
        # both workers run from the start; a pass is whatever arrives first, so go on until
        # both have been heard from
        while passes < 4 or len(per_worker) < 2:
            assert time.monotonic() < deadline, f"only heard from {list(per_worker)}"
            out = list(df)
            passes += 1
            assert len(out) == 10
            for value, pid in out:
                per_worker[pid].append(value)
    assert len(per_worker) == 2 and os.getpid() not in per_worker
    # each worker went through its own copy, in order, pass after pass
    for pid, seq in per_worker.items():
        assert seq == [i % 10 for i in range(len(seq))], pid
    assert sum(map(len, per_worker.values())) == 10 * passes


@pytest.mark.timeout(20)
def test_non_strict_passes_keep_going():
    """Regression: with the room left smaller than a chunk while workers are busy, the refill
    of a non-strict pass spun forever without receiving (fixed in 17261e7)."""
    df = D.MultiProcessMapData(numbers(1000), 2, lambda dp: dp)     # tensorpack's defaults
    df.reset_state()
    lengths = []

    def passes():
        try:
            for _ in range(3):
                lengths.append(len(list(df)))
        except Exception as e:          # closed while stuck
            lengths.append(e)
    t = threading.Thread(target=passes, daemon=True)
    t.start()
    try:
        t.join(10)                      # bounded: three passes take well under a second
        assert not t.is_alive(), f"stuck after passes of {lengths}"
        assert lengths == [1000] * 3
    finally:
        df.close()
        t.join(10)


class RunnerBoom(Exception):
    pass


class ExplodesAtThree(D.DataFlow):
    def __len__(self):
        return 10

    def __iter__(self):
        for i in range(10):
            if i == 3:
                raise RunnerBoom(f"boom in process {os.getpid()}")
            yield [i]


@pytest.mark.timeout(15)
@pytest.mark.parametrize("kind", sorted(RUNNERS))
def test_runner_error_keeps_its_type(kind):
    with RUNNERS[kind](ExplodesAtThree()) as df:
        df.reset_state()
        with pytest.raises(RunnerBoom, match="boom in process") as info:
            list(df)
    assert f"process {os.getpid()}" not in str(info.value)        # raised in a worker
    del info


# -- 9. map and batch ---------------------------------------------------------------------------
def _fails_on_5(dp):
    if dp[0] == 5:
        raise KeyError(f"no {dp[0]}")
    return dp


@pytest.mark.timeout(30)
def test_map_and_batch_errors_name_the_function_and_the_datapoint_of_the_batch(no_leaks):
    # they said "map function _MapAndBatch on datapoint #k", k the group's number
    with D.MultiProcessMapAndBatchData(numbers(12), 2, _fails_on_5, 3) as df:
        df.reset_state()
        with pytest.raises(KeyError, match="no 5") as info:
            list(df)
    notes = info.value.__notes__
    assert "(raised on datapoint 2 of the 3 grouped into one batch)" in notes, notes
    assert any(re.fullmatch(r"\(raised in map function _fails_on_5 on batch #\d+\)", n)
               for n in notes), notes


@pytest.mark.timeout(15)
def test_map_and_batch_with_default_buffer():
    assert D.MultiProcessMapAndBatchDataZMQ is D.MultiProcessMapAndBatchData

    def f(dp):
        return [np.full((3, 5), dp[0], np.int32), dp[0], np.full(4096, dp[0], np.float64)]

    with D.MultiProcessMapAndBatchData(numbers(22), 2, f, batch_size=4) as df:
        assert len(df) == 22 // 4 and df.executor == "process"
        df.reset_state()
        for _ in range(3):
            batches = list(df)
            assert len(batches) == 5
            for images, labels, big in batches:
                assert images.shape == (4, 3, 5) and images.dtype == np.int32
                assert labels.shape == (4,) and big.shape == (4, 4096)
                # a batch is 4 consecutive datapoints of the endlessly repeated source
                assert [int(v) for v in labels] == [(int(labels[0]) + k) % 22 for k in range(4)]
                assert all((images[k] == labels[k]).all() and (big[k] == labels[k]).all()
                           for k in range(4))
    del batches, images, labels, big


@pytest.mark.timeout(15)
def test_map_component_into_a_shared_array_as_tensorpack():
    # tensorpack's parallel_map module holds this class (not in its __all__)
    from dataflow.parallel_map import MultiProcessMapDataComponentSharedArray

    def grow(a):     # component 1 of [k, array]: None drops datapoint 3
        return None if int(a[0, 0]) == 3 else np.full(6, a[0, 0] * 2, np.uint8)

    src = D.DataFromList([[k, np.full((2, 3), k, np.uint8)] for k in range(7)], shuffle=False)
    with MultiProcessMapDataComponentSharedArray(src, 2, grow, (2, 3), np.uint8,
                                                 index=1) as df:
        assert len(df) == 7 and df.executor == "process"
        df.reset_state()
        out = list(df)
    assert [dp[0] for dp in out] == [0, 1, 2, 4, 5, 6]          # source order, 3 dropped
    assert all(dp[1].shape == (2, 3) and dp[1].dtype == np.uint8 and (dp[1] == 2 * dp[0]).all()
               for dp in out)
    wrong = MultiProcessMapDataComponentSharedArray(src, 2, lambda a: a.astype(np.float32),
                                                    (2, 3), np.uint8, index=1)
    with wrong as df:
        df.reset_state()
        with pytest.raises(ValueError, match=r"float32.*output_dtype=uint8"):
            list(df)
    del out


def test_map_component_into_a_shared_array_names_wrong_arguments():
    from dataflow.parallel_map import MultiProcessMapDataComponentSharedArray as SharedArray
    src = D.DataFromList([[np.zeros(4)]])
    with pytest.raises(ValueError, match=r"output_shape\[0\] must be an int >= 0, got 1.5"):
        SharedArray(src, 1, np.sqrt, (1.5, 4), np.float64)      # was truncated to (1, 4)
    with pytest.raises(ValueError, match="output_shape must be a tuple of ints, got 5"):
        SharedArray(src, 1, np.sqrt, 5, np.float64)
    with pytest.raises(TypeError, match="map_func must be callable"):
        SharedArray(src, 1, None, (4,), np.float64)
    with pytest.raises(TypeError, match="index must be an int"):
        SharedArray(src, 1, np.sqrt, (4,), np.float64, index=None)
    assert SharedArray(src, 1, np.sqrt, (2.0, np.int64(2)), np.float64).output_shape == (2, 2)


# -- 10. worker random streams ------------------------------------------------------------------
@pytest.fixture
def seed_reset():
    yield
    D.set_seed(None)


def draws(method):
    """Per worker, in the order it made them: one np.random draw per datapoint."""
    f = lambda dp: [np.random.randint(1 << 30), D.rng.worker_id()]   # noqa: E731
    by_worker = collections.defaultdict(list)
    for value, wid in mapped([[i] for i in range(20)], f, start_method=method):
        by_worker[wid].append(value)
    assert sorted(by_worker) == [0, 1], "both workers get work"
    return by_worker


@pytest.mark.parametrize("method", [None, "fork"])
def test_seeded_worker_streams_are_distinct_and_reproducible(method, seed_reset):
    D.set_seed(123)
    first = draws(method)
    D.set_seed(123)
    second = draws(method)
    assert not set(first[0]) & set(first[1]), "the two workers draw the same stream"
    for wid in (0, 1):
        # how the datapoints were shared out may differ; each worker's stream may not
        n = min(len(first[wid]), len(second[wid]))
        assert n >= 1 and first[wid][:n] == second[wid][:n], wid


def test_unseeded_worker_streams_are_distinct(seed_reset):
    D.set_seed(None)
    first, second = draws(None), draws(None)
    assert not set(first[0]) & set(first[1])
    assert not set(first[0] + first[1]) & set(second[0] + second[1])


# -- 11. many dataflows -------------------------------------------------------------------------
@pytest.mark.timeout(40)
def test_create_iterate_close_cycles_leak_nothing():
    f = lambda dp: [np.full(8192, dp[0], np.float32)]        # noqa: E731  32 KiB: shared memory

    def resources():
        gc.collect()
        return (len(os.listdir("/proc/self/fd")), memfd_mappings(), len(descendants()),
                threading.active_count())
    baseline = resources()
    seen = {}
    for cycle in range(1, 41):              # a leak of one thing per cycle: 30 between checks
        with D.MultiProcessMapData(numbers(20), 2, f, strict=True) as df:
            df.reset_state()
            out = list(df)
        assert sorted(int(dp[0][0]) for dp in out) == list(range(20))
        assert all((dp[0] == dp[0][0]).all() for dp in out)
        del out
        if cycle in (10, 40):
            seen[cycle] = resources()
    assert seen[10] == seen[40] == baseline, (baseline, seen)


# -- 12. worker crashes -------------------------------------------------------------------------
def crash_test(tmp_path, die):
    """Run a map whose worker dies (``die()``) on datapoint 5, the first time only. Returns the
    error, the dying worker's pid and how long after its death the consumer got the error."""
    stamp = str(tmp_path / "died")

    def f(dp):
        if dp[0] == 5 and not os.path.exists(stamp):
            with open(stamp + ".tmp", "w") as fh:
                fh.write(f"{os.getpid()} {time.monotonic()!r}")
            os.rename(stamp + ".tmp", stamp)
            die()
        return dp

    got = []
    with D.MultiProcessMapData(numbers(20), 2, f, strict=True) as df:
        df.reset_state()
        with pytest.raises(D.WorkerCrashedError) as info:
            for dp in df:
                got.append(dp[0])
        caught = time.monotonic()
        with open(stamp) as fh:
            pid, died = fh.read().split()
        assert 5 not in got and len(got) < 20
        # the dataflow can be started again
        df.reset_state()
        assert sorted(dp[0] for dp in df) == list(range(20))
    err = info.value
    del info
    return err, int(pid), caught - float(died)


def test_worker_killed_by_a_signal(tmp_path):
    err, pid, delay = crash_test(tmp_path, lambda: os.kill(os.getpid(), signal.SIGKILL))
    assert isinstance(err, RuntimeError)
    assert delay < 1.0, f"noticed {delay:.2f} s after the worker died"
    assert str(pid) in str(err) and "SIGKILL" in str(err), str(err)
    assert err.pid == pid and err.exitcode == -signal.SIGKILL
    assert 5 in err.datapoints and "#5" in str(err)


def test_worker_that_exits(tmp_path):
    err, pid, delay = crash_test(tmp_path, lambda: os._exit(3))
    assert delay < 1.0, f"noticed {delay:.2f} s after the worker died"
    assert str(pid) in str(err) and "code 3" in str(err), str(err)
    assert err.pid == pid and err.exitcode == 3


# -- 13. files ----------------------------------------------------------------------------------
def test_no_files_of_ours_in_dev_shm_or_tmp(files_before_module):
    """(Also checked when the module ends.) Shared memory has no name, endpoints no file."""
    with D.MultiProcessMapData(numbers(10), 2, lambda dp: [np.zeros(1 << 16)], strict=True) as df:
        df.reset_state()
        out = list(df)
        assert _our_files() <= files_before_module
    del out
    assert _our_files() <= files_before_module


def test_max_restarts_is_checked_at_construction():
    """A bad max_restarts fails when the dataflow is built, before any worker starts (as Ray's)."""
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="max_restarts must be an int >= 0"):
            D.MultiProcessMapData(D.DataFromList([[1]]), 1, _identity, max_restarts=bad)
        with pytest.raises(ValueError, match="max_restarts must be an int >= 0"):
            D.MultiProcessRunner(D.DataFromList([[1]]), 2, 1, max_restarts=bad)
        with pytest.raises(ValueError, match="max_restarts must be an int >= 0"):
            D.MapData(D.DataFromList([[1]]), _identity, num_parallel_workers=1,
                      python_multiprocessing=True, max_restarts=bad)


@pytest.mark.parametrize("make, name", [
    (lambda bad: D.MultiProcessRunnerZMQ(D.DataFromList([[1]]), 1, hwm=bad), "hwm"),
    (lambda bad: D.PrefetchDataZMQ(D.DataFromList([[1]]), 1, bad), "hwm"),
    (lambda bad: D.MultiProcessRunner(D.DataFromList([[1]]), bad, 1), "num_prefetch"),
    (lambda bad: D.MultiThreadRunner(lambda: D.DataFromList([[1]]), bad, 1), "num_prefetch"),
    # it was silently made 1
    (lambda bad: D.MultiProcessMapAndBatchData(D.DataFromList([[1]] * 4), 1, _identity, 2,
                                               buffer_size=bad), "buffer_size"),
])
def test_runner_prefetch_sizes_are_named_as_given(make, name):
    # these runners have no buffer_size argument, yet the message named it
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match=rf"^{name} must be a positive int, got {bad}$"):
            make(bad)


def test_map_and_batch_default_buffer_takes_num_proc_as_multiprocess_map_data_does():
    # the default buffer_size was computed from num_proc before it was checked: None (the
    # CPUs, as MultiProcessMapData takes it) and a bad count raised a bare TypeError
    src = D.DataFromList([[i] for i in range(4)], shuffle=False)
    with D.MultiProcessMapAndBatchData(src, None, _identity, 2) as df:
        assert df.num_workers == D.parallel.threads.available_cpus()
        assert df.buffer_size_datapoints == 2 * max(4, 2 * df.num_workers)
    for bad in ("x", 0, 1.5):
        with pytest.raises(ValueError, match="the number of workers must be an int from 1 to 4096"):
            D.MultiProcessMapAndBatchData(src, bad, _identity, 2)


def _identity(dp):
    return dp


def test_worker_streams_of_a_datapoint_are_those_of_a_serial_map(seed_reset):
    # run_chunk keys the streams with a cursor advanced in place: each datapoint still gets the
    # (pass, index) streams a serial MapData gives it, both APIs, several calls continuing one
    from dataflow import rng

    def f(dp):
        g, rs = rng.datapoint_rng(), rng.datapoint_random_state()
        return [dp[0], int(g.integers(1 << 30)), int(g.integers(1 << 30)),
                int(rs.randint(1 << 30)), int(rs.randint(1 << 30))]

    src = [[i] for i in range(40)]
    D.set_seed(7)
    serial = sorted(D.MapData(D.DataFromList(src, shuffle=False), f).get_data())
    D.set_seed(7)
    parallel = D.MultiProcessMapData(D.DataFromList(src, shuffle=False), 2, f, strict=True)
    try:
        got = sorted(parallel)
    finally:
        parallel.close()
    assert got == serial
    assert len({tuple(r[1:]) for r in got}) == len(src), "each datapoint has its own streams"


REUSED = np.zeros(16, np.float32)
REUSED_BIG = np.zeros(50000, np.float32)


def into_a_reused_buffer(dp):
    REUSED[:] = dp[0]
    return [REUSED, dp[0]]


def into_a_view_of_a_reused_buffer(dp):
    REUSED_BIG[:] = dp[0]
    return {"x": (REUSED_BIG[10:], dp[0])}


@pytest.mark.timeout(30)
def test_a_reused_output_buffer_is_copied_before_the_next_datapoint_of_a_chunk(no_leaks):
    # a chunk's results travel together: each is detached from what the worker keeps as soon
    # as it is made, so every datapoint keeps its own values (as serial MapData yields them)
    for f in (into_a_reused_buffer, into_a_view_of_a_reused_buffer):
        with D.MultiProcessMapData(numbers(200), 2, f, strict=True, ordered=True) as df:
            df.reset_state()
            got = list(df)
        if f is into_a_reused_buffer:
            assert all((a == k).all() for a, k in got)
        else:
            assert all((dp["x"][0] == dp["x"][1]).all() for dp in got)
        assert len(got) == 200
    del got


def test_detach_copies_only_what_something_else_holds():
    from dataflow.parallel.protocol import detach_kept

    def result(make):             # as run_chunk holds a result: one local variable
        r = make()
        out = detach_kept(r)
        return r, out

    r, out = result(lambda: [np.zeros(3), 1])
    assert out is r and out[0] is r[0]                      # fresh: as it is
    r, out = result(lambda: np.zeros(3))
    assert out is r
    r, out = result(lambda: [np.arange(10)[2:], {"k": (np.ones(2), 0)}])
    assert out is r and out[0] is r[0] and out[1]["k"][0] is r[1]["k"][0]
    r, out = result(lambda: [REUSED, (REUSED[4:], 2), {"k": REUSED}])
    assert out[0] is not REUSED and out[1][0].base is None and out[2]["k"] is not REUSED
    np.testing.assert_array_equal(out[0], REUSED)
    r, out = result(lambda: REUSED)
    assert out is not REUSED


_COLLECTED_WHILE_ANOTHER_STARTS = """
import gc
from multiprocessing import popen_fork
import dataflow as D

def f(dp):
    return dp

def make():
    ds = D.MultiProcessMapData(D.DataFromList([[j] for j in range(8)], shuffle=False), 2, f,
                               strict=True)
    ds.reset_state()
    next(iter(ds))
    return ds

gc.disable()
old = make()
old.me = old          # a reference cycle: only the garbage collector frees it
del old
# the collector runs inside the next Process.start(), in multiprocessing's _cleanup() loop
poll = popen_fork.Popen.poll
popen_fork.Popen.poll = lambda self, *a: (gc.collect(), poll(self, *a))[1]
new = make()
popen_fork.Popen.poll = poll
print(sorted(x for (x,) in new))
new.close()
"""


@pytest.mark.timeout(60)
def test_a_map_collected_while_another_starts_its_workers_does_not_break_the_start():
    # CPython 3.10's multiprocessing._cleanup() polled p._popen of a child that the collected
    # map's close() had just closed (Process.close() sets it to None): AttributeError
    import subprocess
    out = subprocess.run([sys.executable, "-c", _COLLECTED_WHILE_ANOTHER_STARTS],
                         capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(list(range(8)))


_FORK_SERVER_FILE_REMOVED = """
import glob, os, shutil, sys
import dataflow as D
from multiprocessing import forkserver

def run(n):
    df = D.MultiProcessMapData(D.DataFromList([[i] for i in range(n)], shuffle=False), 2,
                               lambda dp: [dp[0] * 2], strict=True, start_method="forkserver")
    df.reset_state()
    return df, sorted(x for (x,) in df)

kept, first = run(6)                    # its workers came from the first server
old = forkserver._forkserver._forkserver_pid
address = forkserver._forkserver._forkserver_address
if sys.argv[1] == "file":
    os.unlink(address)                  # a /tmp cleaner
else:
    shutil.rmtree(os.path.dirname(address))
    if sys.argv[1] == "replaced":       # by a directory that is not private to us
        os.mkdir(os.path.dirname(address), 0o755)
df, second = run(8)
new = forkserver._forkserver._forkserver_pid
print(first, second, sorted(x for (x,) in kept), new != old, os.path.exists(address))
df.close()
kept.close()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("removed", ["file", "directory", "replaced"])
def test_a_lost_fork_server_socket_file_is_replaced(removed):
    # the fork server's socket lives in $TMPDIR/pymp-* for the life of the process; once removed,
    # every later start through the server failed with FileNotFoundError
    import pathlib
    import shutil
    import subprocess
    # short: the fork server's socket goes in it, and AF_UNIX paths have ~100 bytes
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="lfs-"))
    try:
        out = subprocess.run([sys.executable, "-c", _FORK_SERVER_FILE_REMOVED, removed],
                             capture_output=True, text=True, timeout=50,
                             env=dict(os.environ, TMPDIR=str(tmp)))
        assert out.returncode == 0 and out.stderr == "", out.stderr
        assert out.stdout.split("] ") == ["[0, 2, 4, 6, 8, 10", "[0, 2, 4, 6, 8, 10, 12, 14",
                                          "[0, 2, 4, 6, 8, 10", "True False\n"], out.stdout
        left = list(tmp.iterdir())              # both servers' files removed at exit
        if removed == "replaced":               # ... but not a directory that is not ours
            assert len(left) == 1 and left[0].name.startswith("pymp-") and \
                list(left[0].iterdir()) == []
        else:
            assert left == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _twice(dp):
    return [dp[0] * 2]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make", [
    lambda s: D.MultiProcessMapData(s, 2, _twice, strict=True),
    lambda s: D.MapData(s, _twice, num_parallel_workers=2, python_multiprocessing=True),
    lambda s: D.MapData(s, _twice, num_parallel_workers=2, on_error="skip"),
    lambda s: D.BatchData(s, 4, per_batch_map=_twice, num_parallel_workers=2),
], ids=["MultiProcessMapData", "MapData-processes", "MapData-threads-skip",
        "BatchData-per_batch_map"])
def test_a_dropped_map_goes_with_its_last_reference(no_leaks, make):
    # reference cycles (the error policy and its owner; BatchData and the source of its
    # per_batch_map) kept a map dropped without close(), its workers, sockets and shared
    # memory, until the garbage collector ran: 28 idle workers at once in a loop of pipelines
    enabled = gc.isenabled()
    gc.disable()
    try:
        df = make(numbers(40))
        df.reset_state()
        it = iter(df)
        next(it)
        del it
        ref = weakref.ref(df)
        del df
        assert ref() is None
    finally:
        if enabled:
            gc.enable()


@pytest.mark.parametrize("make, error, match", [
    # NaN passed "timeout <= 0": a stuck worker was then waited for for ever
    (lambda ds: D.MultiProcessRunnerZMQ(ds, 1, timeout=float("nan")), ValueError,
     "timeout must be None or a positive number, got nan"),
    (lambda ds: D.MultiProcessMapData(ds, 1, _identity, timeout=float("nan")), ValueError,
     "timeout must be None or a positive number, got nan"),
    # what is no dataflow, or no function, failed at reset_state() or the first datapoint
    (lambda ds: D.MultiProcessRunner([[1]], 4, 1), TypeError,
     "MultiProcessRunner: expected a DataFlow"),
    (lambda ds: D.MultiProcessMapAndBatchData([[1]], 1, _identity, 1), TypeError,
     "MultiProcessMapAndBatchData: expected a DataFlow"),
    (lambda ds: D.MultiProcessMapAndBatchData(ds, 1, None, 1), TypeError,
     "MultiProcessMapAndBatchData: map_func must be callable, got None"),
])
def test_runner_and_map_arguments_are_refused_when_built(make, error, match):
    with pytest.raises(error, match=match):
        make(numbers(4))


def test_a_thread_runner_whose_factory_gives_no_dataflow_names_it():
    df = D.MultiThreadRunner(lambda: 5, 1, 1)
    with pytest.raises(TypeError, match=r"MultiThreadRunner: get_df\(\): expected a DataFlow"):
        df.reset_state()
    df.close()
