"""Process-wide settings of the library (plain storage; the code that uses them reads them when
it starts work, so a change applies to maps and workers started afterwards).

* Debug mode (:func:`set_debug_mode`): every map runs serially in the calling thread, whatever
  its ``num_parallel_workers``, so breakpoints and tracebacks work as in plain Python.
* Hang timeout (:func:`set_hang_timeout`): how many seconds a parallel worker may take on one
  piece of work before the supervisor reports it as hung. Default 300.
* Worker niceness (:func:`set_worker_nice`): how much lower than the consumer's a process
  worker's CPU priority is (``os.nice``, applied by the worker when it starts). Default 10. When
  the workers and the consumer want more cores than there are, the consumer then gets one first:
  it dispatches work and takes results in time, instead of waiting for a time slice while the
  workers run out of work (a gain when cores are short, nothing for CPU-bound maps; figures in
  docs/measurements.md). With Linux's usual settings (session autogroups, or a
  container's control group) the priority counts among the processes of the same session or
  container: workers do not yield to other jobs any more than before, but they do yield to other
  CPU-hungry processes of your own. ``0`` keeps workers at the consumer's priority. No effect
  where ``os.nice`` does not exist (Windows).
"""
import math

__all__ = ["set_debug_mode", "debug_mode", "set_hang_timeout", "hang_timeout",
           "set_worker_nice", "worker_nice"]

DEFAULT_HANG_TIMEOUT = 300.0
DEFAULT_WORKER_NICE = 10

_debug = False
_hang_timeout = DEFAULT_HANG_TIMEOUT
_worker_nice = DEFAULT_WORKER_NICE


def set_debug_mode(flag):
    """Turn debug mode on (``True``) or off (``False``)."""
    global _debug
    if not isinstance(flag, bool):
        raise TypeError(f"set_debug_mode: flag must be a bool, got {flag!r}")
    _debug = flag


def debug_mode():
    """Whether debug mode is on (default ``False``)."""
    return _debug


def set_hang_timeout(seconds):
    """Set the hang timeout: a positive number of seconds; ``math.inf`` never reports a hang."""
    global _hang_timeout
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or \
            math.isnan(seconds) or seconds <= 0:
        raise ValueError(f"set_hang_timeout: seconds must be a positive number, got {seconds!r}")
    _hang_timeout = float(seconds)


def hang_timeout():
    """The hang timeout in seconds (a float; default 300.0)."""
    return _hang_timeout


def current_hang_timeout():
    """The hang timeout in force, as the library reads it: the value of :func:`set_hang_timeout`,
    or a number assigned directly to ``dataflow.config.hang_timeout``."""
    value = globals()["hang_timeout"]
    return float(value()) if callable(value) else float(value)


def set_worker_nice(increment):
    """Set how much lower than the consumer's the CPU priority of process workers started from
    now on is: an ``int`` from 0 (the same priority) to 19."""
    global _worker_nice
    if isinstance(increment, bool) or not isinstance(increment, int) or not 0 <= increment <= 19:
        raise ValueError(f"set_worker_nice: increment must be an int from 0 to 19, "
                         f"got {increment!r}")
    _worker_nice = increment


def worker_nice():
    """The niceness increment of process workers (default 10)."""
    return _worker_nice
