"""Checkpoint and resume: the envelope of ``DataFlow.state_dict()`` and the helpers dataflows
use to say where they are.

A dataflow's *position* is a small JSON value (ints, strings, lists, dicts) meaning "just after
the last datapoint this dataflow returned to its caller", its pass number included. The public
methods (:meth:`dataflow.DataFlow.state_dict` and ``load_state_dict``) wrap the position of the
outermost dataflow with a format version and a *fingerprint* of the pipeline (class names and
the parameters that change the stream: batch sizes, buffer sizes, shuffling, the global seed;
never the number of workers or the executor), and check both on load. How a dataflow implements
its position is described in :mod:`dataflow.base` (``_get_position`` /
``_set_position`` / ``_fingerprint_params``).

Also here: the positions of sources (:class:`PassPosition`, :class:`IndexedSource`, replay),
of the runners (:class:`CopiesPosition`: one position per copy), and :func:`refill`, which
buffers use to read their datapoints again from recorded positions (:func:`rereadable` says
whether they can).

``base`` imports this module; it imports only ``dataflow.rng`` (inside the two functions that
need the global seed).
"""
import numpy as np

__all__ = ["STATE_FORMAT", "envelope", "unwrap", "fingerprint", "PassPosition",
           "replay_counted", "replay_state", "skipped", "ranges",
           "CopiesPosition", "MARK_EVERY", "copy_mark", "refill", "rereadable", "base_seed", "IndexedSource", "keyed_permutation", "keyed_generator"]

#: version of the dict ``state_dict()`` returns; ``load_state_dict`` refuses any other
STATE_FORMAT = 1

#: key that marks the position of a source that can only be fast-forwarded by re-iterating
REPLAY = "replay_of"

#: key that marks the position of a runner whose several copies hand over in arrival order
ARRIVAL = "arrival_order_of"

#: key that marks the position of an unordered parallel map (results in the order they finish)
UNORDERED = "unordered_map"


# -- fingerprint --------------------------------------------------------------------------------
def inputs_of(df):
    """The dataflows ``df`` reads from, in a fixed order: ``df.ds``, then ``df.df_lists`` (a
    runner: the dataflow it runs copies of)."""
    own = getattr(df, "_fingerprint_inputs", None)
    if callable(own):                  # a runner: the dataflow it runs copies of
        return own()
    found = []
    ds = getattr(df, "ds", None)
    if ds is not None:
        found.append(ds)
    for item in getattr(df, "df_lists", None) or ():
        found.append(item[0] if isinstance(item, (tuple, list)) else item)
    return found


def fingerprint(df):
    """The structure of the pipeline ending at ``df``: ``{"class", "params", "inputs"}``, nested.
    ``class`` is ``df._fingerprint_name()`` (a parallel map reports the same name whatever its
    executor), ``params`` what ``df._fingerprint_params()`` returns."""
    name_of = getattr(df, "_fingerprint_name", None)
    params_of = getattr(df, "_fingerprint_params", None)
    return {"class": name_of() if callable(name_of) else type(df).__name__,
            "params": params_of() if callable(params_of) else {},
            "inputs": [fingerprint(d) for d in inputs_of(df)]}


def _first_difference(saved, here, path):
    """A sentence naming the first difference between two fingerprints, or ``None``."""
    where = " > ".join(path + [here.get("class", "?")])
    if saved.get("class") != here.get("class"):
        return (f"at {' > '.join(path + ['?']) if path else 'the top'}: the state is of "
                f"{saved.get('class')!r}, this pipeline has {here.get('class')!r}")
    sp, hp = saved.get("params", {}), here.get("params", {})
    for key in sorted(set(sp) | set(hp)):
        if sp.get(key) != hp.get(key):
            return (f"at {where}: parameter {key!r} is {sp.get(key)!r} in the state, "
                    f"{hp.get(key)!r} in this pipeline")
    si, hi = saved.get("inputs", []), here.get("inputs", [])
    if len(si) != len(hi):
        return (f"at {where}: the state has {len(si)} input dataflow(s), this pipeline "
                f"{len(hi)}")
    for k, (a, b) in enumerate(zip(si, hi)):
        d = _first_difference(a, b, path + [f"{here.get('class')}[{k}]"])
        if d is not None:
            return d
    return None


