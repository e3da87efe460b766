"""Pipeline statistics: what every dataflow produced, where the time went, which stage is the
bottleneck.

Every :class:`~dataflow.DataFlow` records, as it is iterated:

* ``produced``: the datapoints it yielded (exact);
* ``passes``: how many times it was iterated;
* ``time_s``: the time spent inside its ``next()`` (it *includes* the time its inputs took), which
  :func:`stats` splits into ``input_s`` (waiting on its inputs) and ``self_s`` (producing).

No Python code runs per datapoint: the iterator a dataflow returns is a C ``itertools.chain``
over segments, one *timed* datapoint (``time.perf_counter()`` around its ``next()``) then a
block of datapoints that go through ``islice(compress(it, iter(TRUES)), n)``; the block's count
is read back from the selector's length hint, so counts are exact (also during a pass). The
timed datapoint stands for its block, which keeps the time estimate unbiased. Block sizes are
drawn at random (mean up to 1023) and shrink for slow stages, where timing every datapoint costs
nothing in comparison. So times are estimates; counts are exact; recording costs a few percent
on the tiniest maps and nothing measurable on real ones (figures in docs/measurements.md).

A stage that can say how many datapoints it has yielded returns a :class:`Counted` chain (a
``DataFromList`` over a list reads its iterator's position): nothing is put around
it, its count stays exact, and it is not timed (its time shows in the stage that reads it).

Parallel dataflows (:class:`~dataflow.parallel.mapper.ParallelMapData` and the ``MapData`` /
``BatchData`` that run one) add, in ``"parallel"``: the workers and the busy fraction of each,
how long the consumer waited for results, the occupancy of the buffer, errors skipped and
replaced, worker restarts, bytes received through shared memory, and the autotuner's decisions
when the number of workers is ``"auto"``.

:func:`stats` returns the tree as plain data (dicts, lists, numbers and strings: JSON-ready),
:func:`print_stats` prints it as a table that names the bottleneck, :func:`reset_stats` starts the
figures again from zero, :func:`log_stats` logs the table every ``report_interval`` seconds
through ``logging.getLogger("dataflow")``. Set the environment variable ``DATAFLOW_STATS=0`` (or
call :func:`enable_stats(False) <enable_stats>`) to turn recording off.

This module imports nothing from the rest of the library: it is told (:func:`tell_inputs`,
:func:`tell_parallel`, :func:`tell_label`), by :mod:`dataflow.base`, the parallel mapper and the
dataflows that run one.
"""
import functools
import itertools
import json
import logging
import math
import numbers
import os
import random
import sys
import threading
import time
import types
import weakref

__all__ = ["stats", "print_stats", "format_stats", "reset_stats", "log_stats", "enable_stats",
           "stats_enabled", "StageStats", "ParallelStats"]

logger = logging.getLogger("dataflow")

_enabled = os.environ.get("DATAFLOW_STATS", "1").strip().lower() not in ("0", "false", "off", "no")

# A block of datapoints is counted without timing them; one timed next() stands for the block.
_BLOCK_MAX = 1023
# Blocks are kept short enough that one takes about this long, so slow stages are timed often
# (and periodic reports are not late).
_BLOCK_SECONDS = 0.002
_END = object()


def enable_stats(flag=True):
    """Turn recording on or off for iterations started afterwards (default: on, unless the
    environment variable ``DATAFLOW_STATS`` is ``0``). Returns the previous setting."""
    global _enabled
    if isinstance(flag, (str, bytes)):          # "False" would be true
        raise TypeError(f"enable_stats: flag must be True or False, got {flag!r}")
    previous, _enabled = _enabled, bool(flag)
    return previous


def stats_enabled():
    """Whether iterations started now record statistics."""
    return _enabled


