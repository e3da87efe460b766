"""The DataFlow protocol, as in tensorpack.

A DataFlow is an iterable of *datapoints* (lists, tuples or dicts of components). Before iterating,
the consumer calls :meth:`DataFlow.reset_state` once, in the process and thread that will iterate;
it is where a dataflow seeds its random state or starts its workers.

Checkpoint and resume
---------------------
Every dataflow has ``state_dict()`` and ``load_state_dict(state)`` (see the README, "Checkpoint
and resume"). They wrap a *position*, which each dataflow defines with three methods:

* ``_get_position()`` returns a small JSON value (ints, strings, lists, dicts; never
  datapoints) meaning "just after the last datapoint I returned to my caller", pass number
  included, and the positions of the dataflows it reads from nested inside.
* ``_set_position(position)`` stores it, and hands the nested positions to its inputs at once
  (their ``_set_position``); the next ``__iter__`` continues from there. It works before or
  after ``reset_state()``, which must not forget a stored position. ``_get_position()`` called
  before that ``__iter__`` returns the stored position.
* ``_fingerprint_params()`` returns the parameters that change the stream (batch sizes, buffer
  sizes, shuffle flags; not worker counts), checked by ``load_state_dict``.
* ``_abandon()``, for a dataflow whose next ``__iter__`` does not simply start afresh: see
  :meth:`DataFlow._abandon`. Conversely, a dataflow that starts a new pass of its inputs at
  each of its passes calls their ``_abandon()`` when it starts a pass afresh (not when
  resuming), so that their positions never describe a pass already dropped; one whose input
  runs on across its passes (``LocallyShuffleData``) does not.
* ``_set_position`` must drop any iterator of an input that the dataflow keeps between
  passes: it is stale once a position is loaded.

What a new dataflow gets without writing them:

* A :class:`ProxyDataFlow` subclass that keeps nothing between datapoints (a map, a filter,
  a 1:1 transform) inherits its input's position; one that buffers datapoints must define its
  own (or raise ``NotImplementedError`` there).
* A random-access source: mix in :class:`dataflow.checkpoint.PassPosition`, call
  ``self._begin_pass()`` at the start of ``__iter__`` (it returns the pass number and the first
  index to yield), set ``self._pos`` before every ``yield`` and call ``self._end_pass()`` at
  the end; shuffle with :func:`dataflow.checkpoint.keyed_permutation` of the pass number and
  a base seed drawn once from ``self.rng`` and kept in the position (``DataFromList`` is the
  example). Its position is then two ints, and resuming costs nothing.
* Any other source (a plain ``DataFlow`` subclass with ``__iter__`` only) is counted: its
  position is the number of datapoints returned in the pass, and ``state_dict()`` raises
  ``NotImplementedError`` naming it unless called with ``replay=True``, in which case a resume
  re-iterates that many datapoints (exact only when the source is deterministic).
"""
import abc
import threading
import weakref

from . import checkpoint as _ckpt
from . import rng as _rng
from .rng import get_rng  # noqa: F401 (tensorpack's module has it)
from ._helpers import pass_progress
from .stats import instrument as _instrument_stats, tell_inputs as _tell_stats_inputs
from .stats import tell_label as _tell_stats_label

__all__ = ["DataFlow", "ProxyDataFlow", "RNGDataFlow", "DataFlowTerminated",
           "DataFlowReentrantGuard", "UnknownLengthError", "EndlessError", "ForeignDataFlow"]


class UnknownLengthError(NotImplementedError, TypeError):
    """Raised by ``len()`` of a dataflow whose length is not known. It is a
    ``NotImplementedError``, as in tensorpack, so ``except NotImplementedError`` still catches it,
    and a ``TypeError``, which ``list()``, ``tuple()``, ``sorted()`` and friends take to mean
    "no length: just iterate"."""


class EndlessError(NotImplementedError):
    """Raised by ``len()`` of a dataflow that never ends a pass (``RepeatedData(ds, -1)``,
    ``DataFromQueue``, ``RemoteDataZMQ``; a runner, ``LocallyShuffleData`` or
    ``MultiProcessMapAndBatchData`` over an input of unknown length): a plain
    ``NotImplementedError``, not an :class:`UnknownLengthError` (also a ``TypeError``, which
    ``list()`` takes for "no length: iterate"), so that ``list()`` of it fails at once instead
    of running forever."""