# -- envelope -----------------------------------------------------------------------------------
def _find_replay(state):
    """The name of the first source in ``state`` whose position needs replay, or ``None``."""
    return _find_key(state, REPLAY)


def envelope(df, replay=False):
    """What ``df.state_dict(replay=...)`` returns."""
    from .rng import get_seed
    state = df._get_position()
    if not replay:
        name = _find_replay(state)
        if name is not None:
            raise NotImplementedError(
                f"{name} cannot say where it is, so {type(df).__name__}.state_dict() cannot "
                f"record an exact position. Pass replay=True to record how many datapoints it "
                f"produced instead: load_state_dict() then fast-forwards it by re-iterating, "
                f"which is exact only if {name} yields the same datapoints every time.")
    return {"format_version": STATE_FORMAT, "seed": get_seed(),
            "fingerprint": fingerprint(df), "state": state}


def unwrap(df, state):
    """Check the envelope ``state`` against ``df``; return the position inside it."""
    from .rng import get_seed
    if not isinstance(state, dict) or "format_version" not in state \
            or "fingerprint" not in state or "state" not in state:
        raise ValueError(f"{type(df).__name__}.load_state_dict: not a dataflow state "
                         f"(a dict from state_dict(), with 'format_version', 'fingerprint' "
                         f"and 'state'), got {type(state).__name__}")
    # "format" and "version" are read too, so that a state edited by hand under either name
    # is refused rather than silently loaded
    for key in ("format_version", "format", "version"):
        if key in state and state[key] != STATE_FORMAT:
            raise ValueError(f"{type(df).__name__}.load_state_dict: unknown state format "
                             f"version {state[key]!r}; this version of dataflow reads format "
                             f"version {STATE_FORMAT}")
    diff = _first_difference(state["fingerprint"], fingerprint(df), [])
    if diff is not None:
        raise ValueError(f"{type(df).__name__}.load_state_dict: the state was saved from a "
                         f"different pipeline, {diff}")
    if state.get("seed") != get_seed():
        raise ValueError(f"{type(df).__name__}.load_state_dict: the state was saved with "
                         f"dataflow.set_seed({state.get('seed')!r}), this process has "
                         f"set_seed({get_seed()!r}); call set_seed first")
    return state["state"]


# -- sources ------------------------------------------------------------------------------------
class PassPosition:
    """Bookkeeping of a source's position, mixed into a dataflow: ``_pass`` (the pass being, or
    next to be, iterated), ``_pos`` (datapoints returned in it) and ``_in_pass``.

    ``__iter__`` calls :meth:`_begin_pass` (which applies a loaded position, or starts the next
    pass when the previous one was abandoned) when it is called, not in the generator it
    returns (so an iterator made and dropped unstarted still counts as a pass), the generator
    sets ``self._pos`` before every ``yield`` and calls :meth:`_end_pass` after its last
    datapoint."""

    _pass = 0
    _pos = 0
    _in_pass = False
    _resume = None

    def _reset_position(self):
        self._pass, self._pos, self._in_pass = 0, 0, False

    def _begin_pass(self):
        """Returns ``(pass, first position)`` of the pass this ``__iter__`` runs."""
        r = self._resume
        if r is not None:
            self._resume = None
            self._pass, self._pos = r["pass"], r["pos"]
        elif self._in_pass:             # the previous pass was abandoned: start the next one
            self._pass, self._pos = self._pass + 1, 0
        else:
            self._pos = 0
        self._in_pass = True
        return self._pass, self._pos

    def _end_pass(self):
        self._pass, self._pos, self._in_pass = self._pass + 1, 0, False

    def _get_position(self):
        if self._resume is not None:
            return dict(self._resume)
        return {"pass": self._pass, "pos": self._pos, "open": self._in_pass}

    def _set_position(self, state):
        self._resume = {"pass": int(state["pass"]), "pos": int(state["pos"]),
                        "open": bool(state.get("open", True))}

    def _abandon(self):
        r = self._resume
        if r is not None:
            self._resume = None
            self._pass, self._pos, self._in_pass = r["pass"], r["pos"], r["open"]
        if self._in_pass:
            PassPosition._end_pass(self)     # (also used by classes that do not inherit it)