# ------------------------------------------------------------------------------- recording
class StageStats:
    """The raw figures of one dataflow (``df._dfstats``); read them through :func:`stats`."""

    __slots__ = ("produced", "passes", "time_s", "first", "last", "live", "base",
                 "__weakref__")

    def __init__(self):
        self.produced = 0          # datapoints yielded by finished iterations
        self.passes = 0            # iterations started
        self.time_s = 0.0          # estimated seconds inside next(), inputs included
        self.first = None          # perf_counter() when the first iteration started
        self.last = None           # perf_counter() of the last timed datapoint
        self.live = {}             # id -> [count, selector] of each iteration in progress
        self.base = None           # (produced, passes, time_s, t) subtracted since reset_stats

    # A dataflow sent to a worker process starts its own, empty figures there.
    def __reduce__(self):
        return StageStats, ()

    def __deepcopy__(self, memo):
        return StageStats()

    def live_count(self):
        """Datapoints yielded so far by the iterations in progress (exact)."""
        n = 0
        for state in list(self.live.values()):
            done, sel = state
            if sel is None:
                n += done
            elif callable(sel):                    # a Counted iteration's own count
                n += done + sel()
            else:                                  # the selector of a block in progress
                n += done + _NTRUES - sel.__length_hint__()
        return n

    def total(self):
        return self.produced + self.live_count()


def _stage_stats(df, create=True):
    # object's own attribute access, not df.__dict__: reading __dict__ turns the instance's
    # inline attribute values into a real dict (CPython 3.11-3.13), after which every self.x in
    # the dataflow's own loop takes the slow, unspecialized path (one per datapoint in BatchData).
    # Not getattr(df, ...) either: a proxy's __getattr__ would hand over its input's figures.
    try:
        return _get_attribute(df, "_dfstats")
    except AttributeError:
        pass
    if not create:
        return None
    st = StageStats()
    try:
        _set_attribute(df, "_dfstats", st)
    except AttributeError:          # no __dict__ (__slots__)
        return None
    return st


_get_attribute, _set_attribute = object.__getattribute__, object.__setattr__


# The selectors of ``compress``: each datapoint of a block takes one True, and the number taken
# is read back from the list iterator's length hint. No Python code runs per datapoint.
_TRUES = [True] * (2 * _BLOCK_MAX + 1)
# Our own stream for block sizes: drawing from the global ``random`` would change the user's.
_jitter = random.Random(0x5EED).random
_NTRUES = len(_TRUES)


class _Iteration(itertools.chain):
    """The iterator that a recording dataflow's ``iter()`` returns: ``chain`` (C) over the
    segments that :func:`_segments` hands out, with a generator's ``close()``."""

    __slots__ = ("_segments", "_inner")

    def close(self):
        """Stop the iteration as closing its generator would: the dataflow's own iterator is
        closed (its ``finally`` blocks run) and the figures are written."""
        seg, self._segments = self._segments, None
        if seg is not None:
            seg.close()
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


class Counted(itertools.chain):
    """What a dataflow whose ``__iter__`` can say how many datapoints it has yielded returns:
    ``Counted(*iterables)`` is a ``chain`` (C) of them, and ``count`` (set by the dataflow) a
    function giving the number yielded so far. Recording then puts no iterator around it (three
    C steps fewer per datapoint, about 150 instructions): its count stays exact, but the stage is
    not timed (its ``time_s`` stays 0, so its time shows in the stage that reads it). For stages
    whose ``next()`` is a C iterator's, such as a ``DataFromList`` over a list. ``close()`` ends
    the iteration's figures at once (otherwise when it is collected)."""

    __slots__ = ("count", "_finish", "__weakref__")

    def close(self):
        finish = getattr(self, "_finish", None)
        if finish is not None:
            finish()


def _finish_counted(st, state):
    """The end of a Counted iteration (``state[1]`` is its count): the count joins
    ``produced``."""
    if st.live.pop(id(state), None) is not None:
        st.produced += state[1]()
        st.last = time.perf_counter()


