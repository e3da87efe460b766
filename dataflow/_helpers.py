"""Small pieces that several modules need, written once (private to the library)."""
import os


def available_cpus():
    """The number of CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        return os.cpu_count() or 1


def dataflow_length(df):
    try:
        return len(df)
    except (NotImplementedError, TypeError):
        return None