class IndexedSource(PassPosition):
    """The position of a random-access source of ``len(self)`` datapoints that a pass visits in
    index order or, with ``self.shuffle``, in a permutation keyed by a seed drawn once from
    ``self.rng`` and the pass number (no RNG state is stored: a resumed pass recomputes its
    order and continues at once). The dataflow calls :meth:`_reset_indexed` in ``reset_state``,
    :meth:`_pass_indices` in ``__iter__`` (not in its generator), and :meth:`_counted_items`
    around the datapoints it makes from those indices."""

    _base = None             # the seed of the shuffled orders, drawn from self.rng

    def _reset_indexed(self):
        self._reset_position()
        if self._resume is None:
            self._base = None

    def _pass_indices(self):
        """``(indices of this pass from its first unreturned datapoint, first position)``."""
        p, start = self._begin_pass()
        n = len(self)
        if not self.shuffle:
            return range(start, n), start
        if self.rng is None:
            raise RuntimeError(f"{type(self).__name__} has no random state: call reset_state() "
                               "before iterating it.")
        return keyed_permutation(base_seed(self), p, n)[start:], start

    def _counted_items(self, items, start):
        pos = start
        for dp in items:
            pos += 1
            self._pos = pos
            yield dp
        self._end_pass()

    def _get_position(self):
        s = PassPosition._get_position(self)
        if self.shuffle:
            s.setdefault("base", base_seed(self))
        return s

    def _set_position(self, position):
        PassPosition._set_position(self, position)
        if position.get("base") is not None:
            self._base = int(position["base"])

    def _fingerprint_params(self):
        return {"len": len(self), "shuffle": bool(self.shuffle)}


def replay_counted(df, make_iterator):
    """The datapoints of ``make_iterator()`` for one pass of ``df`` (a :class:`PassPosition`),
    counted, so that its position can be recorded as a count; a loaded position is reached by
    skipping that many datapoints (replay)."""
    _, start = PassPosition._begin_pass(df)      # at iter(), as PassPosition says
    return _counted(df, make_iterator, start)


def _counted(df, make_iterator, start):
    it = iter(make_iterator())
    for _ in range(start):
        if next(it, _END) is _END:
            break
    pos = start
    for dp in it:
        pos += 1
        df._pos = pos
        yield dp
    PassPosition._end_pass(df)


_END = object()


def replay_state(df, of=None):
    """The position of a :func:`replay_counted` source ``df``, marked as needing replay and
    named after ``of`` (the dataflow whose count ``df`` keeps; default ``df`` itself)."""
    s = PassPosition._get_position(df)
    s[REPLAY] = type(df if of is None else of).__name__
    return s


replay_state.replay_default = True


def skipped(ds, n):
    """``iter(ds)`` after its next ``n`` datapoints were read and dropped (at most ``n``: fewer
    if the pass ends first)."""
    it = iter(ds)
    for _ in range(n):
        if next(it, _END) is _END:
            break
    return it


def ranges(values):
    """Sorted ints as ``[[start, stop], ...]`` ranges."""
    out = []
    for v in sorted(values):
        if out and out[-1][1] == v:
            out[-1][1] = v + 1
        else:
            out.append([v, v + 1])
    return out


#: a runner's copy attaches its dataflow's position to its 1st, 17th, 33rd, ... datapoint, so
#: that a resumed copy re-makes at most this many minus one datapoints
MARK_EVERY = 16


def copy_mark(df):
    """What a runner's copy attaches to a datapoint now and then (see :data:`MARK_EVERY`):
    ``{"at": df's position}``, or ``{"cannot": why}`` when ``df`` cannot say where it is."""
    try:
        return {"at": df._get_position()}
    except NotImplementedError as e:
        return {"cannot": str(e)}


