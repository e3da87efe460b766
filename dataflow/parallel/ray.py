"""Map work on Ray actors: the same mapper, with workers on any node of a Ray cluster.

:class:`RayExecutor` runs :func:`~.protocol.run_chunk` in ``num_workers`` Ray actors behind the
:class:`~.protocol.Executor` contract, so :class:`RayMapData` has exactly the strict, ordered,
buffering and error semantics of :class:`~dataflow.MultiProcessMapData` (they are the mapper's,
not the executor's). The source dataflow runs in the consuming process; chunks of datapoints go to
the actors as Ray tasks and results come back through Ray's object store.

Ray is optional: importing this module (or ``dataflow``) never imports Ray. It is imported when a
Ray dataflow is built, and a missing Ray raises an ``ImportError`` that says how to install it.

Guarantees and choices, in one place:

* **Ray instance.** If this process is already connected to Ray (``ray.is_initialized()``), that
  connection is used as is. Otherwise we connect to ``address`` (or ``$RAY_ADDRESS``) when one is
  given, else start a local instance with ``include_dashboard=False`` and enough CPUs for the
  actors. Neither :meth:`RayExecutor.close` nor ``close()`` of a dataflow ever shuts Ray down:
  a cluster we joined is not ours, and a local instance we started is shared by every later Ray
  dataflow of the process (starting one costs seconds). It goes at interpreter exit (Ray's own
  exit hook), or when you call ``ray.shutdown()``. :func:`started_ray` tells whether we started it.
  Its files go to a private temporary directory (not ``/tmp/ray``), removed at exit; if this
  process is killed instead, a reaper process (:mod:`.ray_reaper`) stops what is left of the
  instance and removes the directory. A local instance we start is private to this machine and
  to whoever holds its token: every one of its servers (GCS, raylet, object manager, workers)
  listens on the loopback address only, and Ray's token authentication is on
  (``RAY_AUTH_MODE=token``) with a random token of this process (``RAY_AUTH_TOKEN``, unless you
  set one), so that another local user cannot submit work either.
* **Actors** are ordinary (non-detached) actors named ``dataflow-<executor id>-w<worker>.<n>`` in
  the driver's namespace, each holding ``num_cpus_per_worker`` CPUs. Each calls
  ``make_func(worker_id)`` once (seeded like a worker process, see :func:`dataflow.rng.seed_worker`)
  and then runs chunks one at a time. ``close()`` kills them with ``ray.kill`` (it returns at
  once; Ray frees their names and CPUs a moment later).
* **Arrays.** Ray hands numpy arrays out of its object store zero-copy and *read-only*. Every other
  executor gives the map function and the consumer writable arrays (as plain ``MapData`` does), so
  read-only arrays are copied on arrival: datapoints in the actor before ``map_func`` sees them,
  results in the consumer before the mapper sees them. The copy is one memcpy per array, cheap
  next to Ray's own transfer, and it also lets Ray free a chunk's object as soon as it is read
  instead of pinning the whole chunk while any one of its arrays lives.
* **Dead actors** (the process crashed, was killed, or its node went away) are reported as
  :class:`~dataflow.WorkerCrashedError` naming the actor and the datapoints it held, or, while
  fewer than ``max_restarts`` restarts happened, replaced by a new actor that receives the chunks
  the dead one had not finished. Chunks it finished before dying are kept, so each datapoint's
  result still arrives exactly once. Ray's own actor restarts are off (we restart instead).
* **Deadlines.** ``timeout`` and ``dataflow.config.hang_timeout()`` apply as for processes
  (:func:`~.supervisor.check_workers`), counted from when a chunk was submitted, so an actor's
  start-up (or a wait for a free CPU in the cluster) counts; a hung actor is logged with its node
  and pid, for ``ray stack`` or ``py-spy dump``.
* **Chunks** hold about :data:`CHUNK_SECONDS` of work (a Ray task costs ~10 times a process
  message), see :class:`_RayChunks`.
"""
import atexit
import collections
import itertools
import logging
import os
import secrets
import shutil
import tempfile
import time
import uuid

import numpy as np

from .. import config, rng
from .._helpers import available_cpus, check_int, check_positive_number
from .copies import Constant, CopiesRunner
from .mapper import _MAX_CHUNK, ParallelMapData
from .protocol import (CLOSED_WHILE_ITERATING, ERR, RAY, SERIAL, Executor, InlineExecutor,
                       WorkerError, run_chunk)
