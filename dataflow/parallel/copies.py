"""What a worker runs when it is not one shared map function: a :class:`Constant` function, or
its own copy of a dataflow (:class:`OwnCopy`), and :class:`CopiesRunner`, the base of the runners
whose workers each run their own copy (threads, processes, Ray)."""
import itertools

from .. import checkpoint as _ckpt
from .. import rng as _rng
from ..base import EndlessError, check_dataflow
from .._helpers import (check_int, dataflow_length, empty_pass_error, func_name, pass_progress,
                       position_mid_pass)
from ..stats import tell_label
from .mapper import ParallelMapData

__all__ = ["Constant", "OwnCopy", "OwnDataFlow", "CopiesRunner"]


class Constant:
    """make_func of a map: every worker runs the same function."""

    def __init__(self, func):
        self.func = func

    def __call__(self, wid):
        return self.func

    def __repr__(self):             # (what messages about sending it to workers name)
        return f"the map function {func_name(self.func)}"


class _Tickets:
    """The source of a runner: one placeholder per datapoint to produce; endless if the length
    is unknown."""

    def __init__(self, length):
        self.length = length

    def reset_state(self):
        pass

    def __len__(self):
        if self.length is None:
            raise EndlessError("the runner's dataflow has no length: the runner never ends a "
                               "pass")
        return self.length

    def __iter__(self):
        return itertools.repeat(None, *([] if self.length is None else [self.length]))


class OwnDataFlow:
    """The 'map function' of a runner's worker: each call returns the next datapoint of the
    worker's own dataflow, which it runs over and over, as ``(copy, n, mark, datapoint)``: ``n``
    counts this copy's datapoints since it started, ``mark`` is ``None`` or, on its 1st, 17th,
    ... datapoint, where its dataflow is (see :class:`dataflow.checkpoint.CopiesPosition`, which
    unwraps them in the consumer).

    ``copy`` numbers the copy. While the copy runs, serial maps inside it key their datapoints'
    random streams by ``(pass, index, copy)`` (see ``MapData``), so the copies of a seeded
    pipeline draw different random numbers (with ``(pass, index)`` alone, every copy's k-th
    datapoint would get the same crop, flip, ...). ``resume``, from a loaded state, is
    ``{"at": position, "skip": k}``: the copy starts at that position and makes (and drops) ``k``
    datapoints first."""

    def __init__(self, df, copy=0, resume=None):
        self.df = df
        self.copy = copy
        self._it = None
        self._n = 0
        self._resume = resume

    def __call__(self, _ticket):
        local = _rng._local
        outer = getattr(local, "copy", None)
        local.copy = self.copy
        try:
            if self._resume is not None:
                self._start_resumed()
            dp = self._next()
            n = self._n = self._n + 1
            mark = _ckpt.copy_mark(self.df) if (n - 1) % _ckpt.MARK_EVERY == 0 else None
        finally:
            local.copy = outer
        return [self.copy, n, mark, dp]     # a list: cheaper to send than a tuple

    _continuing = False     # the next iter() continues a pass from a loaded position

    def _next(self):
        fresh, mark = False, None
        while True:
            if self._it is None:
                # a pass resumed from a loaded position may have nothing left: it is not an
                # empty pass (the position may be the end of one: a mark taken on its last
                # datapoint)
                fresh, mark = not self._continuing, pass_progress(self.df)
                self._continuing = False
                self._it = iter(self.df)
            try:
                return next(self._it)
            except StopIteration:
                self._it = None
            if fresh and pass_progress(self.df) == mark:   # a whole new pass, and no progress
                raise empty_pass_error("a worker's copy", self.df)

    def _start_resumed(self):
        r, self._resume = self._resume, None
        self.df._set_position(r["at"])
        # a position before its pass began starts a whole pass, which must yield
        self._it, self._continuing = None, position_mid_pass(r["at"])
        for _ in range(int(r["skip"])):
            self._next()


class OwnCopy:
    """make_func of a runner: each worker resets and runs its own copy of ``ds``, from
    ``resume[wid]`` when the runner was loaded from a state."""

    def __init__(self, ds, resume=None):
        self.ds = ds
        self.resume = resume

    def __repr__(self):             # what an error about shipping it names
        return f"the dataflow {self.ds!r}"

    def __call__(self, wid):
        self.ds.reset_state()
        return OwnDataFlow(self.ds, copy=wid,
                           resume=None if self.resume is None else self.resume[wid])


class CopiesRunner(_ckpt.CopiesPosition, ParallelMapData):
    """Base of the runners whose workers each run their own copy of ``ds`` (shipped to them by
    the executor): the consumer only hands out tickets, ``len(ds)`` per pass when that is known,
    endlessly otherwise, at most ``num_prefetch`` ahead of the consumer. Subclasses start their
    executor with :meth:`_own_copies` as its ``make_func``."""

    keys_random_streams = False    # it runs dataflows, not a map function (base.random_stage)
    _restarts_source = True        # its copies are made again after close() (see mapper)

    def __init__(self, ds, num_workers, num_prefetch, *, timeout=None):
        self.num_prefetch = check_int("num_prefetch", num_prefetch, 1)    # not "buffer_size"
        ds = check_dataflow(ds, type(self).__name__)
        super().__init__(_Tickets(dataflow_length(ds)), num_workers, OwnCopy(ds),
                         buffer_size=num_prefetch, timeout=timeout)
        tell_label(self, type(ds).__name__)       # a runner: copies of a dataflow

    def _reset_source(self):
        pass                          # each worker resets its own copy

    def _own_copies(self):
        """The workers' ``make_func``: copies of ``ds``, from the loaded positions if any."""
        return OwnCopy(self.map_func.ds, self._copy_entries())

    def _result_bytes(self, value):
        return super()._result_bytes(value[3])

    def _fingerprint_inputs(self):
        return [self.map_func.ds]

    def __iter__(self):
        self._resuming()
        return self._replaying(self._tracked(ParallelMapData.__iter__(self)))