class CopiesPosition:
    """Mixed into the runners (before ``ParallelMapData``). Their workers run independent
    copies of a dataflow and hand over datapoints in the order they finish, so a runner's
    position is one position per copy: that copy's dataflow's position just after the last
    datapoint the caller received from it, plus the runner's own pass and count.

    Each copy's datapoint comes to the consumer as ``(copy, n, mark, datapoint)`` (see
    ``parallel.copies.OwnDataFlow``): ``n`` counts the copy's datapoints since it started and
    ``mark``, on one datapoint in :data:`MARK_EVERY`, is :func:`copy_mark` of the copy's
    dataflow. The consumer keeps, per copy, the last mark and the count since it (a few
    assignments per datapoint; no worker is asked anything), so a copy's position is "that mark,
    then ``skip`` datapoints"; a resumed copy loads the mark and re-makes the ``skip``
    datapoints. The number of copies is part of the stream, so a state loads only into a runner
    with as many (``ValueError`` otherwise).

    Where a copy cannot say where it is, the position is a replay position, as before copies had
    positions: the number of datapoints the pass handed over (``state_dict()`` raises unless
    ``replay=True``), and a resume fast-forwards by dropping that many datapoints (exact only
    with one copy and a deterministic dataflow). So is a runner with ``"auto"`` workers.

    The runner calls :meth:`_copy_entries` when it starts its workers (they start from those
    positions), wraps its pass iterator as ``self._replaying(self._tracked(it))`` and says the
    name of its copy count in ``_copies_name``."""

    _replay = None           # a loaded replay position, not yet used
    _loaded = None           # a loaded position with copies, not yet used
    _records = None          # per copy: [mark or None, its n, last n received]
    _copies_name = "num_proc"

    # -- the consumer's records -------------------------------------------------------------
    def _copy_entries(self):
        """Where each copy starts: ``None`` (afresh) or ``{"at", "skip"}``; sets the records."""
        loaded = self._loaded
        entries = loaded["copies"] if loaded is not None else [None] * self.num_workers
        self._records = [[None, 0, 0] if e is None else [{"at": e["at"]}, 0, int(e["skip"])]
                         for e in entries]
        return entries if loaded is not None else None

    def _tracked(self, it):
        """The datapoints of ``it`` (``(copy, n, mark, datapoint)`` each), recording where each
        copy is."""
        records = None
        for copy_id, n, mark, dp in it:
            if records is None:
                # taken once the pass has started: its first next() may have started the
                # workers (no reset_state() before, or one after close()), making new records
                records = self._records
            try:
                rec = records[copy_id]
            except IndexError:          # a worker added by the autotuner ("auto")
                records.extend([None, 0, 0] for _ in range(copy_id + 1 - len(records)))
                rec = records[copy_id]
            if mark is not None:
                rec[0], rec[1] = mark, n
            rec[2] = n
            yield dp

    # -- position -----------------------------------------------------------------------------
    def _get_position(self):
        if self._replay is not None:
            return dict(self._replay)
        if self._loaded is not None:
            return self._loaded
        if self._state is None and getattr(self, "_closed_position", None) is not None:
            return self._closed_position   # taken by close() (see ParallelMapData.close)
        st, records, r = self._state, self._records, self._resume
        if r is not None:              # iter() was called, its first next() not yet
            npass, handled, open_ = r["pass"], r["handled"], r["open"]
        elif st is None:
            npass, handled, open_ = 0, 0, False
        else:
            npass, handled, open_ = st.npass, st.handled if st.in_pass else 0, st.in_pass
        copies = []
        if self._tuner is not None:
            return self._counted_position(npass, handled)
        for rec in records if records is not None else [[None, 0, 0]] * self.num_workers:
            mark, n0, n = rec
            if mark is None:
                copies.append(None)        # nothing received from this copy: it starts afresh
            elif "cannot" in mark:
                return self._counted_position(npass, handled)
            else:
                copies.append({"at": mark["at"], "skip": n - n0})
        position = {"pass": npass, "handled": handled, "open": open_, "copies": copies}
        if len(copies) > 1:
            position[ARRIVAL] = type(self).__name__
        return position

    def _counted_position(self, npass, handled):
        return {"pass": npass, "pos": handled, REPLAY: type(self).__name__}

    def _set_position(self, position):
        if REPLAY in position:
            self._loaded = None
            self._replay = {"pass": int(position["pass"]), "pos": int(position["pos"]),
                            REPLAY: type(self).__name__}
            return
        copies = position["copies"]
        if self._tuner is not None or len(copies) != self.num_workers:
            have = "auto" if self._tuner is not None else self.num_workers
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the state was saved with "
                f"{self._copies_name}={len(copies)}, this runner has {self._copies_name}="
                f"{have!r}. A runner's stream is made by its copies, each resumed from its own "
                f"position, so their number must stay the same.")
        self._replay, self._loaded = None, position
        if self._exec is not None:
            self._stop()             # its copies are elsewhere: the next iter() restarts them

    def _abandon(self):
        loaded = self._loaded
        if loaded is not None:
            if loaded["open"]:
                self._loaded = dict(loaded, handled=0, open=False)
                self._loaded["pass"] = loaded["pass"] + 1
            return
        super()._abandon()

    def _resuming(self):
        """Called by ``__iter__``: start the workers at the loaded positions, and have the
        mapper continue the loaded pass."""
        loaded = self._loaded
        if loaded is None:
            return
        if self._exec is None:
            self.reset_state()
        self._loaded = None
        # the mapper's own resume (see ParallelMapData._endless_pass): its source, the tickets,
        # restarts; the pass and the count handed over continue
        self._resume = {"pass": int(loaded["pass"]), "run": 0, "index": 0, "skip": 0,
                        "done": [], "handled": int(loaded["handled"]),
                        "open": bool(loaded["open"])}

    # -- replay (copies that cannot say where they are) ------------------------------------
    def _replaying(self, it):
        r, self._replay = self._replay, None
        return it if r is None else self._fast_forward(it, r)

    def _fast_forward(self, it, r):
        skip, started = r["pos"], False
        for dp in it:
            if not started:               # the pass state exists once the pass has started
                self._state.npass, started = r["pass"], True
            if skip:
                skip -= 1
                continue
            yield dp

    def _fingerprint_name(self):
        return "Runner"              # threads, processes or Ray: the same stream

    def _fingerprint_params(self):
        return {}