from . import cvthreads, ray_reaper, torchthreads
from .supervisor import WorkerCrashedError, next_wait
from .transport import pickle_error, unpickle_error

__all__ = ["RayExecutor", "RayMapData", "RayRunner", "started_ray"]

logger = logging.getLogger("dataflow")

INSTALL_HINT = 'pip install "dataflow-rt[ray]"'

# A Ray task costs about 0.5 ms of CPU (consumer, raylet and actor together) and 1 ms of latency,
# some 10 times a worker process's message: chunks aim at this much work each (the mapper's
# default is 10 ms), so that the overhead stays a few percent of a ~1 ms map.
CHUNK_SECONDS = 0.02

# After an actor's death: how long to wait for the fate (result or error) of its other chunks.
_DEATH_GRACE = 5.0

# ray.kill() returns at once and Ray frees the killed actor's CPUs some 40-100 ms later. A pipeline
# made within this many seconds of one that this process closed waits for those CPUs (up to this
# long) before it reports the cluster short of CPUs, which it otherwise did every time a training
# loop made a new pipeline right after closing the last one.
_RELEASE_WAIT = 2.0
_RELEASE_POLL = 0.02

_started_ray = False        # whether this process started the Ray instance it is connected to
_started_dir = None         # the private directory of that instance (when we started it)
_last_kill = None           # time.monotonic() of this process's last RayExecutor.close()
_actor_class = None         # _ActorBody made a Ray actor class, once


def import_ray():
    """The ``ray`` module, or an ``ImportError`` that says how to install it."""
    try:
        import ray              # optional dependency: imported on use, never by `import dataflow`
    except ImportError as e:
        raise ImportError(f"Ray dataflows need Ray, which is not installed: {INSTALL_HINT} "
                          f"(or pip install ray)") from e
    return ray


def started_ray():
    """Whether this process started the local Ray instance it uses (rather than joining one)."""
    return _started_ray


def _checked_address(address):
    """``address`` if it is None or a string (Ray's "host:port", "ray://host:port", "auto",
    "local"), else ``TypeError`` naming it (Ray's own error, at the first pass, did not)."""
    if address is None or isinstance(address, str):
        return address
    raise TypeError(f"address must be None or a Ray address string (\"host:port\", "
                    f"\"ray://host:port\", \"auto\", \"local\"), got {address!r}")


def ensure_ray(address=None, num_cpus=None):
    """Connect to Ray unless already connected: to ``address`` or ``$RAY_ADDRESS`` if given,
    else a new local instance (no dashboard) with ``num_cpus`` CPUs at least. Returns ``ray``."""
    global _started_ray, _started_dir
    ray = import_ray()
    if ray.is_initialized():
        if address is not None:
            logger.debug("Ray is already initialized in this process; address=%r not used",
                         address)
        return ray
    requested = address if address is not None else os.environ.get("RAY_ADDRESS")
    if requested and requested != "local":
        ray.init(address=address)
    else:                   # ("local": a new local instance, which is ours to make private)
        # Ray keeps a started instance's logs and sockets under /tmp/ray after it stops; ours
        # go to a private directory, removed at exit once the instance is down.
        # If this process is killed instead, a reaper process stops what is left of the
        # instance and removes the directory (see .ray_reaper).
        temp_dir = _started_dir = tempfile.mkdtemp(prefix="dataflow-ray-")
        reaper = ray_reaper.start(temp_dir)
        atexit.register(_shut_down_and_remove, ray, temp_dir, reaper)
        _private_local_instance(ray)
        try:
            # Ray makes its directory (and its sockets' and logs' directories) writable by
            # every user: it goes one level down, in ours, which stays 0700
            ray.init(num_cpus=max(available_cpus(), num_cpus or 1), include_dashboard=False,
                     _temp_dir=os.path.join(temp_dir, "ray"))
        finally:
            # Ray's processes have the mark now (those it starts later inherit it from them);
            # the user's processes started from here on must not, or the reaper ends them
            ray_reaper.unmark()
        _started_ray = True
    return ray