class DataFlowTerminated(BaseException):
    """Raised by a dataflow whose producer has stopped for good (for example, a queue that was
    closed). It derives from ``BaseException`` as in tensorpack, so that a bare ``except Exception``
    in a map function does not swallow it."""


class DataFlowReentrantGuard:
    """A context manager that makes a non-reentrant dataflow fail fast.

    Entering it while it is already entered (by another iteration of the same dataflow, in this
    thread or another one) raises ``RuntimeError`` instead of interleaving two iterations.
    """

    def __init__(self):
        self._lock = threading.Lock()

    # A dataflow that holds a guard may be sent to worker processes (a runner ships its copy):
    # the copy gets a fresh, unlocked guard.
    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def __enter__(self):
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("This DataFlow is not reentrant: it is already being iterated "
                               "(in this thread or another one).")
        return self

    def __exit__(self, exc_type, exc, tb):
        self._lock.release()
        return False

    def locked(self):
        """Whether an iteration holds it now."""
        return self._lock.locked()


def restore_attributes(obj, state):
    """Set the attributes of ``obj`` from a pickled ``state``: a dict, or pickle's
    ``(dict or None, slot values)`` pair, as ``object.__reduce_ex__`` makes them. Used by the
    ``__setstate__`` of :class:`DataFlow` (see there for why), of the augmentors and of the
    ops."""
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    for part in (state, slots):
        if part is None:
            continue
        if not isinstance(part, dict):
            raise TypeError(f"{type(obj).__name__}: cannot restore a pickled state of type "
                            f"{type(part).__name__} (expected a dict)")
        for name, value in part.items():
            object.__setattr__(obj, name, value)


def _adopt_old_names(cls):
    """tensorpack's dataflows were once written with ``get_data()`` and ``size()``; a subclass
    that defines those and not ``__iter__``/``__len__`` gets them as ``__iter__``/``__len__``,
    as tensorpack's metaclass does."""
    for new, old in (("__iter__", "get_data"), ("__len__", "size")):
        if new not in cls.__dict__ and old in cls.__dict__:
            setattr(cls, new, cls.__dict__[old])


def _count_for_replay(cls):
    """A subclass that defines ``__iter__`` but inherits no way to say where it is: count its
    datapoints so that ``state_dict(replay=True)`` can record a replay position. The count is
    kept in a :class:`_ReplayPosition` of its own, not in attributes of the dataflow, whose
    author may use ``self._pos`` or ``self._pass`` for something else (a tensorpack dataflow
    read back our counter, or crashed on it)."""
    orig = cls.__dict__.get("__iter__")
    pos = getattr(cls, "_get_position", None)
    if orig is None or "_get_position" in cls.__dict__ or not (
            pos is DataFlow._get_position or getattr(pos, "replay_default", False)):
        return

    def __iter__(self):
        return _ckpt.replay_counted(_replay_position(self), lambda: orig(self))

    __iter__.__wrapped__ = orig
    cls.__iter__ = __iter__
    cls._get_position = _replay_get_position
    cls._set_position = _replay_set_position
    cls._abandon = _replay_abandon


class _ReplayPosition(_ckpt.PassPosition):
    """The pass and count of a dataflow counted by :func:`_count_for_replay`, kept in the
    dataflow's ``_dfreplay``. It refers to its dataflow weakly (a reference cycle would keep a
    dropped dataflow, and whatever workers it holds, alive until the garbage collector runs), so
    that a shallow copy (``copy.copy``), whose ``_dfreplay`` is the original's, is told apart and
    gets a count of its own; a pickled copy brings its count along and claims it."""

    def __init__(self, owner):
        self.owner = weakref.ref(owner)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["owner"] = None                   # claimed by the dataflow it is unpickled with
        return state


def _replay_position(df):
    # object's own attribute access: a user class's __getattr__/__setattr__ is not involved
    try:
        pos = object.__getattribute__(df, "_dfreplay")
    except AttributeError:
        pos = None
    if pos is not None:
        if pos.owner is None:
            pos.owner = weakref.ref(df)
        if pos.owner() is df:
            return pos
    pos = _ReplayPosition(df)
    object.__setattr__(df, "_dfreplay", pos)
    return pos