# -- buffers of datapoints, kept as keys --------------------------------------------------------
def refill(source, keys, resume_at, keep_iterator=False):
    """Read again the datapoints whose keys are given, and leave ``source`` at ``resume_at``.

    ``keys`` is a list of ``(step, position)``: datapoint number ``step`` was read when the
    source was at ``position`` (steps count consecutive reads of ``source``). Returns
    ``{step: datapoint}``, or ``({step: datapoint}, iterator)`` with ``keep_iterator``: an
    iterator of ``source`` that continues from ``resume_at`` (or ``None``: call ``iter``).

    A source that can say where it is: consecutive steps are read in one go from the first
    one's position (from a step's own position where the source's pass ended before it), so
    exactly ``len(keys)`` datapoints are read, whatever the position in the pass. A source that
    needs replay (its positions are counts of datapoints since the start of its pass, see
    :func:`replay_counted`): it can only get somewhere by re-iterating its pass, so it is set
    once to the oldest key's position and read on to the newest one, and that iterator
    continues to ``resume_at``: one re-iteration of the pass up to the newest buffered
    datapoint, instead of one per run of consecutive keys."""
    out = {}
    steps = sorted(set(k for k, _ in keys))
    pos_of = dict(keys)
    if steps and _find_replay(pos_of[steps[0]]) is not None:
        out, it = _refill_sweep(source, steps, pos_of)
        if it is not None and keep_iterator and _same(source._get_position(), resume_at):
            return out, it
        close_iterator(it)
        steps = [k for k in steps if k not in out]
    i = 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        source._set_position(pos_of[steps[i]])
        it = iter(source)
        for step in steps[i:j + 1]:
            dp = next(it, _END)
            if dp is _END and step != steps[i]:
                # consecutive reads that crossed the end of a pass of the source: this one
                # was the first of the next pass, from the position recorded for it
                close_iterator(it)
                source._set_position(pos_of[step])
                it = iter(source)
                dp = next(it, _END)
            if dp is _END:
                raise ValueError(f"{type(source).__name__} ended while its datapoint {step} "
                                 "was being read again to restore a buffer: the source does "
                                 "not produce the same datapoints as when the state was saved")
            out[step] = dp
        close_iterator(it)
        i = j + 1
    source._set_position(resume_at)
    return (out, None) if keep_iterator else out


