"""The newer peers: grain, SPDL and torchdata.nodes, each in the configuration its documentation
recommends, behind one small adapter interface.

The harness process imports only the tables at the top (``PEER_SYSTEMS``, ``PEER_FAMILIES``,
``PEER_DESCRIPTIONS``); everything else runs in a family's fork server, which imports the library
lazily (:func:`load`), so a missing library only makes its systems "skipped" with the reason.

The interface: a peer gets a :class:`Job`, i.e. what every workload reduces to:

* ``source``: a list of datapoints (a pass; ``passes`` passes are run back to back);
* ``func``: the map function applied to each datapoint (module-level, so that it pickles by
  reference into worker processes);
* ``batch``: ``None``, or the number of mapped datapoints collated into one item (stacked with
  :func:`collate`, in the workers where the library does that);
* ``workers``: the worker count.

and returns a ``systems.Stream``. Any workload that can be phrased this way plugs in without
touching the adapters: the fbresnet pipeline (source = the in-memory JPEGs, ``func`` = decode +
``fbresnet_augmentor``, ``batch`` = 32), and the LMDB workloads (source = the record indexes or
keys, ``func`` = a module-level reader that opens the LMDB lazily once per process and returns
the decoded datapoint). Adding such a workload means a ``Workload`` entry in its own benchmark
file and, in ``systems.applies``, nothing at all.
"""
import itertools

# name -> (family, kind, counterpart in dataflow, description with {w} = the worker count)
PEER_SYSTEMS = {
    "grain-serial": ("grain", "serial", "dataflow-serial",
                     "grain MapDataset.source(ds).map(f).to_iter_dataset("
                     "ReadOptions(num_threads=0)): in the consuming thread"),
    "grain-threads": ("grain", "threads", "dataflow-threads",
                      "grain MapDataset.source(ds).map(f).to_iter_dataset("
                      "ReadOptions(num_threads={w})): grain's thread prefetch"),
    "grain-processes": ("grain", "processes", "dataflow-processes",
                        "grain MapDataset.source(ds).map(f).to_iter_dataset(ReadOptions("
                        "num_threads=0)).mp_prefetch(MultiprocessingOptions(num_workers={w}))"),
    "grain-dataloader": ("grain", "processes", "dataflow-processes",
                         "grain DataLoader(data_source=ds, sampler=IndexSampler(shuffle=False), "
                         "operations=[Map(f)], worker_count={w})"),
    "spdl-serial": ("spdl", "serial", "dataflow-serial",
                    "spdl PipelineBuilder().add_source(ds).pipe(f, concurrency=1)"
                    ".add_sink(...).build(num_threads=1): one worker thread (SPDL has no "
                    "in-thread mode)"),
    "spdl-threads": ("spdl", "threads", "dataflow-threads",
                     "spdl PipelineBuilder().add_source(ds).pipe(f, concurrency={w})"
                     ".add_sink(...).build(num_threads={w}): the map in its thread executor"),
    "spdl-processes": ("spdl", "processes", "dataflow-processes",
                       "spdl PipelineBuilder().add_source(ds).pipe(f, concurrency={w}, "
                       "executor=ProcessPoolExecutor({w})).add_sink(...).build(num_threads=1)"),
    "torchdata-serial": ("torchdata", "serial", "dataflow-serial",
                         "torchdata.nodes Loader(Mapper(IterableWrapper(ds), f))"),
    "torchdata-threads": ("torchdata", "threads", "dataflow-threads",
                          "torchdata.nodes Loader(ParallelMapper(IterableWrapper(ds), f, "
                          "num_workers={w}, method=\"thread\"))"),
    "torchdata-processes": ("torchdata", "processes", "dataflow-processes",
                            "torchdata.nodes Loader(ParallelMapper(IterableWrapper(ds), f, "
                            "num_workers={w}, method=\"process\"))"),
}
PEER_FAMILIES = ("grain", "spdl", "torchdata")

# How each one batches in the batched workloads (img, and fbresnet later).
PEER_BATCH_NOTES = {
    "grain": "then .batch(32) before mp_prefetch / in the workers' operations (grain.transforms."
             "Batch): collated in the workers",
    "spdl": "then .aggregate(32).pipe(collate): collated in the pipeline's own threads",
    "torchdata": "with Batcher(32) before the map and map-and-collate as its function: "
                 "collated where the map runs (torchdata's migration guide)",
}
SINK_BUFFER = 64          # SPDL's sink queue and per-stage buffers, in items
GRAIN_PREFETCH = 200      # grain's prefetch buffer (ReadOptions.prefetch_buffer_size)

_INSTALL = "pip install 'dataflow-rt[bench]'"


class Job:
    """What a peer runs: ``func`` over ``passes`` passes of ``source``, ``workers`` workers,
    collated by ``batch`` when it is not None."""

    def __init__(self, source, func, batch, workers, passes):
        self.source, self.func, self.batch = source, func, batch
        self.workers, self.passes = workers, passes

    def stream_of_source(self):
        return itertools.chain.from_iterable(itertools.repeat(self.source, self.passes))


# ---------------------------------------------------------------------------- module-level helpers
def collate(dps):
    """Stack a list of datapoints component by component into arrays (what torch's
    ``default_collate`` does, in numpy): ``[x_i, y_i]`` -> ``[stack(x), array(y)]``."""
    import numpy as np
    first = dps[0]
    if isinstance(first, (list, tuple)):
        return [collate([dp[j] for dp in dps]) for j in range(len(first))]
    if isinstance(first, np.ndarray):
        return np.stack(dps)
    return np.asarray(dps)


