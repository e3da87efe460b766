"""The systems under comparison: how to load each family, build a stream, and tear it down.

Nothing here is imported by the harness process except the plain tables at the top (``SYSTEMS``,
``FAMILIES``); the loaders run inside a family's fork server.
"""
import gc
import importlib
import itertools
import warnings

from .peers import PEER_BATCH_NOTES, PEER_FAMILIES, PEER_SYSTEMS

# name -> (family, kind, counterpart in dataflow for the pair-by-pair ratio, one-line description)
SYSTEMS = {
    "dataflow-serial": ("dataflow", "serial", None,
                        "dataflow.MapData(ds, f)"),
    "dataflow-threads": ("dataflow", "threads", None,
                         "dataflow.MultiThreadMapData(ds, num_thread={w}, map_func=f, "
                         "buffer_size=200, strict=True)"),
    "dataflow-processes": ("dataflow", "processes", None,
                           "dataflow.MultiProcessMapData(ds, num_proc={w}, map_func=f, "
                           "buffer_size=200, strict=True)"),
    "dataflow-table": ("dataflow", "table", None,
                       "dataflow.MapData(ds, ops, num_parallel_workers={w}, "
                       "python_multiprocessing=True): where the run-in-thread table puts it"),
    "dataflow-processes-1": ("dataflow", "processes-1", None,
                             "dataflow.MultiProcessMapData(ds, num_proc=1, map_func=f, "
                             "buffer_size=200, strict=True)"),
    "dataflow-processes-auto": ("dataflow", "processes-auto", None,
                                "dataflow.MultiProcessMapData(ds, num_proc=\"auto\", map_func=f, "
                                "buffer_size=200, strict=True): autotuned workers"),
    "dataflow-batch32": ("dataflow", "batch32", None,
                         "dataflow.MultiProcessMapAndBatchData(ds, num_proc={w}, map_func=f, "
                         "batch_size=32): mapped and batched in its workers (a bare array "
                         "result as [array]); the consumer reads the batches"),
    "tensorpack-serial": ("tensorpack", "serial", "dataflow-serial",
                          "tensorpack MapData(RepeatedData(ds, -1), f)"),
    "tensorpack-threads": ("tensorpack", "threads", "dataflow-threads",
                           "tensorpack MultiThreadMapData(ds, {w}, f, buffer_size=200, strict=True)"),
    "tensorpack-processes": ("tensorpack", "processes", "dataflow-processes",
                             "tensorpack MultiProcessMapDataZMQ(ds, {w}, f, buffer_size=200, "
                             "strict=True)"),
    "torch": ("torch", "processes", "dataflow-processes",
              "torch DataLoader(MapStyleDataset, num_workers={w}, batch_size=None)"),
    "torch-batch32": ("torch", "processes", "dataflow-batch32",
                      "torch DataLoader(MapStyleDataset, num_workers={w}, batch_size=32): "
                      "collated in its workers; the consumer reads the batches"),
    "torch-serial": ("torch", "serial", "dataflow-serial",
                     "torch DataLoader(MapStyleDataset, num_workers=0, batch_size=None)"),
}
SYSTEMS.update(PEER_SYSTEMS)
FAMILIES = ("dataflow", "tensorpack", "torch") + PEER_FAMILIES

# Systems whose worker count is fixed (they run once per repeat whatever --workers says), besides
# the serial ones.
FIXED_WORKERS = {"dataflow-processes-1": 1, "dataflow-processes-auto": "auto"}

# The workloads whose stream yields batches of 32 (each library batching its own way).
BATCHED = ("img", "fbresnet")
# The workloads that read an LMDB file sequentially.
LMDB = ("lmdb", "lmdb-tiny")

# Systems that exist only for some workloads (every other system runs every workload).
ONLY_FOR = {"dataflow-table": BATCHED,
            # autotuning against the fixed counts: the workloads whose work is in the workers
            "dataflow-processes-1": (4, 5), "dataflow-processes-auto": (4, 5)}
# Systems that batch 32 datapoints in their workers: the consumer reads batches, where every other
# system of workloads 1-5 and lmdb-tiny delivers datapoints, so the ranking leaves them out; the
# table pairs them with each other. They skip the batched workloads, where torch's per-sample
# loader already batches 32 in the loader (torch-batch32 would be the same system there), and
# lmdb, whose records (JPEG-sized arrays of different lengths) stack into no batch array.
BATCHING = ("dataflow-batch32", "torch-batch32")
NOT_FOR = {s: BATCHED + ("lmdb",) for s in BATCHING}