def _refill_sweep(source, steps, pos_of):
    """Read ``steps`` (sorted) in one iterator from the first one's position, as far as it
    goes; returns ``({step: datapoint}, the iterator or None if it ended first)``."""
    out = {}
    wanted = set(steps)
    source._set_position(pos_of[steps[0]])
    it = iter(source)
    for step in range(steps[0], steps[-1] + 1):
        dp = next(it, _END)
        if dp is _END:
            return out, None
        if step in wanted:
            out[step] = dp
    return out, it


def _same(a, b):
    """Whether two positions are equal once both are JSON (lists and tuples alike)."""
    import json
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def close_iterator(it):
    """Close ``it`` if it can be closed (a generator: its source's guard is released now)."""
    close = getattr(it, "close", None)
    if close is not None:
        close()


def rereadable(df, reader):
    """``True`` if datapoints of ``df`` can be read again from a position recorded when they
    were read (what :func:`refill` and a parallel map's resume do), otherwise the
    ``NotImplementedError`` that ``reader``'s ``state_dict()`` raises: ``df`` cannot say where
    it is, or it is (or reads from) a runner with several copies, whose datapoints come in
    the order the copies finish, so a position says where each copy is but not which datapoint
    comes next."""
    try:
        position = df._get_position()
    except NotImplementedError as e:
        return e
    runner = _find_key(position, ARRIVAL)
    if runner is not None:
        return NotImplementedError(
            f"{reader} reads datapoints again from recorded positions of its input, but "
            f"{runner} hands over its copies' datapoints in the order they finish, so a "
            f"position does not say which datapoint follows it: put {reader} inside the "
            f"runner's dataflow, or use a parallel map (MultiProcessMapData, ...) instead")
    unordered = _find_key(position, UNORDERED)
    if unordered is not None:
        return NotImplementedError(
            f"{reader} reads datapoints again from recorded positions of its input, but "
            f"{unordered} is an unordered map: it hands over results in the order its workers "
            f"finish them, so a position does not say which datapoint follows it. Make that "
            f"map ordered (ordered=True; its state is then exact), or put the work of "
            f"{reader} in its map function")
    return True


def _find_key(state, key):
    """The value of the first ``key`` found in the nested dicts and lists of ``state``."""
    stack = [state]
    while stack:
        s = stack.pop()
        if isinstance(s, dict):
            if key in s:
                return s[key]
            stack.extend(s.values())
        elif isinstance(s, list):
            stack.extend(s)
    return None


# -- keyed random streams -----------------------------------------------------------------------
def base_seed(df):
    """``df._base``, the seed of ``df``'s keyed streams, drawn once from ``df.rng``; ``None``
    while ``df`` has no random state yet (before ``reset_state``), in which case a position
    leaves it out and the resumed dataflow draws it from its own ``rng``, as this one will."""
    if df._base is None and df.rng is not None:
        df._base = int(df.rng.randint(2**31))
    return df._base


def optional_int(value):
    """``value`` as an int, or ``None``."""
    return None if value is None else int(value)

def keyed_generator(base, *key):
    """A ``numpy.random.Generator`` that is a pure function of ``base`` and ``key``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(base, spawn_key=key)))


def keyed_permutation(base, pass_number, n):
    """The permutation of ``range(n)`` for pass ``pass_number`` of a shuffled source."""
    return keyed_generator(base, pass_number).permutation(n)