def _segments(it, st, state, pc=time.perf_counter, islice=itertools.islice,
              compress=itertools.compress, trues=_TRUES, rand=_jitter):
    """Segments of ``it`` for ``chain``: one timed datapoint (a 1-tuple), then a block of up to
    ``2 * _BLOCK_MAX`` that pass through C iterators only, counted in ``state`` (read by
    ``live_count``).

    Block sizes are drawn at random around a nominal size (which doubles while a block stays
    under ``_BLOCK_SECONDS``): with fixed sizes, a stage and its input would take their samples
    on the same datapoints, pass after pass (each sample of the outer one would include the
    inner one's timing, multiplied by the block size), and a stage whose slow datapoints come
    periodically would be sampled on the same phase every time."""
    nominal = 0        # the block size aimed at
    block = 0          # datapoints counted without timing after the next timed one
    avg = None         # moving average of a timed next()
    dt = 0.0
    try:
        while True:
            t0 = pc()
            dp = next(it, _END)
            t1 = pc()
            dt = t1 - t0
            if dp is _END:
                st.time_s += dt
                st.last = t1
                return
            # The block size was chosen before this sample was taken, so weighting the sample
            # by it keeps the estimate unbiased.
            st.time_s += dt * (block + 1)
            state[0] += 1
            st.last = t1
            yield (dp,)
            dp = None                              # hold no datapoint while the block runs
            if block:
                sel = iter(trues)
                state[1] = sel
                yield islice(compress(it, sel), block)
                k = _NTRUES - sel.__length_hint__()
                state[0] += k
                state[1] = None
                if k < block:                      # the input ended inside the block
                    st.time_s -= dt * (block - k)
                    st.last = pc()
                    return
            # Block sizing follows the typical next(); a sample that was preempted (a busy
            # machine) must not shrink the blocks. The estimate itself uses every sample as is.
            avg = dt if avg is None else 0.75 * avg + 0.25 * min(dt, 4 * avg)
            if (2 * nominal + 2) * avg < _BLOCK_SECONDS:
                nominal = min(2 * nominal + 1, _BLOCK_MAX)
            elif nominal and (nominal + 1) * avg > 2 * _BLOCK_SECONDS:
                nominal //= 2
            # Uniform in [0, 2 * nominal]: drawn before the next sample is taken, so weighting
            # that sample by its block is unbiased; and random even for small blocks, so that
            # samples do not fall on the same phase of a periodic pattern (a parallel stage
            # whose results arrive in chunks: one slow next(), then fast ones).
            block = int(rand() * (2 * nominal + 1))
    finally:
        sel = state[1]
        if sel is not None:                        # stopped in the middle of a block
            k = _NTRUES - sel.__length_hint__()
            state[0] += k
            state[1] = None
            st.time_s -= dt * (block - k)
            st.last = pc()
        st.live.pop(id(state), None)
        st.produced += state[0]


def _record(df, it):
    """What an instrumented ``__iter__`` returns: ``it``, counted into ``df``'s figures."""
    if not _enabled:
        return it
    st = _stage_stats(df)
    if st is None:
        return it
    it = iter(it)
    st.passes += 1
    if st.first is None:
        st.first = time.perf_counter()
    counted = type(it) is Counted        # the stage counts itself: nothing around it
    state = [0, it.count if counted else None]
    st.live[id(state)] = state
    if counted:
        it._finish = weakref.finalize(it, _finish_counted, st, state)
        return it
    seg = _segments(it, st, state)
    out = _Iteration.from_iterable(seg)
    out._segments = seg
    out._inner = it
    return out


def instrument(cls, root):
    """Make ``cls.__iter__`` record statistics: the one ``cls`` defines, or the one it takes
    from a class that is no subclass of ``root`` (a mixin). Called for every subclass of
    ``root``, :class:`~dataflow.DataFlow` (``__init_subclass__``).

    Only the ``__iter__`` that Python picks for the object's type records, so a subclass whose
    ``__iter__`` calls ``super().__iter__()`` counts its datapoints once. ``__iter__`` still runs
    at once when called (errors raised by it are raised by ``iter()``)."""
    orig = cls.__dict__.get("__iter__")
    if orig is None:
        owner = next((k for k in cls.__mro__ if "__iter__" in k.__dict__), None)
        if owner is None or issubclass(owner, root):
            return      # root's own, or one already instrumented where it was defined
        orig = owner.__dict__["__iter__"]
    if not isinstance(orig, types.FunctionType) or getattr(orig, "_dataflow_instrumented", False):
        return

    @functools.wraps(orig)
    def __iter__(self):
        it = orig(self)
        if type(self).__iter__ is not __iter__:
            return it
        return _record(self, it)

    __iter__._dataflow_instrumented = True
    cls.__iter__ = __iter__