# What each system runs in workload "img" (ops = workloads.img_ops: Decode, RandomCrop(224),
# RandomHorizontalFlip, Normalize, HWC2CHW, all with index=0; h = workloads.img_pipeline_ops, a
# Python function calling Compose(ops): the same map function in every library).
IMG_DESCRIPTIONS = {
    "dataflow-serial": "BatchData(MapData(ds, ops), 32)",
    "dataflow-threads": "BatchData(MapData(ds, ops, num_parallel_workers={w}, "
                        "python_multiprocessing=False), 32)",
    "dataflow-processes": "BatchData(MultiProcessMapData(ds, {w}, h, strict=True, "
                          "ordered=True), 32)",
    "dataflow-table": "BatchData(MapData(ds, ops, num_parallel_workers={w}, "
                      "python_multiprocessing=True), 32)",
    "tensorpack-serial": "BatchData(MapData(RepeatedData(ds, -1), h), 32)",
    "tensorpack-threads": "BatchData(MultiThreadMapData(ds, {w}, h, buffer_size=200, "
                          "strict=True), 32)",
    "tensorpack-processes": "BatchData(MultiProcessMapDataZMQ(ds, {w}, h, buffer_size=200, "
                            "strict=True), 32)",
    "torch": "DataLoader(MapStyleDataset(h), batch_size=32, num_workers={w}): batched in the loader",
    "torch-serial": "DataLoader(MapStyleDataset(h), batch_size=32, num_workers=0)",
}
# ... in workload "fbresnet" (f = workloads.map_fbresnet: cv2.imdecode BGR, then dataflow's
# AugmentorList(fbresnet_augmentor), the same function in every system).
FB_DESCRIPTIONS = {
    "dataflow-serial": "BatchData(MapData(ds, f), 32)",
    "dataflow-threads": "BatchData(MultiThreadMapData(ds, num_thread={w}, map_func=f, "
                        "buffer_size=200, strict=True), 32)",
    "dataflow-processes": "BatchData(MultiProcessMapData(ds, num_proc={w}, map_func=f, "
                          "buffer_size=200, strict=True), 32)",
    "dataflow-table": "BatchData(MapData(ds, [ops.Lambda(native(imdecode_bgr), index=0), "
                      "ops.Augment(fbresnet_augmentor(imgaug), index=0, copy=False)], "
                      "num_parallel_workers={w}, python_multiprocessing=True), 32)",
    "tensorpack-serial": "BatchData(MapData(RepeatedData(ds, -1), f), 32)",
    "tensorpack-threads": "BatchData(MultiThreadMapData(ds, {w}, f, buffer_size=200, "
                          "strict=True), 32)",
    "tensorpack-processes": "BatchData(MultiProcessMapDataZMQ(ds, {w}, f, buffer_size=200, "
                            "strict=True), 32)",
    "torch": "DataLoader(MapStyleDataset(f), batch_size=32, num_workers={w}): batched in the "
             "loader",
    "torch-serial": "DataLoader(MapStyleDataset(f), batch_size=32, num_workers=0)",
}
# ... in the LMDB workloads: the serial dataflow and tensorpack systems read the file with their
# LMDBSerializer; every other system maps f = workloads.read_lmdb (or read_lmdb_tiny: open the
# file once per process, read-only, lock=False; get record k; decode) over ds = [[k] for k in
# range(records)].
LMDB_DESCRIPTIONS = {
    "dataflow-serial": "dataflow.LMDBSerializer.load(path, shuffle=False)",
    "tensorpack-serial": "tensorpack LMDBSerializer.load(path, shuffle=False) "
                         "(TENSORPACK_SERIALIZE=msgpack)",
}


def applies(system, workload):
    """Whether ``system`` runs ``workload`` at all."""
    return workload in ONLY_FOR.get(system, (workload,)) and workload not in NOT_FOR.get(system, ())


def is_serial(system):
    return SYSTEMS[system][1] == "serial"


def workers_of(system, workers):
    """The worker count ``system`` runs with when the harness asks for ``workers``: None for a
    serial system, the fixed count of a FIXED_WORKERS one, else ``workers``."""
    if is_serial(system):
        return None
    return FIXED_WORKERS.get(system, workers)