def _private_local_instance(ray):
    """Make the local instance about to start listen on loopback only, with token
    authentication. Ray binds its servers to the node's address, and takes the loopback address
    as the node's only where it does not build clusters (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``,
    read once at import: so the constant is set too). The environment carries both settings and
    the token to the processes Ray starts."""
    os.environ["RAY_AUTH_MODE"] = "token"
    if not os.environ.get("RAY_AUTH_TOKEN"):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        from ray._private import ray_constants
        from ray._raylet import AuthenticationTokenLoader, Config
        ray_constants.ENABLE_RAY_CLUSTER = False
        Config.initialize("")           # Ray's cached settings: they read the mode at import
        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):     # pragma: no cover - another Ray layout
        logger.warning("could not make the local Ray instance listen on loopback only, with "
                       "token authentication")


def _shut_down_and_remove(ray, temp_dir, reaper):
    """At exit: stop the local Ray instance we started (Ray's own exit hook, registered when
    Ray was imported, would run after this one), then end its reaper, which removes its files."""
    try:
        ray.shutdown()
    finally:
        ray_reaper.stop(reaper)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _writable(obj):
    """``obj`` with every read-only numpy array inside lists, tuples and dicts copied, so that it
    can be written to. Containers are rebuilt only where something changed; anything else is
    left as it is."""
    t = type(obj)
    if t is list or t is tuple or t is dict:
        items = obj.items() if t is dict else enumerate(obj)
        out = None
        for k, x in items:
            if isinstance(x, _WALKED):
                y = _writable(x)
                if y is not x:
                    if out is None:
                        out = dict(obj) if t is dict else list(obj)
                    out[k] = y
        if out is None:
            return obj
        return tuple(out) if t is tuple else out
    if isinstance(obj, np.ndarray) and not obj.flags.writeable:
        return obj.copy()
    return obj


_WALKED = (list, tuple, dict, np.ndarray)


_FAILED = "failed"
_RESULTS = "results"


class _ActorBody:
    """What runs in each Ray actor: ``make_func(wid)`` once, then :func:`run_chunk` per chunk.

    Results travel as ``("results", [(seq, kind, value)], busy)`` with each
    :class:`~.protocol.WorkerError` pickled by :func:`~.transport.pickle_error` (so the exception
    arrives with its class, args and attributes, see :func:`~.protocol.pack_exception`, even when
    it does not pickle as a whole); ``("failed", pickled error)``
    when the worker cannot run chunks at all (``make_func`` raised, or something outside one
    datapoint did).
    """

    def __init__(self, make_func, wid, seed, cv_threads=1):
        rng.seed_worker(wid, seed)
        cvthreads.set_process_limit(cv_threads)
        torchthreads.set_process_limit(cv_threads)
        self.wid = wid
        self.failure = None
        try:
            self.func = make_func(wid)
        except BaseException as e:
            self.failure = pickle_error(WorkerError.from_exception(
                e, f"make_func of Ray actor worker {wid}"))

    def info(self):
        """``(pid, node ip)`` of this actor, for messages."""
        import ray                  # optional dependency; this runs in the actor, where Ray is loaded
        return os.getpid(), ray.util.get_node_ip_address()

    def run(self, run, items):
        if self.failure is not None:
            return _FAILED, self.failure
        try:
            items = [(seq, index, _writable(dp)) for seq, index, dp in items]
            results, busy = run_chunk(self.func, run, items)
        except BaseException as e:
            self.failure = pickle_error(WorkerError.from_exception(
                e, f"Ray actor worker {self.wid} (pid {os.getpid()})"))
            return _FAILED, self.failure
        return _RESULTS, [(seq, kind, pickle_error(v) if kind == ERR else v)
                          for seq, kind, v in results], busy


def _actor_class_of(ray):
    global _actor_class
    if _actor_class is None:
        _actor_class = ray.remote(_ActorBody)
    return _actor_class


class _Chunk:
    """One chunk in flight: its items (kept for a resubmission) and the slot it went to."""
    __slots__ = ("run", "items", "slot")

    def __init__(self, run, items, slot):
        self.run, self.items, self.slot = run, items, slot


