"""Random streams: one global seed, distinct reproducible streams derived from it.

Without :func:`set_seed`, every stream is seeded from fresh OS entropy (as tensorpack does, but
without its time-and-pid formula that gives forked workers equal seeds).

With ``set_seed(s)``, every stream is a pure function of ``s``, the worker id and the order of
requests in that worker:

* :func:`get_rng` hands the ``k``-th caller in a worker (an ``RNGDataFlow.reset_state``, say) the
  stream ``SeedSequence(s, spawn_key=(worker_id, k))``. Building and resetting the same pipeline in
  the same order therefore gives the same data, run after run.
* A parallel worker calls :func:`seed_worker` when it starts; it re-seeds Python's ``random`` and
  ``numpy.random`` (the legacy global state) from ``(s, worker_id)`` and restarts the request
  counter, so that workers draw distinct streams (tensorpack gives every worker the same seed).
  The consuming process is worker ``-1`` and uses spawn keys ``(0, k)``; worker ``i`` uses
  ``(i + 1, k)``. torch's global generator, where the worker has torch, gets the same seed
  (:func:`seed_torch`): torch starts every process at one fixed seed, and a forked worker
  inherits the consumer's state, so workers drew the same numbers (torchvision's random
  transforms, ``torch.rand``), as torch's ``DataLoader`` seeds its workers to avoid.
"""
import itertools
import os
import random
import sys
import threading

import numpy as np

__all__ = ["set_seed", "get_seed", "get_rng", "seed_worker", "worker_id"]

_lock = threading.Lock()
_seed = None
_counter = itertools.count()
_worker_id = -1
_generation = 0          # bumped by set_seed/seed_worker: cached per-datapoint streams expire
_torch_seed = None       # a worker's seed for torch's generator, until torch is imported


def set_seed(seed):
    """Make every random stream of the library reproducible from ``seed`` (an int ``>= 0``), or
    return to OS entropy with ``None``. Also seeds ``random`` and ``numpy.random`` in this process.
    """
    global _seed, _counter, _generation
    _generation += 1
    if seed is not None:
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
        seed = int(seed)
    with _lock:
        _seed = seed
        _counter = itertools.count()
    if seed is not None:
        random.seed(seed)
        np.random.seed(_derive(seed, (0,), 2**32 - 1))


def get_seed():
    """The global seed, or ``None``."""
    return _seed


def worker_id():
    """The id of the parallel worker this code runs in, or ``-1`` in the consuming process."""
    return _worker_id


def _derive(seed, key, bound):
    return int(np.random.SeedSequence(seed, spawn_key=key).generate_state(1, np.uint64)[0] % bound)


def get_rng(obj=None):
    """A new ``numpy.random.RandomState`` for ``obj`` (the argument exists for tensorpack
    compatibility and is not used): the next stream of this worker, see the module doc."""
    with _lock:
        seed, k = _seed, next(_counter)
    if seed is None:
        return np.random.RandomState(int.from_bytes(os.urandom(4), "little"))
    return np.random.RandomState(_derive(seed, (_worker_id + 1, k), 2**32))


def seed_worker(wid, seed):
    """Called once in each worker process, before it runs any user code, with the consuming
    process's global seed (a spawned process does not inherit it); see the module doc."""
    global _worker_id, _counter, _seed, _generation
    if not isinstance(wid, (int, np.integer)) or isinstance(wid, bool) or wid < 0:
        raise ValueError(f"seed_worker: the worker id must be a non-negative int, got {wid!r}")
    if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool)
                             or seed < 0):
        raise ValueError(f"seed_worker: seed must be a non-negative int or None, got {seed!r}")
    _generation += 1
    _worker_id = int(wid)
    with _lock:
        _counter = itertools.count()
        _seed = seed
    if seed is None:
        s = int.from_bytes(os.urandom(4), "little")
    else:
        s = _derive(seed, (_worker_id + 1,), 2**32)
    random.seed(s)
    np.random.seed(s)
    global _torch_seed
    _torch_seed = s
    seed_torch()