# ------------------------------------------------------------------------------- parallel
class ParallelStats:
    """What a parallel dataflow adds (``ParallelMapData._pstats``), measured by its consumer
    thread once per batch of results, never per datapoint."""

    __slots__ = ("wait_s", "batches", "results", "busy_s", "occupancy_sum", "occupancy_max",
                 "skipped", "replaced", "base", "since")

    def __init__(self):
        self.wait_s = 0.0          # consumer seconds spent waiting for results
        self.batches = 0           # batches of results received
        self.results = 0           # datapoints back from workers
        self.busy_s = 0.0          # workers' seconds in the map function (as they report)
        self.occupancy_sum = 0     # datapoints buffered (in workers or waiting), summed per batch
        self.occupancy_max = 0
        self.skipped = 0           # datapoints dropped by on_error="skip"
        self.replaced = 0          # datapoints replaced by on_error="replace"
        self.base = None
        self.since = time.perf_counter()

    def __reduce__(self):
        return ParallelStats, ()

    def __deepcopy__(self, memo):
        return ParallelStats()

    def received(self, wait, n, busy, occupancy):
        self.wait_s += wait
        self.batches += 1
        self.results += n
        self.busy_s += busy
        self.occupancy_sum += occupancy
        if occupancy > self.occupancy_max:
            self.occupancy_max = occupancy

    def snapshot(self):
        return (self.wait_s, self.batches, self.results, self.busy_s, self.occupancy_sum,
                self.skipped, self.replaced)

    def reset(self):
        self.base = self.snapshot()
        self.occupancy_max = 0
        self.since = time.perf_counter()


# ------------------------------------------------------------------------------- what it is told
# This module asks no one: dataflows tell it where their inputs are, what their label shows, and
# which mapper reports their parallel figures.
_inputs_of = None                              # df -> the dataflows it reads (dataflow.base)
_parallel_of = weakref.WeakKeyDictionary()     # df -> weakref to the dataflow doing its work
_details = weakref.WeakKeyDictionary()         # df -> what its label shows in parentheses


def tell_inputs(func):
    """``func(df)`` lists the dataflows ``df`` reads from (told once, by :mod:`dataflow.base`)."""
    global _inputs_of
    _inputs_of = func


def tell_parallel(df, worker):
    """``worker`` does ``df``'s parallel work: ``df`` itself when it is a mapper (it then reports
    its figures through ``stats_figures(wall)`` and ``stats_reset()``), or the dataflow that
    runs one for it."""
    _parallel_of[df] = weakref.ref(worker)


def tell_label(df, detail):
    """Show ``df`` as ``Type(detail)``: ``detail`` is a string, or a function shown by name."""
    if callable(detail):
        f = getattr(detail, "__wrapped__", detail)
        detail = getattr(f, "__qualname__", None) or getattr(f, "__name__", None) \
            or type(f).__name__
        detail = detail.rpartition("<locals>.")[2]
    _details[df] = detail


def _mapper_of(df):
    """The mapper that does ``df``'s work, as dataflows told (:func:`tell_parallel`): itself, or
    the one a MapData / BatchData runs."""
    seen = 0
    while df is not None and seen < 4:
        ref = _parallel_of.get(df)
        told = ref() if ref is not None else None
        if told is df:
            return df
        df = told
        seen += 1
    return None


# ------------------------------------------------------------------------------- the tree
def _children(df):
    return _inputs_of(df) if _inputs_of is not None else []


def _label(df):
    name = type(df).__name__
    detail = _details.get(df)
    return name if detail is None else f"{name}({detail})"


def _figures(df, now):
    """(produced, passes, time_s, first, last, running) of ``df`` since its last reset_stats."""
    st = _stage_stats(df, create=False)
    if st is None:
        return 0, 0, 0.0, None, None, False
    produced = st.total()
    passes, time_s, first, last = st.passes, st.time_s, st.first, st.last
    if st.base is not None:
        b_produced, b_passes, b_time, b_t = st.base
        produced -= b_produced
        passes -= b_passes
        time_s -= b_time
        first = b_t
    running = bool(st.live)
    if running:
        last = now
    return produced, passes, max(0.0, time_s), first, last, running