class _Slot:
    """The consumer's handle on one actor (one incarnation of worker ``wid``). Has what
    :func:`~.supervisor.check_workers` needs: ``busy_since``, ``next_warning``, ``describe()``."""

    def __init__(self, wid, name, actor, info_ref):
        self.wid, self.name, self.actor = wid, name, actor
        self.info_ref = info_ref
        self.chunks = {}            # ObjectRef -> _Chunk, in submission order
        self.num_items = 0
        self.busy_since = None      # when its current work last made progress
        self.next_warning = None

    def add(self, ref, chunk):
        if not self.chunks:
            self.busy_since, self.next_warning = time.monotonic(), None
        self.chunks[ref] = chunk
        self.num_items += len(chunk.items)

    def remove(self, ref):
        chunk = self.chunks.pop(ref)
        self.num_items -= len(chunk.items)
        self.busy_since = time.monotonic() if self.chunks else None
        self.next_warning = None
        return chunk

    def info(self, ray):
        """``(pid, node ip)`` once the actor has started, else ``None``; never blocks."""
        try:
            done, _ = ray.wait([self.info_ref], timeout=0)
            return ray.get(done[0]) if done else None
        except Exception:
            return None

    def where(self, ray):
        """'Ray actor NAME (worker W, pid P on IP)', with pid and node once the actor said."""
        info = self.info(ray)
        extra = "" if info is None else f", pid {info[0]} on {info[1]}"
        return f"Ray actor {self.name} (worker {self.wid}{extra})"

    def held(self, chunks=None):
        return sorted(index for c in (self.chunks.values() if chunks is None else chunks)
                      for _, index, _ in c.items)

    def describe(self):
        ray = import_ray()
        if self.info(ray) is None:      # Ray has not started the actor yet (no free CPU?)
            return (f"datapoints {_show(self.held())} have been waiting for "
                    f"{self.where(ray)} to start")
        return f"datapoints {_show(self.held())} have been in {self.where(ray)}"


def _show(indices):
    return ", ".join(f"#{i}" for i in indices[:20]) + (" ..." if len(indices) > 20 else "")