def description(system, workload, workers=2):
    family = SYSTEMS[system][0]
    special = {"img": IMG_DESCRIPTIONS, "fbresnet": FB_DESCRIPTIONS}.get(workload)
    if special is None and workload in LMDB:
        special = LMDB_DESCRIPTIONS
    if special is not None and system in special:
        text = special[system]
    elif workload in BATCHED and family in PEER_BATCH_NOTES:
        text = SYSTEMS[system][3] + ", " + PEER_BATCH_NOTES[family]
    elif workload in LMDB:
        text = SYSTEMS[system][3] + "; f = workloads.%s" % (
            "read_lmdb" if workload == "lmdb" else "read_lmdb_tiny")
    else:
        text = SYSTEMS[system][3]
    return text.replace("{w}", str(workers))

# The dataflow names each dataflow system needs.
_DATAFLOW_NEEDS = {
    "dataflow-serial": ("DataFromList", "MapData"),
    "dataflow-threads": ("DataFromList", "MultiThreadMapData"),
    "dataflow-processes": ("DataFromList", "MultiProcessMapData"),
    "dataflow-processes-1": ("DataFromList", "MultiProcessMapData"),
    "dataflow-processes-auto": ("DataFromList", "MultiProcessMapData", "stats"),
    "dataflow-batch32": ("DataFromList", "MultiProcessMapAndBatchData"),
    "dataflow-table": ("DataFromList", "MapData", "BatchData", "ops"),
}
# ... and what workload "img" needs on top (the built-in ops; MapData with workers).
_DATAFLOW_IMG_NEEDS = ("BatchData", "MapData", "MultiProcessMapData", "ops", "ops.Compose",
                       "ops.Decode", "ops.RandomCrop", "ops.RandomHorizontalFlip",
                       "ops.Normalize", "ops.HWC2CHW")

# ... and what workload "fbresnet" needs for dataflow-table.
_DATAFLOW_FB_TABLE_NEEDS = ("BatchData", "MapData", "native", "imgaug", "ops.Lambda",
                            "ops.Augment")

# numpy 2 removed these aliases; tensorpack 0.11 uses some of them in a few places.
_NUMPY_ALIASES = {"bool": bool, "object": object, "int": int, "float": float, "complex": complex,
                  "str": str, "long": int, "unicode": str}


def _accepts(cls, arg):
    import inspect
    try:
        return arg in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def _version(mod):
    return getattr(mod, "__version__", None)