def seed_torch():
    """In a worker process: seed torch's global generator with the worker's seed (see the module
    doc) once torch is imported; called again at the start of each chunk of map work, in case
    loading or running the map function imported torch since (cheap when there is nothing to
    do)."""
    global _torch_seed
    if _torch_seed is not None:
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "manual_seed"):
            s, _torch_seed = _torch_seed, None
            torch.manual_seed(s)


# -- per-datapoint streams ------------------------------------------------------------------------
# Random ops (dataflow.ops) must give the same output for a fixed seed whatever the number of
# workers or the executor, so their randomness is keyed by the datapoint, not by the worker:
# whoever applies a map function to datapoint ``index`` of pass ``epoch`` (serial MapData or a
# parallel worker) sets that key first, and datapoint_rng() derives a generator from it.
class _DatapointLocal(threading.local):
    # class attributes are every thread's defaults: reading an unset one costs no exception
    cached = None
    cached_rs = None
    copy = None              # the runner copy this thread is running (see parallel.threads)
    bitgens = None           # this thread's PCG64s behind datapoint_random_state() and datapoint_rng()
    base_states = None       # their states at position 0, for the global seed of _generation
    base_generation = -1

    def __init__(self):      # run once in each thread that uses it
        self.slot = [None]   # [the datapoint key]: see key_slot()

    @property
    def key(self):
        """The key of the datapoint being mapped in this thread (``slot[0]``), or ``None``."""
        return self.slot[0]

    @key.setter
    def key(self, value):
        self.slot[0] = value


_local = _DatapointLocal()


def key_slot():
    """This thread's one-element list ``[key]`` holding the datapoint key, for hot loops:
    ``slot[0] = cursor`` (a list store) sets the key for about a third of a dict store's cost
    and a fifth of a ``threading.local`` attribute's. The list belongs to the thread that called
    this: a loop that may be resumed in another thread checks ``threading.get_ident()`` and gets
    that thread's list (see ``MapData``)."""
    return _local.slot


def set_datapoint_key(key):
    """Set (or clear, with ``None``) the ``(epoch, index)`` of the datapoint being mapped in
    this thread. (Hot loops may store into :func:`key_slot` directly, either a new tuple each
    time -- the generator of the last key is reused while the key is the very same object -- or a
    *cursor*: a list ``[epoch, index]`` that the loop owns and advances in place, which saves
    building a tuple per datapoint; the generator of a cursor is reused while it is the same
    list holding the same values.)"""
    _local.key = key
    _local.cached = None
    _local.cached_rs = None


def datapoint_rng():
    """A ``numpy.random.Generator`` for the datapoint being mapped in this thread.

    Inside a map (serial or parallel), it is derived from the global seed and the datapoint's
    ``(epoch, index)``, so with :func:`set_seed` the same datapoint gets the same random draws
    for any number of workers and any executor; repeated calls for one datapoint continue one
    stream. Outside a map it is a per-thread generator from :func:`get_rng`.

    Inside a map the stream is made as :func:`datapoint_random_state`'s (a sub-stream of this
    thread's PCG64, about 3 µs per datapoint where a generator seeded through ``SeedSequence``
    took 17), from a base stream of its own, so the two never give the same numbers. Like that
    one, the returned generator is valid until the next datapoint of this thread: draw from it
    while mapping this datapoint, do not keep it.
    """
    loc = _local
    obj = loc.slot[0]
    c = loc.cached
    if c is not None and c[0] is obj and c[1] == obj and c[2] == _generation:
        return c[3]                        # the same datapoint as the last call
    if obj is None:
        g = np.random.Generator(np.random.PCG64(get_rng().randint(2**31)))
    else:
        g = np.random.Generator(_keyed_bitgen(_GENERATOR, _key_value(obj)))
    loc.cached = (obj, _snapshot(obj), _generation, g)
    return g


