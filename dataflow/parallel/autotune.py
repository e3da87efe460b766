"""Online autotuning of a parallel map's workers (``num_parallel_workers="auto"``).

:class:`AutoTuner` is the policy, shared by every executor that can add or retire one worker at
a time (threads, processes). The mapper feeds it, once per batch of results, what its consumer
thread measures anyway: how long it waited for results, how many came back, and the seconds the
workers report having spent in the map function. At the end of each measurement window it
answers +1, -1 or 0; the executor does the resizing.

The rules, in the spirit of tf.data's AUTOTUNE:

* **Grow** by one when the consumer waited for results for more than ``GROW_WAIT`` of the window
  while the workers were more than ``GROW_UTIL`` busy: the workers are the bottleneck. A grow is a
  *trial*: the next window must show a throughput gain (15 % from 1 to 2 workers, less for larger
  pools). Otherwise the worker is retired again and the count it failed at becomes a ceiling, so
  a GIL-bound map in threads, or a machine that has no core left, stops at what helps.
* **Shrink** by one when the consumer hardly waited (under ``SHRINK_WAIT``) and one worker fewer
  would still be under ``SHRINK_UTIL`` busy. The gap between the grow and shrink thresholds is
  the hysteresis that keeps a steady workload from oscillating.
* A consumer slower than the workers makes the workers idle and the consumer never waits, so no
  worker is added.
* After a change, measuring starts again only once the work that was in flight at the change
  has come back (it was queued for the old pool), so a trial judges the new pool.
* The first grow after the pool starts needs two windows in a row that call for it: while the
  pipeline fills, the consumer waits for the first full chunks whatever the pool's size (a
  consumer slower than its one worker waited 15 % of the first window, which added a worker
  that the trial then took back).
* A trial whose throughput *fell* by more than a third is a disturbance (another process took
  the CPUs), not the effect of one more worker: it is measured again (twice at most).
* The ceiling is forgotten when the work itself changes (the map's seconds per datapoint,
  measured at the ceiling, move by more than 3x), and otherwise after ``CEILING_HOLD`` seconds,
  doubling each time it is set again: a settled pipeline stays settled, and a ceiling set on a
  busy machine does not hold forever.

Limits: at least ``min_workers`` (1) and at most the CPUs available to the process
(``os.sched_getaffinity``).
"""
import time

from .._helpers import available_cpus

__all__ = ["AutoTuner", "available_cpus"]

GROW_WAIT = 0.10          # consumer waiting for results, as a fraction of the window
GROW_UTIL = 0.70          # workers' busy fraction
SHRINK_WAIT = 0.02
SHRINK_UTIL = 0.50        # busy fraction one worker fewer would have
FIRST_WINDOW = 0.05       # seconds; windows then grow by half up to MAX_WINDOW
MAX_WINDOW = 0.5
MIN_RESULTS = 8           # a window needs this many results (or 10 windows' time)
SETTLE_WINDOWS = 3        # quiet windows after which the tuner reports itself settled
MAX_DECISIONS = 100       # decisions kept for the statistics
CEILING_HOLD = 30.0       # seconds a ceiling holds at first (then 60, 120, ... 1800)


def _gain_needed(before):
    """Throughput gain a trial from ``before`` to ``before + 1`` workers must show."""
    return max(0.04, min(0.15, 0.3 / before))