def _replay_get_position(self):
    return _ckpt.replay_state(_replay_position(self), self)


def _replay_set_position(self, position):
    _ckpt.PassPosition._set_position(_replay_position(self), position)


def _replay_abandon(self):
    _ckpt.PassPosition._abandon(_replay_position(self))


_replay_get_position.replay_default = True


class DataFlowMeta(abc.ABCMeta):
    """tensorpack's metaclass of ``DataFlow``, kept for code that names it (``class
    D(DataFlow, metaclass=DataFlowMeta)``, ``six.add_metaclass(DataFlowMeta)``). ``DataFlow``
    needs none here: what tensorpack's did (a ``get_data``/``size`` of pre-0.9 code taken as
    ``__iter__``/``__len__``) is done for every subclass by ``DataFlow.__init_subclass__``."""


class DataFlow:
    """Base class of every dataflow.

    Subclasses implement ``__iter__`` (one pass over the data) and, when the number of datapoints
    per pass is known, ``__len__``.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _adopt_old_names(cls)       # get_data/size of pre-0.9 tensorpack code
        _count_for_replay(cls)      # a source that cannot say where it is (see the module doc)
        _instrument_stats(cls, DataFlow)    # every dataflow records statistics

    def __iter__(self):
        raise NotImplementedError

    # A copy made by pickle (a worker's, under spawn or forkserver) or by copy.copy gets its
    # attributes one by one. pickle's default writes them into the copy's __dict__, and reading
    # __dict__ turns an instance's inline attribute values into a real dict (CPython 3.11 and
    # 3.12), after which every self.x in the copy's own loops takes the slow, unspecialized
    # lookup (~300 instructions per datapoint in BatchData).
    def __setstate__(self, state):
        restore_attributes(self, state)

    def __len__(self):
        """The number of datapoints of one pass. Raises :class:`UnknownLengthError` (a
        ``NotImplementedError``) when unknown."""
        raise UnknownLengthError(f"{type(self).__name__} does not know its length")

    def reset_state(self):
        """Prepare the dataflow for iteration in the current process. Call it once before the first
        ``__iter__``; for dataflows that hold workers, it (re)starts them."""

    def close(self):
        """Release what this dataflow, and every dataflow it reads from, holds (worker threads
        and processes); idempotent. ``reset_state()`` starts again. Also available as
        ``with df: ...``. Dataflows that hold nothing just pass the call upstream."""
        for source in _sources(self):
            source.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- checkpoint and resume (the module doc says how a dataflow implements them) ----------
    def state_dict(self, *, replay=False):
        """The position of this pipeline, just after the last datapoint it returned (pass number
        included), as a dict of JSON types:
        ``{"format_version", "seed", "fingerprint", "state"}``.

        Raises ``NotImplementedError`` naming the first dataflow that cannot say where it is,
        unless ``replay=True``: such a source then records how many datapoints it returned, and
        a resume re-iterates them (exact only for a deterministic source)."""
        return _ckpt.envelope(self, replay)

    def load_state_dict(self, state):
        """Continue from ``state`` (from :meth:`state_dict`): the next ``iter()`` continues the
        interrupted pass from just after its last returned datapoint, and later passes follow
        as in an uninterrupted run. Works on a freshly built pipeline, before or after
        ``reset_state()``. Raises ``ValueError`` for a state of an unknown format, of a
        different pipeline (naming the first difference) or of another global seed."""
        self._set_position(_ckpt.unwrap(self, state))

    def _get_position(self):
        raise NotImplementedError(f"{type(self).__name__} does not implement state_dict(): "
                                  "see dataflow.base for how a dataflow says where it is")

    def _set_position(self, position):
        raise NotImplementedError(f"{type(self).__name__} does not implement "
                                  "load_state_dict(): see dataflow.base")

    def _fingerprint_params(self):
        return {}

    def _abandon(self):
        """Called by a dataflow that drops this one's pass unfinished as part of its own
        semantics (``JoinData`` when another input ends, ``FixedSizeData(keep_state=False)``):
        take the position the next ``__iter__`` would start from (the next pass), so that a
        position taken now says so. Dataflows that start the next pass at every ``__iter__``
        need nothing; proxies pass it on."""

    # tensorpack kept these for old code; so do we.
    def get_data(self):
        return self.__iter__()

    def size(self):
        return self.__len__()


class RNGDataFlow(DataFlow):
    """A dataflow with its own random state ``self.rng`` (a ``numpy.random.RandomState``), set in
    ``reset_state``. With :func:`dataflow.set_seed` the streams are reproducible; see
    :mod:`dataflow.rng`."""

    rng = None

    def reset_state(self):
        self.rng = _rng.get_rng(self)


def random_stage(df):
    """How many maps lie below ``df`` on its longest path to a source, ``df`` itself included:
    the stage at which a map built on ``df`` draws from the per-datapoint random streams
    (:func:`dataflow.rng.datapoint_random_state`). Stacked maps, serial or parallel, thereby
    draw from distinct streams, and a map draws the same numbers whichever executor runs the
    maps below it. A map is a dataflow whose class sets ``keys_random_streams``; the walk follows
    the inputs that a state's fingerprint follows (``checkpoint.inputs_of``)."""
    return _random_stage(df, 0)


