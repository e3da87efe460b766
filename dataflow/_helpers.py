"""Small pieces that several modules need, written once (private to the library)."""
import math
import numbers
import os

_CGROUP = "/sys/fs/cgroup"


def available_cpus():
    """The number of CPUs this process may use: the CPUs it may run on (its affinity), and no
    more than its cgroup's CPU quota, rounded up (a container started with ``--cpus=2``, or a
    Kubernetes CPU limit of 2, sees every CPU of its host but gets the time of 2: a worker per
    host CPU would share those 2)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else cpus


def cgroup_cpu_quota(root=None):
    """CPUs' worth of time the cgroup of this process may use (``quota / period``), or
    ``None`` without a limit or a cgroup file system (not Linux). Read where a container sees
    its own cgroup: ``cpu.max`` (cgroup v2, "max 100000" when unlimited) or
    ``cpu/cpu.cfs_quota_us`` and ``cpu/cpu.cfs_period_us`` (v1, quota -1 when unlimited). A
    file that does not parse counts as no limit. ``root``: the cgroup file system's mount
    point (default ``/sys/fs/cgroup``)."""
    root = _CGROUP if root is None else root
    try:
        with open(os.path.join(root, "cpu.max")) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        try:
            with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as f:
                quota = f.read().strip()
            with open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as f:
                period = f.read().strip()
        except OSError:
            return None
    try:
        quota, period = int(quota), int(period)
    except ValueError:              # "max": no limit (or a file we cannot read)
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def dataflow_length(df):
    try:
        return len(df)
    except (NotImplementedError, TypeError):
        return None


def is_int(value):
    """Whether ``value`` is an integer (a Python int or a numpy integer, as tensorpack takes
    them) and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name, value, minimum, whole_floats=False):
    """``int(value)`` if ``value`` is an integer (see :func:`is_int`) >= ``minimum``; else
    ``ValueError`` naming ``name``. With ``whole_floats``, a float of integral value (``3.0``,
    ``1e4``) is taken too, for counts that tensorpack passed through ``int()``."""
    if whole_floats and isinstance(value, numbers.Real) and \
            not isinstance(value, numbers.Integral) and float(value).is_integer():
        value = int(value)                  # 3.0, 1e4, numpy.float32(5.0)
    if not is_int(value) or value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(value)


def check_flag(name, value):
    """``bool(value)`` for a yes/no argument; ``TypeError`` naming ``name`` for a string, which
    would be taken by its truth (``"False"`` is true)."""
    if value.__class__ is bool:         # the usual case first: it runs on hot paths too
        return value
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


MAX_WORKERS = 4096
"""The most workers a parallel dataflow takes (each is a thread or a process): a larger count is
a mistake, and starting it would run until the system refused a thread or a process."""


def check_positive_number(name, value, allow_none=False):
    """``value`` if it is a positive number (not a bool, not NaN; a numpy one becomes a Python
    int or float), or ``None`` when allowed; else ``ValueError`` naming ``name``. (NaN would
    pass ``value <= 0``, and a timeout of NaN then never fires.)"""
    if value is None and allow_none:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"{name} must be {'None or ' if allow_none else ''}a positive number, "
                         f"got {value!r}")
    if type(value) is int or type(value) is float:
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)   # numpy's


def empty_pass_error(who, df):
    """The error of ``who``, which repeats ``df`` forever, when a whole pass of ``df`` yielded no
    datapoint: repeating it would hang."""
    path = getattr(df, "path", None)        # a file reader's (TFRecordData): name the file
    of = f" (file {path})" if isinstance(path, str) else ""
    return ValueError(f"{who}: a pass of {type(df).__name__}{of} produced no datapoint; "
                      "repeating it forever would hang")


def pass_progress(df):
    """A count that grows when the pipeline ending at ``df`` keeps datapoints for a later pass
    (``BatchDataByShape``'s buffers, ``_pass_progress()``). A pass that yields nothing is an
    error for whoever repeats it forever unless this grew during it: then the next pass may
    yield (tensorpack's HED fills a batch of one shape over several passes)."""
    count = getattr(df, "_pass_progress", None)
    return count() if callable(count) else 0


def position_mid_pass(position):
    """Whether ``position`` (a ``_get_position()`` value) may lie inside a pass, some of it
    read: False only where the position says its pass has not begun (``"open": False``, as
    sources and maps record it); a position that does not say counts as inside."""
    return not (isinstance(position, dict) and position.get("open", True) is False)


def repeat_forever(df, who, on_pass_end=None):
    """The datapoints of ``df``, pass after pass, for ``who``; a pass that yields nothing and
    makes no progress (:func:`pass_progress`) raises :func:`empty_pass_error`.
    ``on_pass_end()`` is called after each pass."""
    while True:
        got, mark = False, pass_progress(df)
        for dp in df:
            got = True
            yield dp
        if not got and pass_progress(df) == mark:
            raise empty_pass_error(who, df)
        if on_pass_end is not None:
            on_pass_end()


def component(dp, key, who):
    """``dp[key]``; an ``IndexError``, ``KeyError`` or ``TypeError`` naming ``who``, the key and
    what the datapoint has where that fails (Python's own says "list index out of range")."""
    try:
        return dp[key]
    except (IndexError, KeyError, TypeError) as e:
        if isinstance(dp, (list, tuple)):
            n = len(dp)
            has = f"{n} component" + ("" if n == 1 else "s")
            what = f"no component {key!r}" if isinstance(key, int) else \
                f"a component index must be an int, got {key!r}"
        elif isinstance(dp, dict):
            keys = list(dp)
            has = f"the keys {keys[:10]}" + (" ..." if len(keys) > 10 else "")
            what = f"no key {key!r}"
        else:
            raise TypeError(f"{who}: a datapoint must be a list, tuple or dict to take its "
                            f"component {key!r}, got {type(dp).__name__}") from None
        raise type(e)(f"{who}: the datapoint has {has}, {what}") from None


def func_name(func):
    """A function's name for messages: the wrapped function's qualified name, else its
    ``__name__``, else the name of its type (a callable object)."""
    func = getattr(func, "__wrapped__", func)
    return (getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
            or type(func).__name__)


def add_note(exc, note):
    """``exc.add_note(note)``; on Python 3.10, which has no notes, the note is kept in
    ``__notes__`` (not printed)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        exc.__notes__ = list(getattr(exc, "__notes__", ())) + [note]


def progress_bar(**kwargs):
    """A ``tqdm`` progress bar made with ``kwargs``, or None when tqdm is not installed.

    The bar starts no monitor thread. tqdm's, started by its first bar, lives until the process
    exits, and a process with a second thread no longer forks its workers by default (see
    :func:`dataflow.parallel.start.default_start_method`): one progress bar would have made
    every later ``MultiProcessMapData`` start its workers through the fork server."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None

    class ProgressBar(tqdm):
        monitor_interval = 0

    return ProgressBar(**kwargs)