# ---------------------------------------------------------------------------- family loading
class Family:
    """What a fork server holds after importing a family: modules and per-system availability."""

    def __init__(self, name, dataflow_module="dataflow"):
        self.name = name
        self.dataflow_module = dataflow_module
        self.mods = {}
        self.available = {}      # system -> None (available) or the reason it is not
        self.unavailable_for = {}  # workload -> {system: why it cannot run that workload}
        self.notes = []
        self.versions = {}
        loader = getattr(self, "_load_" + name, None)
        if loader is not None:
            loader()
        else:                   # a peer of peers.py: grain, spdl, torchdata
            from . import peers
            self.mods, self.versions, self.notes = peers.load(name)
            for system in self._systems():
                self.available[system] = None
        self._check_img()
        self._check_fbresnet()
        self._check_lmdb()

    def _missing(self, paths):
        """The dotted names of ``paths`` that the dataflow module lacks."""
        missing = []
        for path in paths:
            obj = self.mods["df"]
            for part in path.split("."):
                obj = getattr(obj, part, None)
            if obj is None:
                missing.append(path)
        return missing

    def _check_img(self):
        from .workloads import img_available
        reason = img_available()
        missing = []
        if self.name == "dataflow":
            mod = self.mods["df"]
            missing = self._missing(_DATAFLOW_IMG_NEEDS)
            if not missing and not _accepts(mod.MapData, "num_parallel_workers"):
                missing.append("MapData(num_parallel_workers=...)")
        if missing:
            reason = "%s has no %s" % (self.dataflow_module, ", ".join(missing))
        if reason:
            self.unavailable_for["img"] = {s: reason for s in self._systems()}

    def _check_fbresnet(self):
        from .workloads import fbresnet_available
        reason = fbresnet_available()
        if reason:
            self.unavailable_for["fbresnet"] = {s: reason for s in self._systems()}
        elif self.name == "dataflow":
            missing = self._missing(_DATAFLOW_FB_TABLE_NEEDS)
            if not missing and not _accepts(self.mods["df"].MapData, "num_parallel_workers"):
                missing.append("MapData(num_parallel_workers=...)")
            if missing:
                self.unavailable_for["fbresnet"] = {
                    "dataflow-table": "%s has no %s" % (self.dataflow_module, ", ".join(missing))}

    def _check_lmdb(self):
        from .workloads import lmdb_available
        for wid in LMDB:
            reason = lmdb_available(wid)
            if reason:
                self.unavailable_for[wid] = {s: reason for s in self._systems()}
            elif self.name == "dataflow" and self._missing(("LMDBSerializer",)):
                self.unavailable_for[wid] = {
                    "dataflow-serial": "%s has no LMDBSerializer" % self.dataflow_module}

    def _systems(self):
        return [s for s, spec in SYSTEMS.items() if spec[0] == self.name]

    def _load_dataflow(self):
        mod = importlib.import_module(self.dataflow_module)
        self.mods["df"] = mod
        self.versions[self.dataflow_module] = _version(mod)
        self.versions[self.dataflow_module + " file"] = getattr(mod, "__file__", None)
        for system in self._systems():
            missing = [n for n in _DATAFLOW_NEEDS[system] if getattr(mod, n, None) is None]
            self.available[system] = (
                None if not missing else
                "%s has no %s (not written yet, or not exported from its __init__)"
                % (self.dataflow_module, ", ".join(missing)))

    def _load_tensorpack(self):
        import numpy as np
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tp = importlib.import_module("tensorpack.dataflow")
        except AttributeError as exc:
            # The minimal numpy-2 workaround: restore the removed aliases, then import again.
            # (Not needed by tensorpack 0.11's dataflow as of numpy 2.4; kept as a fallback.)
            if "numpy" not in str(exc):
                raise
            patched = []
            for alias, value in _NUMPY_ALIASES.items():
                if not hasattr(np, alias):
                    setattr(np, alias, value)
                    patched.append(alias)
            self.notes.append("tensorpack failed to import under numpy %s (%s); restored the "
                              "removed numpy aliases %s before importing it again"
                              % (np.__version__, exc, ", ".join("np." + n for n in patched)))
            tp = importlib.import_module("tensorpack.dataflow")
        import tensorpack
        self.mods["tp"] = tp
        self.versions["tensorpack"] = _version(tensorpack)
        for system in self._systems():
            self.available[system] = None

    def _load_torch(self):
        import torch
        import torch.utils.data  # noqa: F401
        from . import _torch_dataset
        self.mods["torch"] = torch
        self.mods["torch_ds"] = _torch_dataset
        self.versions["torch"] = _version(torch)
        for system in self._systems():
            self.available[system] = None


# ---------------------------------------------------------------------------- streams
class _Passes(itertools.chain):
    """What :func:`_passes` returns: ``chain`` with a generator's ``close()``, which closes the
    running pass's iterator (unwinding the dataflow's own generator)."""

    __slots__ = ("_iters", "_current")

    def close(self):
        iters, self._iters = self._iters, None
        if iters is not None:
            iters.close()
        close = getattr(self._current[0] if self._current else None, "close", None)
        if close is not None:
            close()


def _passes(df):
    """Endless iteration of a dataflow, pass after pass (each ``iter`` is one strict pass), in C
    like the peers' passes (``itertools`` over their sources): the harness runs no Python frame
    per datapoint, for any library."""
    current = []

    def iters():
        while True:
            current[:] = [iter(df)]
            yield current[0]

    gen = iters()
    out = _Passes.from_iterable(gen)
    out._iters, out._current = gen, current
    return out


class Stream:
    """A started system: ``it`` yields datapoints; ``teardown`` is what the run times."""

    def __init__(self, obj, it, has_close, keep=(), detail=None, per_item=None):
        self.obj = obj                # what teardown closes (or drops)
        self.it = it
        self.has_close = has_close
        self.keep = list(keep)        # more references teardown drops
        self.detail = detail          # a note for the table (e.g. the executor the table chose)
        self.per_item = per_item      # datapoints per yielded item, if not the workload's batch

    def teardown(self):
        """close() where the system has one, else drop every reference and gc.collect()."""
        it, self.it = self.it, None
        if hasattr(it, "close"):      # our pass generator: unwinds the dataflow's own generator
            it.close()
        if self.has_close:
            self.obj.close()
            self._dropped_it = it     # released untimed, in release()
        else:
            del it
            self.obj = None
            self.keep = []
            gc.collect()

    def release(self):
        """Untimed: drop whatever teardown kept."""
        self.__dict__.clear()
        gc.collect()