class RayExecutor(Executor):
    """``num_workers`` Ray actors, each running ``make_func(worker_id)`` once and then the map
    function it returns on every chunk sent to it (the :class:`~.protocol.Executor` contract).

    ``submit`` sends a chunk at once, as a Ray task, to the actor with the fewest datapoints in
    flight; Ray queues it there (an actor runs its chunks one at a time, in order). ``get`` waits
    with ``ray.wait`` for any finished chunk. How many datapoints are out is the mapper's
    ``buffer_size``. See the module doc for the Ray instance, arrays, dead actors and deadlines.

    Args:
        num_workers: number of actors.
        make_func: ``worker_id -> map function``; sent to the actors once (``ray.put``), so it
            may be a lambda or closure.
        address: Ray cluster to join if this process is not connected to Ray yet (default:
            ``$RAY_ADDRESS``, else a new local instance).
        max_restarts: how many dead actors may be replaced before :class:`WorkerCrashedError`.
        num_cpus_per_worker: the CPUs each actor reserves (Ray's ``num_cpus``).
    """
    kind = RAY

    def __init__(self, num_workers, make_func, address=None, max_restarts=0,
                 num_cpus_per_worker=1):
        _check_max_restarts(max_restarts)
        num_cpus_per_worker = _check_cpus(num_cpus_per_worker)
        self.max_restarts = max_restarts
        self.restarts = 0
        self.num_cpus_per_worker = num_cpus_per_worker
        self._closed = False
        self._owner_pid = os.getpid()
        self._tag = f"dataflow-{uuid.uuid4().hex[:10]}"
        self._incarnations = itertools.count()
        self._pending = {}                      # ObjectRef -> _Chunk, every chunk in flight
        self._ready = collections.deque()       # (results, busy) waiting for get()
        self._slots = []
        self._ray = ray = ensure_ray(address, num_workers * num_cpus_per_worker)
        self._check_capacity(num_workers)
        try:
            self._func_ref = ray.put(make_func)
            self._slots = [self._start(wid) for wid in range(num_workers)]
        except BaseException:
            self.close()
            raise

    def _check_capacity(self, num_workers):
        need = num_workers * self.num_cpus_per_worker
        try:
            total = self._ray.cluster_resources().get("CPU", 0)
            free = self._ray.available_resources().get("CPU", 0)
            # the CPUs of actors this process killed just now may still be on their way back
            while free < need and _last_kill is not None and \
                    time.monotonic() < _last_kill + _RELEASE_WAIT:
                time.sleep(_RELEASE_POLL)
                free = self._ray.available_resources().get("CPU", 0)
        except Exception:
            return
        if free < need:
            # (other actors, another pipeline's say, may hold the cluster's CPUs)
            logger.warning("%d Ray actors need %g CPUs but the Ray cluster has %g free now (of "
                           "%g); the rest wait until CPUs are freed or the cluster grows, and "
                           "the datapoints dealt to them wait with them", num_workers, need,
                           free, total)

    def _start(self, wid):
        name = f"{self._tag}-w{wid}.{next(self._incarnations)}"
        actor = _actor_class_of(self._ray).options(
            name=name, num_cpus=self.num_cpus_per_worker, max_restarts=0,
            max_task_retries=0).remote(self._func_ref, wid, rng.get_seed(),
                                       max(1, int(self.num_cpus_per_worker)))
        return _Slot(wid, name, actor, actor.info.remote())

    @property
    def actor_names(self):
        """Names of the live incarnations of the actors (their namespace is the driver's)."""
        return [s.name for s in self._slots]

    def submit(self, run, items):
        if self._closed:
            raise RuntimeError(CLOSED_WHILE_ITERATING)
        slot = min(self._slots, key=lambda s: s.num_items)
        self._send(slot, _Chunk(run, items, slot))

    def _send(self, slot, chunk):
        try:
            ref = slot.actor.run.remote(chunk.run, chunk.items)
        except Exception as e:          # an argument Ray cannot serialise
            raise TypeError(f"datapoints {_show(sorted(i for _, i, _ in chunk.items))} of the "
                            f"source cannot be sent to a Ray actor: {type(e).__name__}: {e}"
                            ) from e
        chunk.slot = slot
        slot.add(ref, chunk)
        self._pending[ref] = chunk

    def get(self, timeout=None):
        ray = self._ray
        while not self._ready:
            if self._closed:
                raise RuntimeError(CLOSED_WHILE_ITERATING)
            if not self._pending:
                raise RuntimeError("RayExecutor.get() with no chunk in flight")
            # (at most supervisor.SIGNAL_CHECK at a time: a close() from another thread is seen
            # promptly too)
            wait = next_wait(self._slots, timeout, config.current_hang_timeout(), self._warn_hung)
            done, _ = ray.wait(list(self._pending), num_returns=1, timeout=wait)
            for ref in done:
                if ref in self._pending:
                    self._collect_through(ref)
        return self._ready.popleft()

    def _collect_through(self, ref):
        """Collect the chunk of ``ref`` and, before it, the chunks sent earlier to the same
        actor. An actor runs its chunks in order, so those are finished too, but ``ray.wait``
        may report a later one first; taking them in order hands each worker's results to the
        mapper in the order the worker made them (a runner's copies count on it: its
        checkpoint records where each copy is by the last datapoint received from it)."""
        for earlier in list(self._pending[ref].slot.chunks):
            if earlier in self._pending:        # (a death collects or drops the rest)
                self._collect(earlier)
            if earlier == ref:
                break

    def _collect(self, ref):
        ray = self._ray
        chunk = self._pending[ref]
        try:
            payload = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            if self._closed:
                raise RuntimeError(CLOSED_WHILE_ITERATING) from None
            self._died(chunk.slot, e)
            return
        except ray.exceptions.RayTaskError as e:
            # The actor ran the chunk but Ray could not ship a result back (it did not pickle).
            exc = e.as_instanceof_cause()
            raise TypeError(f"a result of datapoints {_show(chunk.slot.held([chunk]))} cannot "
                            f"be sent from {chunk.slot.where(ray)} to the consumer: "
                            f"{type(exc).__name__}") from exc
        del self._pending[ref]
        chunk.slot.remove(ref)
        self._accept(payload)

    def _accept(self, payload):
        if payload[0] == _FAILED:
            raise unpickle_error(payload[1]).to_exception()
        _, results, busy = payload
        self._ready.append(([(seq, kind, unpickle_error(v) if kind == ERR else _writable(v))
                             for seq, kind, v in results], busy))

    def _died(self, slot, exc):
        """An actor is gone: keep what it finished, then restart it with the rest, or raise."""
        ray = self._ray
        refs = list(slot.chunks)
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=_DEATH_GRACE)
        lost = []
        for ref in refs:
            chunk = self._pending.pop(ref)
            slot.remove(ref)
            payload = None
            if ref in done:
                try:
                    payload = ray.get(ref)
                except ray.exceptions.RayActorError:
                    pass
            if payload is None:
                lost.append(chunk)
            else:
                self._accept(payload)
        held = slot.held(lost)
        holding = f" while holding datapoints {_show(held)}" if held else ""
        text = str(exc).strip() or type(exc).__name__
        # Our __init__ catches make_func's errors, so a failed creation task means Ray could not
        # build the actor (dataflow or the map function's module not importable on that node,
        # say): a new actor would fail the same way, so it is not restarted.
        init_failed = getattr(exc, "actor_init_failed", False)
        if init_failed:
            message = (f"{slot.where(ray)}" + (f", which held datapoints {_show(held)}," if held
                                                else "") + f" could not be created: {text}")
        else:
            message = f"{slot.where(ray)} died{holding} ({text.splitlines()[0]})"
        try:
            ray.kill(slot.actor, no_restart=True)
        except Exception:
            pass
        if init_failed or self.restarts >= self.max_restarts:
            if self.max_restarts and not init_failed:
                message += f"; max_restarts={self.max_restarts} restarts already used"
            raise WorkerCrashedError(message, pid=self._pid_of(slot), datapoints=held) from exc
        self.restarts += 1
        logger.warning("%s; starting a new actor (restart %d of %d)", message, self.restarts,
                       self.max_restarts)
        new = self._slots[slot.wid] = self._start(slot.wid)
        for chunk in lost:
            self._send(new, chunk)

    def _pid_of(self, slot):
        info = slot.info(self._ray)
        return None if info is None else info[0]

    def _warn_hung(self, slot, waited):
        logger.warning("%s for %.1f s (hang_timeout=%s s); see its stack with `ray stack` on "
                       "that node, or `py-spy dump --pid PID`", slot.describe(), waited,
                       config.current_hang_timeout())

    def close(self):
        """Kill our actors (``ray.kill``: returns at once) and forget the work in flight.
        Idempotent; never shuts Ray down (see the module doc)."""
        global _last_kill
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._owner_pid:
            return          # a copy in a forked child: the actors are not its own
        ray = self._ray
        try:
            if ray.is_initialized():
                for slot in self._slots:
                    ray.kill(slot.actor, no_restart=True)
                if self._slots:
                    _last_kill = time.monotonic()
        except Exception as e:          # Ray going down at interpreter exit
            logger.debug("RayExecutor.close: %s", e)
        self._pending.clear()
        self._ready.clear()