def datapoint_random_state():
    """A ``numpy.random.RandomState`` for the datapoint being mapped in this thread, or ``None``
    outside a map (no datapoint key set).

    The legacy-API twin of :func:`datapoint_rng`, for code written against ``RandomState``
    (image augmentors: ``rng.uniform``, ``rng.randint``, ``rng.rand``, ...). With
    :func:`set_seed`, its draws depend only on the seed, the datapoint key and the order of
    calls inside the map function, never on the worker or the executor; without a seed each
    datapoint gets fresh entropy.

    "One datapoint" is one key, the same object holding the same value, in this thread since
    the last :func:`set_seed` or :func:`set_datapoint_key`: repeated calls continue one stream.
    A key of equal value in another object (the same datapoint mapped again, as when a resume
    refills a shuffle buffer) starts the stream again, as it starts after a resume. Stacked maps
    (``MapData(MapData(ds, f), g)``, serial or parallel) set distinct keys for the same
    datapoint, their stage being part of the key (:func:`map_key`), so ``g`` never gets the very
    draws of ``f`` and draws the same numbers whatever runs ``f``.

    How the stream is made (cheaply: a few microseconds per datapoint): every thread holds one
    PCG64 whose position-0 state is derived from the global seed alone; a datapoint gets the
    stream that starts :func:`_jump` ``(n)`` draws further (``PCG64.advance``), ``n`` packing its
    key (see :func:`_packed_key`), so distinct datapoints start at distinct, unrelated points of
    the 2**128-long cycle. Keys of another form are hashed to ``n`` through ``SeedSequence``;
    without a seed ``n`` is random. The returned object is valid until the next datapoint of
    this thread.
    """
    loc = _local
    obj = loc.slot[0]
    if obj is None:
        return None
    c = loc.cached_rs
    if c is not None and c[0] is obj and c[1] == obj and c[2] == _generation:
        return c[3]                        # the same datapoint as the last call
    rs = _keyed_random_state(_key_value(obj))
    loc.cached_rs = (obj, _snapshot(obj), _generation, rs)
    return rs


# The two functions above keep the stream of their last call as ``(key object, its value then,
# seed generation, stream)`` and return it again for the very same datapoint: the same key object
# holding the same value under the same seed (a value equal by chance is another map's
# datapoint). They run for every random draw of an augmentor, so the check is written out in
# them, and the value kept is one that compares equal to the live key without building anything:
# a cursor (a list the map advances in place) is kept as a list copy, any other key as itself.

def _key_value(obj):
    """The key's value now: a cursor as a tuple, any other key as it is."""
    return tuple(obj) if obj.__class__ is list else obj


def _snapshot(obj):
    return obj.copy() if obj.__class__ is list else obj


# The spawn keys of the base streams of the two kinds of per-datapoint stream: distinct from each
# other and from every other use of the seed.
_BASE_STREAMS = (1 << 40, 1 << 41)
_RANDOM_STATE, _GENERATOR = 0, 1      # which kind: datapoint_random_state(), datapoint_rng()


# A map's stage carries its branch (dataflow.base.mark_branches) above its low STAGE_BITS.
STAGE_BITS = 8
_MASK64 = (1 << 64) - 1
_branch_offsets = {}        # branch -> (generation, its offset of sub-stream numbers)


def _split_branch(key):
    """``(key, branch)``: a map key whose stage carries a branch, split into the key with its
    stage alone and the branch (0 for none)."""
    if type(key) is tuple and len(key) == 4 and type(key[3]) is int and \
            key[3] >> STAGE_BITS > 0:
        return key[:3] + (key[3] & ((1 << STAGE_BITS) - 1),), key[3] >> STAGE_BITS
    return key, 0


def _branch_offset(branch):
    """A random 64-bit shift of the sub-stream numbers of the maps of ``branch``, from the
    seed: their datapoint k gets another stream than the same datapoint of the maps beside
    them, at the cost of one dict lookup (hashing each key took 20 µs more per datapoint)."""
    known = _branch_offsets.get(branch)
    if known is not None and known[0] == _generation:
        return known[1]
    offset = int(np.random.SeedSequence(_seed, spawn_key=(1 << 42, branch)).generate_state(
        1, np.uint64)[0])
    _branch_offsets[branch] = (_generation, offset)
    return offset