def open_stream(family, system, workload, source, passes, workers=2):
    """Construct the system over ``source`` and reset it; returns a :class:`Stream`.

    ``passes`` is how many passes over ``source`` the run may consume (used by torch and the
    peers of peers.py, whose sources get that length; dataflow and tensorpack just iterate pass
    after pass). ``workers``: the worker count of a parallel system (see ``workers_of``).
    """
    kind = SYSTEMS[system][1]
    if not applies(system, workload.id):
        raise ValueError("%s does not run workload %s" % (system, workload.id))
    w = workers_of(system, workers)
    if system in PEER_SYSTEMS:
        from .peers import Job, open_stream as open_peer
        return open_peer(family, system, Job(source, workload.func, workload.batch, w, passes),
                         Stream)
    if workload.batch:
        return _open_img_stream(family, system, kind, workload, source, passes, w)
    if workload.id in LMDB and kind == "serial" and family.name in ("dataflow", "tensorpack"):
        return _open_lmdb_serializer(family, workload)
    f = workload.func
    if family.name == "dataflow":
        m = family.mods["df"]
        ds = m.DataFromList(source, shuffle=False)
        per_item = None
        if kind == "serial":
            df = m.MapData(ds, f)
        elif kind == "threads":
            df = m.MultiThreadMapData(ds, num_thread=w, map_func=f, buffer_size=200, strict=True)
        elif kind == "batch32":
            per_item = 32
            df = m.MultiProcessMapAndBatchData(ds, num_proc=w, map_func=_AsComponents(f),
                                               batch_size=per_item)
        else:
            df = m.MultiProcessMapData(ds, num_proc=w, map_func=f, buffer_size=200, strict=True)
        df.reset_state()
        return Stream(df, _passes(df), has_close=callable(getattr(df, "close", None)),
                      per_item=per_item)
    if family.name == "tensorpack":
        tp = family.mods["tp"]
        ds = tp.DataFromList(source, shuffle=False)
        if kind == "serial":
            df = tp.MapData(tp.RepeatedData(ds, -1), f)
            df.reset_state()
            return Stream(df, iter(df), has_close=False)
        if kind == "threads":
            df = tp.MultiThreadMapData(ds, w, f, buffer_size=200, strict=True)
        else:
            df = tp.MultiProcessMapDataZMQ(ds, w, f, buffer_size=200, strict=True)
        df.reset_state()
        return Stream(df, _passes(df), has_close=False)
    if family.name == "torch":
        torch = family.mods["torch"]
        dataset = family.mods["torch_ds"].MapStyleDataset(source, f, passes * len(source))
        bs = 32 if system == "torch-batch32" else None
        loader = torch.utils.data.DataLoader(dataset, num_workers=w or 0, batch_size=bs)
        it = iter(loader)
        return Stream(loader, it, has_close=False, per_item=bs,
                      detail="batch_size=32, collated in its workers" if bs else None)
    raise ValueError(system)


class _AsComponents:
    """``f`` for a dataflow batcher, which takes datapoints that are lists, tuples or dicts (as
    tensorpack's does): a bare result (workloads 2 and 3 return an array) becomes ``[result]``,
    so its batch is ``[the stacked arrays]`` where torch's collate gives the stacked arrays."""

    def __init__(self, f):
        self.f = f

    def __call__(self, dp):
        r = self.f(dp)
        return r if isinstance(r, (list, tuple, dict)) else [r]


# ---------------------------------------------------------------------------- LMDB serializers
def _open_lmdb_serializer(family, workload):
    """The serial dataflow / tensorpack system of an LMDB workload: the library's own
    ``LMDBSerializer.load(path, shuffle=False)``, pass after pass."""
    from .workloads import lmdb_path
    lib = family.mods["df"] if family.name == "dataflow" else family.mods["tp"]
    df = lib.LMDBSerializer.load(lmdb_path(workload.id), shuffle=False)
    df.reset_state()
    return Stream(df, _passes(df), has_close=callable(getattr(df, "close", None)))