class AutoTuner:
    """Decides when a pool gains or loses a worker; see the module doc.

    ``observe(now, wait, results, busy)`` once per batch of results returns whether a window has
    ended; then ``decide(now)`` returns the change to make (+1, -1 or 0) and records it.
    ``workers`` is the count the pool should have.
    """

    def __init__(self, max_workers=None, min_workers=1, start=1, clock=time.perf_counter):
        self.max_workers = max(1, int(max_workers or available_cpus()))
        self.min_workers = max(1, min(int(min_workers), self.max_workers))
        self.workers = max(self.min_workers, min(int(start), self.max_workers))
        self.ceiling = self.max_workers
        self.settled = False
        self.decisions = []            # {"t", "from", "to", "why"} (t: seconds since start)
        self.last_window = None
        self._clock = clock
        self._t_start = clock()
        self._window_s = FIRST_WINDOW
        self._trial = None             # (rate, workers, per_item) before a grow being judged
        self._ceiling_per_item = None  # map seconds per datapoint when the ceiling was set
        self._ceiling_until = None
        self._ceiling_hold = CEILING_HOLD
        self._retrials = 0
        self._quiet = 0
        self._confirm = 1              # windows that must call for the first grow before it
        self._skip = 1                 # results to let pass before the next window starts:
        self._begin(self._t_start, delay=0.0)   # the first window starts at the first result

    # -- measurement --------------------------------------------------------------------------
    def _begin(self, now, delay):
        """Start a window ``delay`` seconds from now (results before that are ignored: a new
        worker warming up, work sent before the change)."""
        self._w_start = now + delay
        self._w_end = self._w_start + self._window_s
        self._wait = self._busy = 0.0
        self._results = 0

    def restart(self):
        """The pool was restarted (``reset_state``) with ``workers`` workers: measure again."""
        if self._trial is not None:               # a trial left unjudged: undo it
            self.workers = self._trial[1]
        self._trial = None
        self._retrials = 0
        self._confirm = 1
        self._skip = 1                            # not the workers' start-up
        self._window_s = FIRST_WINDOW
        self._begin(self._clock(), delay=0.0)
        return self.workers

    def observe(self, now, wait, results, busy):
        """Account for one batch of results; True when the window is over (call ``decide``)."""
        if self._skip > 0:
            self._skip -= results
            if self._skip <= 0:
                self._begin(now, delay=0.0)
            return False
        if now < self._w_start:
            return False
        self._wait += wait
        self._results += results
        self._busy += busy
        if now < self._w_end:
            return False
        if self._results >= MIN_RESULTS:
            return True
        # Slow work: stretch the window until enough results are in, within reason.
        return self._results >= 2 and now - self._w_start >= 10 * self._window_s

    # -- policy -------------------------------------------------------------------------------
    def decide(self, now, in_flight=0):
        """The change to make now: +1, -1 or 0. ``in_flight``: datapoints sent to the workers
        and not back yet (the next window starts once that many results have come back)."""
        span = max(1e-9, now - self._w_start)
        n = self.workers
        rate = self._results / span
        wait = min(1.0, self._wait / span)
        util = min(1.0, self._busy / (n * span))
        per_item = self._busy / self._results if self._results else None
        self.last_window = {"seconds": round(span, 4), "workers": n, "results": self._results,
                            "rate": round(rate, 2), "wait_fraction": round(wait, 4),
                            "busy_fraction": round(util, 4)}
        self._window_s = min(MAX_WINDOW, self._window_s * 1.5)
        delta, why = 0, None
        if self._trial is not None:
            before_rate, before_n, before_per_item = self._trial
            gain = rate / before_rate - 1 if before_rate > 0 else 0.0
            if gain < -1 / 3 and self._retrials < 2:
                self._retrials += 1              # a disturbance: measure the trial again
                self._begin(now, delay=0.0)
                return 0
            self._trial = None
            self._retrials = 0
            if gain < _gain_needed(before_n):
                delta = -1
                self.ceiling = before_n
                self._ceiling_per_item = before_per_item
                self._ceiling_until = now + self._ceiling_hold
                self._ceiling_hold = min(1800.0, 2 * self._ceiling_hold)
                why = (f"no gain from worker {n}: {before_rate:.0f} -> {rate:.0f} datapoints/s "
                       f"({gain:+.0%}); ceiling {before_n}")
            else:
                self._record(now, n, n, f"kept worker {n}: {before_rate:.0f} -> {rate:.0f} "
                                        f"datapoints/s ({gain:+.0%})")
        elif self.ceiling < self.max_workers and (
                now >= self._ceiling_until or (per_item and self._ceiling_per_item and
                                               not 1 / 3 < per_item / self._ceiling_per_item < 3)):
            self.ceiling = self.max_workers       # the work changed, or the ceiling expired
            self._ceiling_per_item = None
        if delta == 0 and why is None:
            if n < self.ceiling and wait > GROW_WAIT and util > GROW_UTIL:
                if self._confirm > 0:
                    self._confirm -= 1             # the pipeline filling? see the next window
                    self._begin(now, delay=0.0)
                    return 0
                delta = 1
                self._trial = (rate, n, per_item)
                why = f"consumer waited {wait:.0%} of the time, workers {util:.0%} busy"
            elif n > self.min_workers and wait < SHRINK_WAIT and \
                    util * n / (n - 1) < SHRINK_UTIL:
                delta = -1
                why = (f"consumer waited {wait:.0%}, workers {util:.0%} busy: {n - 1} would be "
                       f"{util * n / (n - 1):.0%} busy")
        self._confirm = 0              # only the first window after the start is in doubt
        if delta:
            self._record(now, n, n + delta, why)
            self.workers = n + delta
            self._quiet = 0
            self.settled = False
            # Judge the new pool on work it got: start the next window once what was in flight
            # has come back, and make it no shorter than the one before.
            self._window_s = max(self._window_s, 2 * FIRST_WINDOW, span)
            self._skip = in_flight
            self._begin(now, delay=0.0 if in_flight else min(0.1, 0.5 * self._window_s))
        else:
            self._quiet += 1
            self.settled = self._quiet >= SETTLE_WINDOWS
            self._begin(now, delay=0.0)
        return delta

    def _record(self, now, before, after, why):
        self.decisions.append({"t": round(now - self._t_start, 4), "from": before, "to": after,
                               "why": why})
        del self.decisions[:-MAX_DECISIONS]

    def describe(self):
        """Plain data for :func:`dataflow.stats`."""
        return {"workers": self.workers, "min_workers": self.min_workers,
                "max_workers": self.max_workers, "ceiling": self.ceiling,
                "settled": self.settled, "decisions": list(self.decisions),
                "last_window": self.last_window}