def _random_stage(df, depth):
    keyed = getattr(type(df), "keys_random_streams", None)
    if keyed is False or depth > 200:
        # a runner: the maps in its copies key by copy as well (and its copies are not made
        # before it starts); a cycle would be a bug elsewhere
        return 0
    below = max((_random_stage(d, depth + 1) for d in _ckpt.inputs_of(df)), default=0)
    return below + (1 if keyed else 0)


# A map's ``_random_stage`` holds its stage in the low rng.STAGE_BITS and its branch above.
_BRANCHES = 1 << 16        # inputs of one dataflow told apart (more wrap around)


def mark_branches(inputs):
    """Called by a dataflow that reads several ``inputs`` side by side (``ConcatData``,
    ``JoinData``, ``RandomMixData``, ``RandomChooseData``). The maps below input ``i`` get
    branch ``i + 1`` in their random-stream key (composed with the branch a nested dataflow of
    this kind gave them), so that maps side by side at the same stage draw different numbers
    for their datapoint ``k``: the same key would give both the same stream (two "views" of
    one image augmented alike)."""
    for i, df in enumerate(inputs):
        _mark_branch(df, i % _BRANCHES + 1, set())


def _mark_branch(df, branch, seen):
    if id(df) in seen:
        return
    seen.add(id(df))
    keyed = getattr(type(df), "keys_random_streams", None)
    if keyed is False:          # a runner: its copies' maps are keyed by copy
        return
    if keyed:
        bits, stage = _rng.STAGE_BITS, df._random_stage
        code = (stage >> bits) * (_BRANCHES + 1) + branch
        df._random_stage = (code << bits) | (stage & ((1 << bits) - 1))
    for d in _ckpt.inputs_of(df):
        _mark_branch(d, branch, seen)
    inner = getattr(df, "_parallel", None)      # MapData's own parallel map
    if inner is not None:
        _mark_branch(inner, branch, seen)


class ProxyDataFlow(DataFlow):
    """A dataflow that wraps another one (``self.ds``) and by default forwards everything to it."""

    def __init__(self, ds):
        self.ds = check_dataflow(ds, type(self).__name__)

    def reset_state(self):
        self.ds.reset_state()

    def __len__(self):
        return len(self.ds)

    def __iter__(self):
        return iter(self.ds)

    # a proxy that keeps nothing between datapoints is where its input is
    def _get_position(self):
        return self.ds._get_position()

    def _set_position(self, position):
        self.ds._set_position(position)

    def _abandon(self):
        self.ds._abandon()

    def _pass_progress(self):
        """See :func:`dataflow._helpers.pass_progress`: a proxy makes the progress of its input."""
        return pass_progress(self.ds)