def _check_max_restarts(n):
    check_int("max_restarts", n, 0)


# CPUs an actor may reserve: more than any machine has is a mistake (Ray refuses quantities
# above 1e14 only when the actor is made, and waits for ever for what no node has)
_MAX_CPUS_PER_WORKER = 4096


def _check_cpus(n):
    n = check_positive_number("num_cpus_per_worker", n)
    if not n <= _MAX_CPUS_PER_WORKER:
        raise ValueError(f"num_cpus_per_worker must be at most {_MAX_CPUS_PER_WORKER}, got {n!r}")
    return n


class _RayChunks:
    """Chunk sizing for Ray (mixed into the Ray dataflows, before :class:`ParallelMapData`)."""

    def _chunk_size(self):
        """Datapoints per Ray task: about :data:`CHUNK_SECONDS` of work, but small enough that
        ``buffer_size`` keeps two chunks in flight per actor (with many actors, raise
        ``buffer_size`` rather than let chunks shrink to where Ray's overhead dominates)."""
        per_item = self._state.per_item
        if self._warming_up() or self.executor != "ray":
            return super()._chunk_size()
        want = max(1, min(_MAX_CHUNK, int(CHUNK_SECONDS / max(per_item, 1e-7))))
        fit = max(1, self.buffer_size // (2 * self.num_workers))
        if fit * 4 <= want and want * per_item >= CHUNK_SECONDS / 2 and \
                not getattr(self, "_warned_buffer", False):
            self._warned_buffer = True
            logger.warning("%s: buffer_size=%d leaves %d datapoints per Ray task for %d actors, "
                           "where %d would keep Ray's per-task overhead small; use "
                           "buffer_size >= %d", type(self).__name__, self.buffer_size, fit,
                           self.num_workers, want, 2 * want * self.num_workers)
        return min(want, fit)


class RayMapData(_RayChunks, ParallelMapData):
    """Apply ``map_func`` to the datapoints of ``ds`` in ``num_workers`` Ray actors.

    Same arguments and guarantees as :class:`~dataflow.MultiProcessMapData` (``buffer_size``,
    ``strict``, ``ordered``, ``on_error``, ``max_errors``, ``max_restarts``, ``timeout``): they
    are the mapper's, so every executor behaves the same. Plus:

    * ``address``: the Ray cluster to join when this process is not connected to Ray yet
      (default ``$RAY_ADDRESS``, else a new local instance; see :mod:`dataflow.parallel.ray`).
    * ``num_cpus_per_worker``: CPUs each actor reserves.

    The source is read in the consuming process and datapoints travel to the actors through Ray;
    put heavy reading (decoding files, say) in ``map_func`` so it runs on the cluster. Arrays
    reach ``map_func`` and the consumer writable (read-only arrays from Ray's object store are
    copied). ``map_func`` may be a lambda or closure; the ``dataflow`` package must be
    importable on every node (install it there, or pass ``runtime_env`` to ``ray.init``).
    In debug mode (:func:`dataflow.config.set_debug_mode`) the map runs serially in the
    consuming thread and Ray is not used.
    """
    executor = RAY

    def __init__(self, ds, num_workers, map_func, *, address=None, buffer_size=200,
                 strict=False, ordered=False, on_error="raise", max_errors=None,
                 max_restarts=0, num_cpus_per_worker=1, timeout=None):
        super().__init__(ds, num_workers, map_func, buffer_size=buffer_size, strict=strict,
                         ordered=ordered, on_error=on_error, max_errors=max_errors,
                         timeout=timeout)
        _check_max_restarts(max_restarts)
        num_cpus_per_worker = _check_cpus(num_cpus_per_worker)
        self.address = _checked_address(address)
        self.max_restarts = max_restarts
        self.num_cpus_per_worker = num_cpus_per_worker
        if config.debug_mode():
            self.executor = SERIAL
        else:
            import_ray()            # fail at construction, with the install hint

    def _make_executor(self):
        if self.executor == SERIAL:
            return InlineExecutor(Constant(self._staged_func()))
        return RayExecutor(self.num_workers, Constant(self._staged_func()), address=self.address,
                           max_restarts=self.max_restarts,
                           num_cpus_per_worker=self.num_cpus_per_worker)


class RayRunner(_RayChunks, CopiesRunner):
    """Run ``num_workers`` copies of ``ds``, one per Ray actor, and yield their datapoints in
    arrival order, at most ``num_prefetch`` ahead of the consumer (:class:`~dataflow.
    MultiProcessRunner` on Ray).

    Each actor receives its own copy of ``ds`` (pickled), resets it (each draws its own random
    stream) and repeats it forever; each ``__iter__`` pass yields ``len(ds)`` datapoints when that
    is known, and never ends otherwise. ``address``, ``max_restarts`` and ``num_cpus_per_worker``
    are as for :class:`RayMapData`; a restarted actor starts a fresh copy of ``ds``.
    ``state_dict()`` records where each copy is; a state loads into a ``RayRunner`` with the
    same ``num_workers`` (or another runner with as many copies).
    """
    executor = RAY
    _copies_name = "num_workers"

    def __init__(self, ds, num_workers, *, num_prefetch=50, address=None, max_restarts=0,
                 num_cpus_per_worker=1, timeout=None):
        _check_max_restarts(max_restarts)
        num_cpus_per_worker = _check_cpus(num_cpus_per_worker)
        import_ray()
        self.address = _checked_address(address)
        self.max_restarts = max_restarts
        self.num_cpus_per_worker = num_cpus_per_worker
        super().__init__(ds, num_workers, num_prefetch, timeout=timeout)

    def _make_executor(self):
        return RayExecutor(self.num_workers, self._own_copies(), address=self.address,
                           max_restarts=self.max_restarts,
                           num_cpus_per_worker=self.num_cpus_per_worker)