def _node(df, now, path, seen, pipeline_wall):
    produced, passes, time_s, first, last, running = _figures(df, now)
    wall = (last - first) if (first is not None and last is not None) else 0.0
    if pipeline_wall > 0:
        # Sampled estimates can overshoot a little; nothing spends more than the wall time.
        time_s = min(time_s, pipeline_wall)
    m = _mapper_of(df) if id(df) not in seen else None
    if m is not None:
        parallel = m.stats_figures(pipeline_wall)
        # Waiting for workers is this stage's own time, measured exactly by the mapper, and it
        # happens inside its next(): its time is at least that. (The sampled estimate alone
        # can fall far below it, since most next() calls are served from the buffer at once,
        # and the stage reading this one then looked busy with this one's waiting.)
        wait = min(parallel.get("wait_s") or 0.0, pipeline_wall or math.inf)
        time_s = max(time_s, wait)
    node = {"stage": _label(df), "path": path, "produced": produced, "passes": passes,
            "time_s": round(time_s, 6)}
    if id(df) in seen:
        node["same_as"] = seen[id(df)]
        return node, 0.0
    seen[id(df)] = path
    inputs, input_s = [], 0.0
    for i, child in enumerate(_children(df)):
        c, c_time = _node(child, now, f"{path}.{i}", seen, pipeline_wall)
        inputs.append(c)
        input_s += c_time
    if m is None and input_s > time_s:
        # A serial stage pulls its inputs inside its own next(): its time is at least theirs.
        # (Its sampled estimate can fall below the exactly measured wait of a parallel input,
        # and the stage reading this one was then charged with that wait.)
        time_s = min(input_s, pipeline_wall) if pipeline_wall > 0 else input_s
        node["time_s"] = round(time_s, 6)
    node["input_s"] = round(input_s, 6)
    node["self_s"] = round(max(0.0, time_s - input_s), 6)
    node["wall_s"] = round(wall, 6)
    # Every stage of a pipeline works over the same wall time: the pipeline's.
    node["rate"] = round(produced / pipeline_wall, 3) if pipeline_wall > 0 else None
    node["running"] = running
    if m is not None:
        node["parallel"] = parallel
        node["self_s"] = round(max(node["self_s"], wait), 6)
    node["inputs"] = inputs
    return node, time_s


def _walk(node):
    yield node
    for c in node.get("inputs", ()):
        yield from _walk(c)


def _check_dataflow(df, who):
    """``TypeError`` unless ``df`` is a dataflow (an instance with ``__iter__`` and
    ``reset_state``)."""
    if isinstance(df, type) or not (callable(getattr(type(df), "__iter__", None))
                                    and callable(getattr(type(df), "reset_state", None))):
        raise TypeError(f"dataflow.{who}: expected a DataFlow, got {df!r:.80} "
                        f"({type(df).__name__})")


def stats(df, wall=None):
    """The statistics of the pipeline that ends in ``df``, as a tree of plain dicts.

    Each node has ``stage`` (a label), ``path`` (``"0"`` for ``df``, ``"0.1"`` for its second
    input, ...), ``produced``, ``passes``, ``time_s`` (seconds inside its ``next()``, inputs
    included; for a parallel stage at least the time its consumer waited for workers, which
    the mapper measures exactly), ``input_s`` (of which waiting on its inputs), ``self_s``
    (producing: ``time_s - input_s``; for a parallel stage at least that wait too),
    ``wall_s`` (from its first iteration to its last activity), ``rate`` (datapoints/s over the
    pipeline's wall time), ``running`` (an iteration is in progress), ``parallel`` (parallel
    stages only) and ``inputs`` (the nodes of its inputs). A dataflow that appears twice is shown
    once; the second node has ``same_as``.

    The root also has ``consumer_s`` (the part of ``wall_s`` spent outside ``df``: in the code
    that iterates it) and ``bottleneck``: the stage with the largest ``self_s``, or
    ``"consumer"``, with its share of the wall time. ``wall`` (seconds) overrides the root's wall
    time (``TestDataSpeed`` passes the duration of its test).

    Counts are exact, also during an iteration; times are estimates (see the module doc).
    Figures cover what happened since the dataflow was created or :func:`reset_stats`; the
    worker figures of a parallel stage, since its workers started (``reset_state``).
    """
    _check_dataflow(df, "stats")
    now = time.perf_counter()
    if wall is None:
        _, _, _, first, last, _ = _figures(df, now)
        wall = max(0.0, last - first) if (first is not None and last is not None) else 0.0
    elif isinstance(wall, bool) or not isinstance(wall, numbers.Real) or \
            not 0 <= wall < math.inf:           # NaN and -5 were taken as 0, "abc" bare
        raise ValueError(f"stats: wall must be a number of seconds >= 0, got {wall!r}")
    wall = float(wall)
    root, _ = _node(df, now, "0", {}, wall)
    root["wall_s"] = round(wall, 6)
    root["consumer_s"] = round(max(0.0, wall - root["time_s"]), 6)
    best_path, best_s = "consumer", root["consumer_s"]
    for n in _walk(root):
        if "same_as" not in n and n.get("self_s", 0.0) > best_s:
            best_path, best_s = n["path"], n["self_s"]
    name = "consumer" if best_path == "consumer" else \
        next(n["stage"] for n in _walk(root) if n["path"] == best_path)
    root["bottleneck"] = {"path": best_path, "stage": name, "seconds": round(best_s, 6),
                          "share": round(min(1.0, best_s / wall), 4) if wall > 0 else None}
    return root