class MapAndCollate:
    """``func`` over a list of datapoints, then :func:`collate` (picklable by reference)."""

    def __init__(self, func):
        self.func = func

    def __call__(self, dps):
        return collate([self.func(dp) for dp in dps])


# ---------------------------------------------------------------------------- loading
def load(family):
    """Import ``family``'s library; returns ``(mods, versions, notes)``. Raises ImportError
    naming the extra when it is not installed."""
    if family == "grain":
        try:
            import grain
        except ImportError as exc:
            raise ImportError("grain is not installed (%s): %s" % (exc, _INSTALL)) from None
        import importlib.metadata as md
        return {"grain": grain}, {"grain": _dist_version(md, "grain", grain)}, []
    if family == "spdl":
        try:
            import spdl.pipeline
        except ImportError as exc:
            raise ImportError("spdl is not installed (%s): %s" % (exc, _INSTALL)) from None
        import importlib.metadata as md
        import spdl
        return {"spdl": spdl.pipeline}, {"spdl": _dist_version(md, "spdl", spdl)}, []
    if family == "torchdata":
        try:
            import torchdata
            import torchdata.nodes
        except ImportError as exc:
            raise ImportError("torchdata is not installed (%s): %s" % (exc, _INSTALL)) from None
        import torch
        return ({"nodes": torchdata.nodes},
                {"torchdata": getattr(torchdata, "__version__", None),
                 "torch": getattr(torch, "__version__", None)}, [])
    raise ValueError(family)


def _dist_version(md, dist, mod):
    v = getattr(mod, "__version__", None)
    if v:
        return v
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------- streams
class _Closer:
    """Something teardown can ``close()``: runs ``fns`` in order."""

    def __init__(self, *fns):
        self.fns = fns

    def close(self):
        for fn in self.fns:
            fn()


def open_stream(family, system, job, stream_cls):
    """Build ``system`` (a key of PEER_SYSTEMS) over ``job``; returns a ``stream_cls``."""
    kind = PEER_SYSTEMS[system][1]
    if family.name == "grain":
        return _grain(family.mods["grain"], system, kind, job, stream_cls)
    if family.name == "spdl":
        return _spdl(family.mods["spdl"], kind, job, stream_cls)
    if family.name == "torchdata":
        return _torchdata(family.mods["nodes"], kind, job, stream_cls)
    raise ValueError(system)


def _grain(grain, system, kind, job, stream_cls):
    w, bs = job.workers, job.batch
    if system == "grain-dataloader":
        from . import _grain_ops
        ops = [_grain_ops.FuncMap(job.func)]
        if bs:
            ops.append(grain.transforms.Batch(batch_size=bs, drop_remainder=True))
        sampler = grain.samplers.IndexSampler(num_records=len(job.source), shuffle=False,
                                              num_epochs=job.passes, seed=0)
        loader = grain.DataLoader(data_source=job.source, sampler=sampler, operations=ops,
                                  worker_count=w)
        it = iter(loader)
        return stream_cls(loader, it, has_close=False,
                          detail="worker_count=%d%s" % (w, ", batched in the workers" if bs
                                                        else ""))
    ds = grain.MapDataset.source(job.source).repeat(job.passes).map(job.func)
    threads = w if kind == "threads" else 0
    ids = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads,
                                               prefetch_buffer_size=GRAIN_PREFETCH))
    if bs:
        ids = ids.batch(bs, drop_remainder=True)
    if kind == "processes":
        ids = ids.mp_prefetch(grain.MultiprocessingOptions(num_workers=w))
    it = iter(ids)
    return stream_cls(ids, it, has_close=False)


def _spdl(sp, kind, job, stream_cls):
    w, bs = job.workers, job.batch
    executor = None
    b = sp.PipelineBuilder().add_source(job.stream_of_source())
    if kind == "processes":
        from concurrent.futures import ProcessPoolExecutor
        executor = ProcessPoolExecutor(max_workers=w)
        b = b.pipe(job.func, concurrency=w, executor=executor)
        threads = 1 if not bs else 2
    else:
        n = 1 if kind == "serial" else w
        b = b.pipe(job.func, concurrency=n)
        threads = n
    if bs:
        b = b.aggregate(bs, drop_last=True).pipe(collate)
    pipeline = b.add_sink(SINK_BUFFER).build(num_threads=threads)
    pipeline.start()
    it = pipeline.get_iterator()
    fns = [pipeline.stop]
    if executor is not None:
        fns.append(lambda: executor.shutdown(wait=True, cancel_futures=True))
    return stream_cls(_Closer(*fns), it, has_close=True, keep=[pipeline])


def _torchdata(tn, kind, job, stream_cls):
    w, bs = job.workers, job.batch
    node = tn.IterableWrapper(job.stream_of_source())
    fn = job.func
    if bs:
        node = tn.Batcher(node, batch_size=bs, drop_last=True)
        fn = MapAndCollate(job.func)
    if kind == "serial":
        node = tn.Mapper(node, fn)
    else:
        node = tn.ParallelMapper(node, map_fn=fn, num_workers=w, in_order=True,
                                 method="thread" if kind == "threads" else "process")
    loader = tn.Loader(node)
    it = iter(loader)
    return stream_cls(loader, it, has_close=False, keep=[node])