class ForeignDataFlow(DataFlow):
    """A dataflow of another library, as one of ours: one of tensorpack's (its classes, and user
    classes derived from them, which a script may still import beside this library) or any
    object with ``__iter__`` and ``reset_state``. Our dataflows wrap such an input in one, so
    that it takes the part ours share: ``df.ds`` is the wrapper, ``df.ds.foreign`` the object.

    It yields what the object yields and has its length (an unknown one, tensorpack's
    ``NotImplementedError``, becomes our :class:`UnknownLengthError`, so that ``list()`` works);
    ``close()`` calls the object's ``close`` when it has one. It cannot say where it is, so a
    checkpoint of a pipeline over it needs ``state_dict(replay=True)``: it then counts the
    datapoints it passed on, and a resume iterates it again up to there (exact for a
    deterministic source, as for any dataflow that does not say where it is)."""

    def __init__(self, foreign):
        self.foreign = foreign
        _tell_stats_label(self, type(foreign).__qualname__)

    def reset_state(self):
        self.foreign.reset_state()

    def __iter__(self):
        return iter(self.foreign)

    def __len__(self):
        try:
            return len(self.foreign)
        except (UnknownLengthError, EndlessError):
            raise
        except NotImplementedError as e:
            raise UnknownLengthError(str(e) or f"{type(self.foreign).__name__} does not know "
                                     "its length") from e

    def close(self):
        close = getattr(self.foreign, "close", None)
        if callable(close):
            close()

    def _fingerprint_params(self):
        return {"class": f"{type(self.foreign).__module__}.{type(self.foreign).__qualname__}"}

    def __repr__(self):
        return f"ForeignDataFlow({self.foreign!r})"


def _is_foreign(ds):
    """Whether ``ds`` is a dataflow of another library: an instance with ``__iter__`` and
    ``reset_state`` that is not ours and does not speak our checkpoint protocol
    (``_get_position``, as the runners' internal sources do). Anything else is left to the
    caller's checks."""
    return not isinstance(ds, (DataFlow, type)) and callable(getattr(ds, "reset_state", None)) \
        and callable(getattr(ds, "__iter__", None)) \
        and not callable(getattr(ds, "_get_position", None))


def as_dataflow(ds):
    """``ds`` in a :class:`ForeignDataFlow` if it is another library's dataflow, else ``ds``."""
    return ForeignDataFlow(ds) if _is_foreign(ds) else ds


def check_dataflow(ds, who):
    """:func:`as_dataflow` of ``ds``; ``TypeError`` naming ``who`` when ``ds`` is no dataflow
    (it failed later with "'list' object has no attribute 'reset_state'")."""
    if isinstance(ds, type) or not (callable(getattr(ds, "reset_state", None))
                                    and callable(getattr(ds, "__iter__", None))):
        raise TypeError(f"{who}: expected a DataFlow (with __iter__ and reset_state), got "
                        f"{type(ds).__name__}"
                        + (": wrap a list in DataFromList" if isinstance(ds, list) else ""))
    return as_dataflow(ds)


def as_dataflows(dfs, who="df_lists"):
    """:func:`as_dataflow` of each of ``dfs``, as a list; an object listed twice gets one
    wrapper (``JoinData`` resets a dataflow listed twice once). ``TypeError`` naming ``who`` and
    the position for a member that is no dataflow (one failed at ``reset_state()`` with
    "'str' object has no attribute 'reset_state'")."""
    wrappers, out = {}, []
    for i, d in enumerate(dfs):
        if _is_foreign(d):
            d = wrappers.setdefault(id(d), ForeignDataFlow(d))
        elif not isinstance(d, DataFlow) and not callable(getattr(d, "_get_position", None)):
            raise TypeError(f"{who}[{i}] must be a DataFlow (an object with __iter__ and "
                            f"reset_state), got {type(d).__name__}: {d!r:.60}")
        out.append(d)
    return out


def _sources(df):
    """The dataflows ``df`` reads from: ``df.ds`` and the members of ``df.df_lists`` (plain or in
    ``(dataflow, probability)`` pairs), when they have a ``close``."""
    found = [getattr(df, "ds", None)]
    for item in getattr(df, "df_lists", None) or ():
        found.append(item[0] if isinstance(item, (tuple, list)) else item)
    return [d for d in found if callable(getattr(d, "close", None))]


_tell_stats_inputs(_sources)