# ------------------------------------------------------------- workloads "img" and "fbresnet"
def _open_fbresnet_dataflow(m, kind, workload, source, w):
    """dataflow's systems of workload "fbresnet": the plain mappers over the map function, or
    the run-in-thread table over the native decode and the augmentors as ops; then BatchData."""
    from .workloads import fbresnet_augmentors, imdecode_bgr
    ds = m.DataFromList(source, shuffle=False)
    f = workload.func
    if kind == "serial":
        mapped = m.MapData(ds, f)
    elif kind == "threads":
        mapped = m.MultiThreadMapData(ds, num_thread=w, map_func=f, buffer_size=200, strict=True)
    elif kind == "processes":
        mapped = m.MultiProcessMapData(ds, num_proc=w, map_func=f, buffer_size=200, strict=True)
    else:    # "table"
        ops = [m.ops.Lambda(m.native(imdecode_bgr), index=0),
               m.ops.Augment(fbresnet_augmentors(), index=0, copy=False)]
        mapped = m.MapData(ds, ops, num_parallel_workers=w, python_multiprocessing=True)
    df = m.BatchData(mapped, workload.batch)
    df.reset_state()
    executor = getattr(mapped, "executor", None)
    return Stream(mapped, _passes(df), has_close=callable(getattr(mapped, "close", None)),
                  keep=[df], detail="executor=%s" % executor if executor else None)


def _open_img_stream(family, system, kind, workload, source, passes, w):
    """The image pipeline (decode, crop, flip, normalize, CHW) then batches of 32; the stream
    yields batches."""
    bs = workload.batch
    if family.name == "dataflow" and workload.id == "fbresnet":
        return _open_fbresnet_dataflow(family.mods["df"], kind, workload, source, w)
    if workload.id == "img":
        # One pass over all the run may read, as the peers and torch get it: img's source is
        # 256 images, and a strict parallel map drains its workers at the end of every pass
        # (every 0.1 s here), which the peers' one long pass never does.
        source = source * passes
    if family.name == "dataflow":
        m = family.mods["df"]
        from .workloads import img_ops
        ds = m.DataFromList(source, shuffle=False)
        ops = img_ops(m)
        if kind == "serial":
            mapped = m.MapData(ds, ops)
            want = "serial"
        elif kind == "threads":
            mapped = m.MapData(ds, ops, num_parallel_workers=w, python_multiprocessing=False)
            want = "thread"
        elif kind == "processes":
            mapped = m.MultiProcessMapData(ds, w, workload.func, strict=True, ordered=True)
            want = "process"
        else:    # "table": what the run-in-thread table picks when processes are allowed
            mapped = m.MapData(ds, ops, num_parallel_workers=w, python_multiprocessing=True)
            want = None
        executor = getattr(mapped, "executor", None)
        if want is not None and executor != want:
            raise AssertionError("%s: expected .executor == %r, got %r" % (system, want, executor))
        df = m.BatchData(mapped, bs)
        df.reset_state()
        return Stream(mapped, _passes(df), has_close=callable(getattr(mapped, "close", None)),
                      keep=[df], detail="executor=%s" % executor)
    if family.name == "tensorpack":
        tp = family.mods["tp"]
        f = workload.func
        ds = tp.DataFromList(source, shuffle=False)
        if kind == "serial":
            df = tp.BatchData(tp.MapData(tp.RepeatedData(ds, -1), f), bs)
            df.reset_state()
            return Stream(df, iter(df), has_close=False)
        if kind == "threads":
            mapped = tp.MultiThreadMapData(ds, w, f, buffer_size=200, strict=True)
        else:
            mapped = tp.MultiProcessMapDataZMQ(ds, w, f, buffer_size=200, strict=True)
        df = tp.BatchData(mapped, bs)
        df.reset_state()
        return Stream(df, _passes(df), has_close=False)
    if family.name == "torch":
        torch = family.mods["torch"]
        workers = w or 0
        dataset = family.mods["torch_ds"].MapStyleDataset(source, workload.func,
                                                          passes * len(source))
        loader = torch.utils.data.DataLoader(dataset, batch_size=bs, num_workers=workers)
        return Stream(loader, iter(loader), has_close=False,
                      detail="batch_size=%d in the DataLoader%s"
                      % (bs, ", collated in its workers" if workers else ""))
    raise ValueError(system)
