"""Process-wide settings of the library (plain storage; the code that uses them reads them when
it starts work, so a change applies to maps and workers started afterwards).

* Debug mode (:func:`set_debug_mode`): every map runs serially in the calling thread, whatever
  its ``num_parallel_workers``, so breakpoints and tracebacks work as in plain Python.
* Hang timeout (:func:`set_hang_timeout`): how many seconds a parallel worker may take on one
  piece of work before the supervisor reports it as hung. Default 300.
"""
import math

__all__ = ["set_debug_mode", "debug_mode", "set_hang_timeout", "hang_timeout"]

DEFAULT_HANG_TIMEOUT = 300.0

_debug = False
_hang_timeout = DEFAULT_HANG_TIMEOUT


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