def _packed_key(key):
    """The 64-bit sub-stream number of the usual keys (see :func:`map_key`): ``pass`` in bits
    48-63, the stage in bits 40-47, ``copy + 1`` (0 for no copy) in bits 32-39, ``index`` in
    bits 0-31; ``None`` for a key outside these ranges."""
    if type(key) is not tuple:
        return None
    n = len(key)
    if n == 2:
        p, i = key
        c = stage = 0
    elif n == 3:
        p, i, c = key
        stage = 0
        if type(c) is not int or c < 0:
            return None
        c += 1
    elif n == 4:
        p, i, c, stage = key
        if type(c) is not int or type(stage) is not int or c < 0 or stage < 0:
            return None
    else:
        return None
    if type(p) is not int or type(i) is not int or p < 0 or i < 0 or \
            p >= 1 << 16 or i >= 1 << 32 or c >= 1 << 8 or stage >= 1 << 8:
        return None
    return (p << 48) | (stage << 40) | (c << 32) | i


def map_key(run, index, copy=None, stage=0):
    """The datapoint key a map sets for datapoint ``index`` of its pass ``run`` (as a list: the
    map advances it in place, see :func:`set_datapoint_key`): ``[run, index]``, ``[run, index,
    copy]`` in a runner's copy, and ``[run, index, copy + 1 (0 for none), stage]`` for a map
    that has ``stage`` maps below it (:func:`dataflow.base.random_stage`), so that stacked
    maps draw from distinct streams; ``stage`` also carries the map's branch above its low
    ``STAGE_BITS`` (:func:`dataflow.base.mark_branches`), so that maps side by side do too."""
    if stage:
        return [run, index, 0 if copy is None else copy + 1, stage]
    return [run, index] if copy is None else [run, index, copy]


# numpy's PCG64.jumped() step: odd, so that multiplying by it is a bijection modulo 2**128
_JUMP = 0x9E3779B97F4A7C15F39CC0605CEDC835
_MASK128 = (1 << 128) - 1


def _jump(n):
    """How far the stream of packed key ``n`` (64 bits) starts from the base state: ``n``
    mixed (SplitMix64's finalizer, a bijection of 64 bits) times :data:`_JUMP` modulo 2**128.
    Distinct keys get distinct starts. The mixing matters: PCG64 states a multiple of 2**k apart
    agree in their low k bits, and its output then shows it. With jumps of ``n << 64`` the
    streams of one datapoint in passes p and p + 4 (keys 2**50 apart) gave equal
    ``integers(2**40)`` for 6 % of datapoints."""
    n = (n ^ (n >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    n = (n ^ (n >> 27)) * 0x94D049BB133111EB & _MASK64
    n ^= n >> 31
    return n * _JUMP & _MASK128


def _keyed_random_state(key):
    return np.random.RandomState(_keyed_bitgen(_RANDOM_STATE, key))


def _keyed_bitgen(kind, key):
    """This thread's PCG64 of ``kind``, moved to the start of ``key``'s sub-stream: its base
    stream (derived from the global seed, or from fresh entropy without one), advanced by
    ``_jump(n)`` for ``n`` the packed key (:func:`_packed_key`; another key hashed through
    ``SeedSequence``; without a seed, random)."""
    loc = _local
    if loc.base_generation != _generation:
        seed = _seed if _seed is not None else int.from_bytes(os.urandom(8), "little")
        loc.base_states = [np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(k,))).state
                           for k in _BASE_STREAMS]
        loc.bitgens = [np.random.PCG64(), np.random.PCG64()]
        loc.base_generation = _generation
    if _seed is None:
        offset = int.from_bytes(os.urandom(8), "little")
    else:
        plain, branch = _split_branch(key)
        offset = _packed_key(plain)
        if offset is None:
            offset = int(np.random.SeedSequence(_seed, spawn_key=tuple(key)).generate_state(
                1, np.uint64)[0])
        elif branch:
            offset = (offset + _branch_offset(branch)) & _MASK64
    bitgen = loc.bitgens[kind]
    bitgen.state = loc.base_states[kind]
    bitgen.advance(_jump(offset))
    return bitgen