def reset_stats(df):
    """Start the figures of ``df`` and of every dataflow it reads from again from zero (an
    iteration in progress goes on counting from there)."""
    _check_dataflow(df, "reset_stats")
    now = time.perf_counter()
    seen = set()
    stack = [df]
    while stack:
        d = stack.pop()
        if id(d) in seen:
            continue
        seen.add(id(d))
        st = _stage_stats(d)
        if st is not None:
            # Iterations in progress count as passes of the new figures.
            st.base = (st.total(), st.passes - len(st.live), st.time_s, now)
            st.last = now
        m = _mapper_of(d)
        if m is not None:
            m.stats_reset()
        stack.extend(_children(d))


# ------------------------------------------------------------------------------- the table
def _fmt_s(x):
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def _fmt_rate(x):
    return "-" if x is None else f"{x:,.0f}"


def _fmt_bytes(n):
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0


def _parallel_line(p):
    parts = [f"{p['workers']} {p['executor']} worker{'s' if p['workers'] != 1 else ''}"]
    busy = [w["busy_fraction"] for w in p.get("worker_stats", ()) if w["state"] == "running"]
    if busy:
        parts.append("busy " + " ".join(f"{b:.0%}" for b in busy))
    if p.get("wait_s") is not None:
        frac = p.get("wait_fraction")
        parts.append(f"consumer waited {_fmt_s(p['wait_s'])} s"
                     + (f" ({frac:.0%})" if frac is not None else ""))
    if p.get("buffer_occupancy") is not None:
        parts.append(f"buffer {p['buffer_occupancy']:.0%} of {p['buffer_size']}")
    if p.get("errors_skipped"):
        parts.append(f"skipped {p['errors_skipped']}")
    if p.get("errors_replaced"):
        parts.append(f"replaced {p['errors_replaced']}")
    if p.get("restarts"):
        parts.append(f"restarts {p['restarts']}")
    if p.get("shm_bytes"):
        parts.append(f"shm {_fmt_bytes(p['shm_bytes'])}")
    lines = [", ".join(parts)]
    a = p.get("autotune")
    if a:
        moves = " ".join(f"{d['from']}->{d['to']}@{d['t']:.2f}s" if d["from"] != d["to"]
                         else "(kept)" for d in a["decisions"][-8:])
        lines.append(f"autotune: {a['workers']} workers (1..{a['max_workers']}"
                     + (f", ceiling {a['ceiling']}" if a["ceiling"] < a["max_workers"] else "")
                     + f"), {'settled' if a['settled'] else 'adjusting'}"
                     + (f"; {moves}" if moves else "; no change"))
    return lines


_ROOT_KEYS = ("wall_s", "consumer_s", "bottleneck")
_NODE_KEYS = ("path", "stage", "produced", "passes", "time_s", "self_s", "input_s", "rate")


