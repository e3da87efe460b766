"""The systems under comparison: how to load each family, build a stream, and tear it down.

Nothing here is imported by the harness process except the plain tables at the top (``SYSTEMS``,
``FAMILIES``); the loaders run inside a family's fork server.
"""
import gc
import importlib
import warnings

# name -> (family, kind, counterpart in dataflow for the pair-by-pair ratio, one-line description)
SYSTEMS = {
    "dataflow-serial": ("dataflow", "serial", None,
                        "dataflow.MapData(ds, f)"),
    "dataflow-threads": ("dataflow", "threads", None,
                         "dataflow.MultiThreadMapData(ds, num_thread=2, map_func=f, "
                         "buffer_size=200, strict=True)"),
    "dataflow-processes": ("dataflow", "processes", None,
                           "dataflow.MultiProcessMapData(ds, num_proc=2, map_func=f, "
                           "buffer_size=200, strict=True)"),
    "tensorpack-serial": ("tensorpack", "serial", "dataflow-serial",
                          "tensorpack MapData(RepeatedData(ds, -1), f)"),
    "tensorpack-threads": ("tensorpack", "threads", "dataflow-threads",
                           "tensorpack MultiThreadMapData(ds, 2, f, buffer_size=200, strict=True)"),
    "tensorpack-processes": ("tensorpack", "processes", "dataflow-processes",
                             "tensorpack MultiProcessMapDataZMQ(ds, 2, f, buffer_size=200, "
                             "strict=True)"),
    "torch": ("torch", "processes", "dataflow-processes",
              "torch DataLoader(MapStyleDataset, num_workers=2, batch_size=None)"),
    "torch-serial": ("torch", "serial", "dataflow-serial",
                     "torch DataLoader(MapStyleDataset, num_workers=0, batch_size=None)"),
}
FAMILIES = ("dataflow", "tensorpack", "torch")

# The dataflow names each dataflow system needs.
_DATAFLOW_NEEDS = {
    "dataflow-serial": ("DataFromList", "MapData"),
    "dataflow-threads": ("DataFromList", "MultiThreadMapData"),
    "dataflow-processes": ("DataFromList", "MultiProcessMapData"),
}

# numpy 2 removed these aliases; tensorpack 0.11 uses some of them in a few places.
_NUMPY_ALIASES = {"bool": bool, "object": object, "int": int, "float": float, "complex": complex,
                  "str": str, "long": int, "unicode": str}


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
        self.notes = []
        self.versions = {}
        getattr(self, "_load_" + name)()

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
def _passes(df):
    """Endless iteration of a dataflow, pass after pass (each ``iter`` is one strict pass)."""
    while True:
        yield from df


class Stream:
    """A started system: ``it`` yields datapoints; ``teardown`` is what the run times."""

    def __init__(self, obj, it, has_close, keep=()):
        self.obj = obj
        self.it = it
        self.has_close = has_close
        self.keep = list(keep)

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


def open_stream(family, system, workload, source, passes):
    """Construct the system over ``source`` and reset it; returns a :class:`Stream`.

    ``passes`` is how many 10000-datapoint passes the run may consume (used by torch, whose
    map-style dataset gets that length; dataflow and tensorpack just iterate pass after pass).
    """
    kind = SYSTEMS[system][1]
    f = workload.func
    if family.name == "dataflow":
        m = family.mods["df"]
        ds = m.DataFromList(source, shuffle=False)
        if kind == "serial":
            df = m.MapData(ds, f)
        elif kind == "threads":
            df = m.MultiThreadMapData(ds, num_thread=2, map_func=f, buffer_size=200, strict=True)
        else:
            df = m.MultiProcessMapData(ds, num_proc=2, map_func=f, buffer_size=200, strict=True)
        df.reset_state()
        return Stream(df, _passes(df), has_close=callable(getattr(df, "close", None)))
    if family.name == "tensorpack":
        tp = family.mods["tp"]
        ds = tp.DataFromList(source, shuffle=False)
        if kind == "serial":
            df = tp.MapData(tp.RepeatedData(ds, -1), f)
            df.reset_state()
            return Stream(df, iter(df), has_close=False)
        if kind == "threads":
            df = tp.MultiThreadMapData(ds, 2, f, buffer_size=200, strict=True)
        else:
            df = tp.MultiProcessMapDataZMQ(ds, 2, f, buffer_size=200, strict=True)
        df.reset_state()
        return Stream(df, _passes(df), has_close=False)
    if family.name == "torch":
        torch = family.mods["torch"]
        dataset = family.mods["torch_ds"].MapStyleDataset(source, f, passes * len(source))
        loader = torch.utils.data.DataLoader(dataset, num_workers=2 if kind == "processes" else 0,
                                             batch_size=None)
        it = iter(loader)
        return Stream(loader, it, has_close=False)
    raise ValueError(system)