def _check_stats_dict(root, who):
    """``ValueError`` naming the first missing key unless ``root`` has the shape of what
    :func:`stats` returns (a dict that is not one, ``{}`` say, failed with a bare
    ``KeyError``)."""
    def missing(node, keys, where):
        if not isinstance(node, dict):
            raise ValueError(f"dataflow.{who}: expected a DataFlow or the dict stats() returned; "
                             f"{where} is of type {type(node).__name__}, not a dict")
        for k in keys:
            if k not in node:
                raise ValueError(f"dataflow.{who}: expected a DataFlow or the dict stats() "
                                 f"returned; {where} has no {k!r}")

    missing(root, _ROOT_KEYS, "the dict")
    stack = [(root, "the dict")]
    while stack:
        node, where = stack.pop()
        missing(node, ("path", "stage"), where)
        if "same_as" in node:
            continue
        missing(node, _NODE_KEYS, where)
        inputs = node.get("inputs", ())
        if not isinstance(inputs, (list, tuple)):
            raise ValueError(f"dataflow.{who}: expected a DataFlow or the dict stats() returned; "
                             f"'inputs' of {where} is of type {type(inputs).__name__}, not a list")
        stack.extend((c, f"input {i} of {node['path']!r}") for i, c in enumerate(inputs))


def format_stats(df_or_stats, wall=None):
    """The table that :func:`print_stats` prints, as a string. Accepts a dataflow or the dict
    that :func:`stats` returned."""
    if isinstance(df_or_stats, dict):
        _check_stats_dict(df_or_stats, "format_stats")
    else:
        _check_dataflow(df_or_stats, "format_stats")
    root = df_or_stats if isinstance(df_or_stats, dict) else stats(df_or_stats, wall=wall)
    rows = []
    for n in _walk(root):
        depth = n["path"].count(".")
        label = "  " * depth + n["stage"]
        if "same_as" in n:
            rows.append((label + f"  (same as {n['same_as']})", "", "", "", "", "", ""))
            continue
        rows.append((label, f"{n['produced']:,}", str(n["passes"]), _fmt_s(n["time_s"]),
                     _fmt_s(n["self_s"]), _fmt_s(n["input_s"]) if n["inputs"] else "-",
                     _fmt_rate(n["rate"])))
        if "parallel" in n:
            for line in _parallel_line(n["parallel"]):
                rows.append(("  " * depth + "  | " + line,) + ("",) * 6)
    head = ("stage", "produced", "passes", "time s", "self s", "input s", "rate/s")
    width = max(len(head[0]), *(len(r[0]) for r in rows if r[1]))
    cols = [max(len(head[i]), *(len(r[i]) for r in rows)) for i in range(1, 7)]
    lines = [head[0].ljust(width) + "".join("  " + h.rjust(c) for h, c in zip(head[1:], cols))]
    for r in rows:
        if not r[1] and r[0].lstrip().startswith("|"):
            lines.append(r[0])
        else:
            lines.append(r[0].ljust(width) + "".join("  " + v.rjust(c)
                                                     for v, c in zip(r[1:], cols)))
    wall_s = root["wall_s"]
    lines.append(f"consumer (outside the pipeline): {_fmt_s(root['consumer_s'])} s of "
                 f"{_fmt_s(wall_s)} s wall")
    b = root["bottleneck"]
    share = f" ({b['share']:.0%} of the wall time)" if b["share"] is not None else ""
    if b["path"] == "consumer":
        lines.append(f"bottleneck: the consumer, {_fmt_s(b['seconds'])} s{share}: the pipeline "
                     "waits for the code that iterates it")
    else:
        lines.append(f"bottleneck: {b['stage']} [{b['path']}], {_fmt_s(b['seconds'])} s of its "
                     f"own{share}")
    return "\n".join(lines)


def print_stats(df, file=None, wall=None):
    """Print the statistics of the pipeline that ends in ``df`` as a table, one row per stage
    (indented under the stage that reads it), then the consumer's time and the bottleneck."""
    if not isinstance(df, dict):
        _check_dataflow(df, "print_stats")
    if file is not None and not callable(getattr(file, "write", None)):
        raise TypeError(f"dataflow.print_stats: file must be a text stream with a write() method "
                        f"(sys.stdout when None), got {file!r:.80}")
    print(format_stats(df, wall=wall), file=file if file is not None else sys.stdout, flush=True)


# ------------------------------------------------------------------------------- reporting
def log_stats(df, report_interval=30.0, level=logging.INFO):
    """Log the table of :func:`print_stats` for ``df`` through ``logging.getLogger("dataflow")``
    every ``report_interval`` seconds while ``df`` is being iterated (``None`` or 0 stops it:
    once this call returns, no report of ``df`` is being made or will be). The JSON of
    :func:`stats` is logged at DEBUG level. The reports come from one daemon thread
    (``dataflow-stats-reporter``, running while some dataflow has reports on), so they keep time
    however slowly the pipeline is consumed. Like any other thread, it makes process pipelines
    started meanwhile use the fork server rather than fork (see ``default_start_method``)."""
    _check_dataflow(df, "log_stats")
    if report_interval is not None and (
            not isinstance(report_interval, numbers.Real) or isinstance(report_interval, bool)
            or not 0 <= report_interval < math.inf):
        raise ValueError(f"log_stats: report_interval must be a number of seconds > 0 (None or "
                         f"0 stops the reports), got {report_interval!r}")
    if isinstance(level, str) and isinstance(logging.getLevelName(level), int):
        level = logging.getLevelName(level)             # "INFO", as Logger.setLevel takes it
    if isinstance(level, numbers.Integral) and not isinstance(level, bool):
        level = int(level)                              # a numpy int too
    if not isinstance(level, int) or isinstance(level, bool):
        raise ValueError(f"log_stats: level must be a logging level (logging.INFO or 'INFO'), "
                         f"got {level!r}")
    global _reporter
    with _reports_changed:
        _reports.pop(id(df), None)
        if report_interval:
            every = float(report_interval)
            _reports[id(df)] = [weakref.ref(df), every, level, time.monotonic() + every]
            if _reporter is None:
                _reporter = threading.Thread(target=_report, name="dataflow-stats-reporter",
                                             daemon=True)
                _reporter.start()
        _reports_changed.notify()
    with _emitting:     # a report the reporter had already begun ends before this returns
        pass


# id(df) -> [weakref to df, seconds, level, when the next report is due] for each dataflow that
# log_stats() reports on; the reporter thread runs while there is one.
_reports = {}
_reports_changed = threading.Condition()
_reporter = None
# Held by the reporter while it logs; log_stats() takes it after changing _reports, so that no
# report made under the old setting follows its return. Re-entrant for a handler that calls it.
_emitting = threading.RLock()


def _report():
    """The reporter thread: log each dataflow's statistics when its report is due and it is
    being iterated; end when no dataflow has reports on (stopped, or garbage-collected)."""
    global _reporter
    with _reports_changed:
        while True:
            now = time.monotonic()
            due = []
            for key, entry in list(_reports.items()):
                ref, every, level, at = entry
                df = ref()
                if df is None:
                    del _reports[key]
                elif now >= at:
                    entry[3] = now + every
                    st = _stage_stats(df, create=False)
                    if st is not None and st.live:
                        due.append((key, entry, df, level))
                del df
            if not _reports:
                _reporter = None
                return
            if due:
                _reports_changed.release()      # stats() walks the pipeline: not under the lock
                try:
                    for key, entry, df, level in due:
                        with _emitting:     # unless log_stats() changed it since it was due
                            if _reports.get(key) is entry:
                                _log(df, level)
                finally:
                    due = df = None
                    _reports_changed.acquire()
                continue
            _reports_changed.wait(min(e[3] for e in _reports.values()) - now)


def _log(df, level):
    try:
        data = stats(df)
        logger.log(level, "dataflow statistics:\n%s", format_stats(data))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("dataflow statistics (JSON): %s", json.dumps(data))
    except Exception:   # pragma: no cover - a report must never break the pipeline
        logger.exception("could not report dataflow statistics")


def _forget_reports_in_child():
    """A forked child has no reporter thread (and reports nothing it inherited)."""
    global _reporter, _reports_changed, _emitting
    _reports.clear()
    _reports_changed = threading.Condition()
    _emitting = threading.RLock()
    _reporter = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_reports_in_child)
