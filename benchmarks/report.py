"""Summaries, pair-by-pair ratios, the Markdown table and the PNG chart (harness side, no numpy)."""
import statistics

from .systems import BATCHING, SYSTEMS, applies

SERIAL = "dataflow-serial"
TABLE = "dataflow-table"
SERIAL_RATIO_WORKLOADS = (4, 5, "img", "fbresnet")   # goals relative to serial MapData


def _stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def _ok_by_repeat(runs, workload, system):
    return {r["repeat"]: r for r in runs
            if r["workload"] == workload and r["system"] == system and r["status"] == "ok"}


def pair_ratio(runs, workload, num, den):
    """num / den throughput, repeat by repeat (runs of one repeat ran back to back)."""
    a = _ok_by_repeat(runs, workload, num)
    b = _ok_by_repeat(runs, workload, den)
    values = [a[r]["throughput_dps"] / b[r]["throughput_dps"]
              for r in sorted(set(a) & set(b))
              if a[r].get("throughput_dps") and b[r].get("throughput_dps")]
    return _stats(values)


def summarize(runs, workloads, systems):
    rows = []
    for w in workloads:
        for s in systems:
            if not applies(s, w):
                continue
            mine = [r for r in runs if r["workload"] == w and r["system"] == s]
            ok = [r for r in mine if r["status"] == "ok"]
            statuses = {}
            for r in mine:
                statuses[r["status"]] = statuses.get(r["status"], 0) + 1
            row = {
                "workload": w, "system": s, "runs": len(mine), "ok": len(ok),
                "statuses": statuses,
                "throughput_dps": _stats([r.get("throughput_dps") for r in ok]),
                "mbps": _stats([r.get("mbps") for r in ok]),
                "startup_s": _stats([r.get("startup_s") for r in ok]),
                "teardown_s": _stats([r.get("teardown_s") for r in ok]),
                # teardowns killed at the cap count as the cap: a lower bound
                "teardown_censored": sum(1 for r in ok if r.get("teardown_censored")),
                "teardown_kind": sorted({r.get("teardown_kind") for r in ok if
                                         r.get("teardown_kind")}),
                "errors": sorted({r["error"] for r in mine if r.get("error")}),
                # what the system reported about itself (e.g. the executor MapData chose)
                "details": sorted({r["detail"] for r in ok if r.get("detail")}),
            }
            counterpart = SYSTEMS[s][2]
            if counterpart is not None:
                row["counterpart"] = counterpart
                row["ratio"] = (pair_ratio(runs, w, counterpart, s)
                                if counterpart in systems else None)
            if s != SERIAL and SERIAL in systems:
                row["serial_ratio"] = pair_ratio(runs, w, s, SERIAL)
            rows.append(row)
    return rows


def all_ratios(runs, workloads, systems):
    """Every dataflow system against every other system, pair by pair (for the JSON)."""
    out = []
    for w in workloads:
        for d in systems:
            if SYSTEMS[d][0] != "dataflow":
                continue
            for p in systems:
                if p != d:
                    st = pair_ratio(runs, w, d, p)
                    if st:
                        out.append({"workload": w, "dataflow": d, "peer": p, "ratio": st})
    return out


# -------------------------------------------------------------------------------- formatting
def _num(x, unit=1.0):
    x = x * unit
    if x >= 100:
        return "{:,.0f}".format(x)
    if x >= 10:
        return "{:.1f}".format(x)
    return "{:.2f}".format(x)


def _cell(st, unit=1.0, censored=0):
    """median (min–max); with ``censored`` runs stopped at a cap (the largest values), the
    figures that may be such a lower bound get a '≥'."""
    if st is None:
        return "—"
    n = st["n"]
    mark_max = "≥" if censored else ""
    mark_med = "≥" if censored and censored >= (n + 1) // 2 else ""
    mark_min = "≥" if censored and censored == n else ""
    if n == 1:
        return mark_max + _num(st["median"], unit)
    return "%s%s (%s%s–%s%s)" % (mark_med, _num(st["median"], unit), mark_min,
                                 _num(st["min"], unit), mark_max, _num(st["max"], unit))


def _ratio_cell(st, label=None):
    if st is None:
        return "n/a"
    text = "%.2f (%.2f–%.2f)" % (st["median"], st["min"], st["max"]) if st["n"] > 1 else \
        "%.2f" % st["median"]
    if label:
        text += " vs " + label
    return text


def _failure_cell(row):
    parts = []
    for status, n in sorted(row["statuses"].items()):
        if status != "ok":
            parts.append("%s ×%d" % (status, n))
    return ", ".join(parts)


def markdown(rows, workloads_meta):
    head = ("| workload | system | ok runs | datapoints/s | MB/s | startup ms | teardown ms "
            "| dataflow ÷ peer | ÷ dataflow-serial |")
    out = [head, "|" + "---|" * 9]
    for row in rows:
        w = row["workload"]
        label = "%s %s" % (w, workloads_meta[w])
        if row["ok"] == 0:
            tp = "**%s**" % (_failure_cell(row) or "no run")
            cells = [tp, "—", "—", "—"]
        else:
            tp = _cell(row["throughput_dps"])
            failed = _failure_cell(row)
            if failed:
                tp += " (+%s)" % failed
            mb = _cell(row["mbps"]) if row["mbps"] and row["mbps"]["max"] >= 0.005 else "—"
            cells = [tp, mb, _cell(row["startup_s"], 1e3),
                     _cell(row["teardown_s"], 1e3, row["teardown_censored"])]
        if "counterpart" in row:
            if row.get("ratio") is None:
                ratio = "n/a (no ok run of %s)" % row["counterpart"] if row["ok"] else "n/a"
            else:
                ratio = _ratio_cell(row["ratio"], row["counterpart"])
        else:
            ratio = ""
        serial = ""
        if w in SERIAL_RATIO_WORKLOADS and row["system"] != SERIAL:
            serial = _ratio_cell(row.get("serial_ratio"))
        system = row["system"]
        if row.get("details"):
            system += " (%s)" % "; ".join(row["details"])
        out.append("| %s | %s | %d/%d | %s | %s | %s |" % (
            label, system, row["ok"], row["runs"], " | ".join(cells), ratio, serial))
    return "\n".join(out)


def img_choice_lines(runs, systems, workload="img"):
    """Lines saying how the run-in-thread table's choice (``dataflow-table``) compares with every
    other system on the image workload, pair by pair; empty when it did not run."""
    if TABLE not in systems:
        return []
    chosen = sorted({r.get("detail") for r in runs if r["workload"] == workload
                     and r["system"] == TABLE and r["status"] == "ok" and r.get("detail")})
    parts = []
    for other in systems:
        if other == TABLE or not applies(other, workload):
            continue
        st = pair_ratio(runs, workload, TABLE, other)
        parts.append("%s %s" % (other, _ratio_cell(st)))
    if not parts:
        return []
    return ["- %s: the table's choice (%s) ÷ each system, images/s, repeat by repeat (> 1: the "
            "table's choice is faster): %s" % (workload, "; ".join(chosen) or "no ok run",
                                              ", ".join(parts))]


# -------------------------------------------------------------------------------- chart
def write_png(rows, workloads_meta, path, title, rank=None):
    """Bar chart of the ratios (and, given ``rank``, of each library's best configuration over
    the best peer's, per workload); returns a message saying what happened."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return "PNG skipped: matplotlib is not importable (%s); pip install matplotlib" % exc
    peer_rows = [r for r in rows if r.get("ratio")]
    serial_rows = [r for r in rows if r["workload"] in SERIAL_RATIO_WORKLOADS
                   and r.get("serial_ratio")]
    if not peer_rows and not serial_rows:
        return "PNG skipped: no ratio could be computed (no pair of systems ran)"
    panels = [p for p in ((peer_rows, "ratio", "dataflow ÷ peer (throughput, >1: dataflow faster)",
                           lambda r: "%s vs %s" % (r["counterpart"], r["system"])),
                          (serial_rows, "serial_ratio",
                           "÷ dataflow-serial (throughput)", lambda r: r["system"])) if p[0]]
    rank = [r for r in (rank or ()) if r.get("best_peer")]
    fig, axes = plt.subplots(len(panels) + bool(rank), 1,
                             figsize=(11, 4.2 * (len(panels) + bool(rank))), squeeze=False)
    if rank:
        _ranking_panel(axes[0, 0], rank, workloads_meta)
    for ax, (prow, key, ylabel, series_of) in zip(axes[1 if rank else 0:, 0], panels):
        workloads = []
        for r in prow:                    # in the order run (ids mix ints and "img")
            if r["workload"] not in workloads:
                workloads.append(r["workload"])
        series = []
        for r in prow:
            if series_of(r) not in series:
                series.append(series_of(r))
        width = 0.8 / max(1, len(series))
        for i, name in enumerate(series):
            xs, ys, lo, hi = [], [], [], []
            for j, w in enumerate(workloads):
                for r in prow:
                    if r["workload"] == w and series_of(r) == name:
                        st = r[key]
                        xs.append(j - 0.4 + width * (i + 0.5))
                        ys.append(st["median"])
                        lo.append(st["median"] - st["min"])
                        hi.append(st["max"] - st["median"])
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=name)
            for x, y, up in zip(xs, ys, hi):
                ax.annotate("%.2f" % y, (x, y + up), xytext=(0, 2), textcoords="offset points",
                            ha="center", va="bottom", fontsize=6)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(workloads)))
        ax.set_xticklabels(["%s: %s" % (w, workloads_meta[w]) for w in workloads], fontsize=7)
        ax.set_ylabel(ylabel)
        tops = [r[key]["max"] for r in prow] + [1.0]
        bottoms = [r[key]["min"] for r in prow if r[key]["min"] > 0] + [1.0]
        if max(tops) / min(bottoms) > 5:
            from matplotlib.ticker import FuncFormatter
            ax.set_yscale("log")
            fmt = FuncFormatter(lambda v, _pos: "%g" % v)
            ax.yaxis.set_major_formatter(fmt)
            ax.yaxis.set_minor_formatter(fmt)

        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3, which="both")
    axes[0, 0].set_title(title + "  (bars: median; whiskers: min–max over repeats)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "PNG written to %s" % path


# -------------------------------------------------------------------------------- ranking
def runs_at(runs, workers):
    """The runs of the table at worker count ``workers``: those at that count, and those of the
    systems whose count does not follow --workers (serial ones, fixed ones)."""
    from .systems import FIXED_WORKERS
    return [r for r in runs
            if r.get("workers") in (None, workers) or r["system"] in FIXED_WORKERS]


def _median_tp(runs, workload, system):
    st = _stats([r.get("throughput_dps") for r in _ok_by_repeat(runs, workload, system).values()])
    return st["median"] if st else None


def ranking(runs, workloads, systems):
    """Per workload, the best configuration (highest median throughput) of each library, and
    best dataflow ÷ best peer, repeat by repeat. Returns a list of dicts."""
    families = []
    for s in systems:
        if SYSTEMS[s][0] not in families:
            families.append(SYSTEMS[s][0])
    out = []
    for w in workloads:
        best = {}
        for fam in families:
            cands = [(_median_tp(runs, w, s), s) for s in systems
                     if SYSTEMS[s][0] == fam and applies(s, w) and s not in BATCHING]
            cands = [c for c in cands if c[0] is not None]
            if cands:
                tp, s = max(cands)
                best[fam] = {"system": s, "throughput_dps": tp}
        order = sorted(best, key=lambda f: -best[f]["throughput_dps"])
        peers = [f for f in order if f != "dataflow"]
        row = {"workload": w, "best": best, "order": order,
               "best_peer": best[peers[0]]["system"] if peers else None}
        if "dataflow" in best and peers:
            row["best_dataflow"] = best["dataflow"]["system"]
            row["ratio"] = pair_ratio(runs, w, row["best_dataflow"], row["best_peer"])
        out.append(row)
    return out


# The goals of issue 19: best dataflow >= best peer everywhere, >= 1.2x on these.
RANK_GOALS = {"img": 1.2, "fbresnet": 1.2}


def ranking_markdown(rank, workloads_meta):
    families = []
    for row in rank:
        for f in row["best"]:
            if f not in families:
                families.append(f)
    head = "| workload | " + " | ".join(families) + " | best dataflow ÷ best peer | goal |"
    out = [head, "|" + "---|" * (len(families) + 3)]
    for row in rank:
        cells = []
        for f in families:
            b = row["best"].get(f)
            if b is None:
                cells.append("—")
                continue
            place = row["order"].index(f) + 1
            cells.append("#%d %s: %s" % (place, b["system"], _num(b["throughput_dps"])))
        st = row.get("ratio")
        goal = RANK_GOALS.get(row["workload"], 1.0)
        if st is None:
            ratio, met = "n/a", ""
        else:
            ratio = "%s vs %s" % (_ratio_cell(st), row["best_peer"])
            met = ("met (≥ %.1f)" if st["median"] >= goal else "**missed** (< %.1f)") % goal
        w = row["workload"]
        out.append("| %s %s | %s | %s | %s |" % (w, workloads_meta.get(w, ""), " | ".join(cells),
                                                ratio, met))
    return "\n".join(out)


def scaling(runs, workloads, systems, worker_counts):
    """Per workload and library: its best parallel configuration at each worker count, over its
    own serial configuration (repeat by repeat). Libraries without a serial system are left
    out."""
    from .systems import is_serial
    out = []
    families = []
    for s in systems:
        if SYSTEMS[s][0] not in families:
            families.append(SYSTEMS[s][0])
    for w in workloads:
        for fam in families:
            serial = [s for s in systems if SYSTEMS[s][0] == fam and is_serial(s) and applies(s, w)]
            if not serial:
                continue
            serial = serial[0]
            row = {"workload": w, "library": fam, "serial": serial,
                   "serial_dps": _median_tp(runs, w, serial), "at": {}}
            for n in worker_counts:
                at = [r for r in runs if r.get("workers") == n]
                cands = [(_median_tp(at, w, s), s) for s in systems
                         if SYSTEMS[s][0] == fam and not is_serial(s) and applies(s, w)
                         and s not in BATCHING]
                cands = [c for c in cands if c[0] is not None]
                if not cands:
                    continue
                tp, s = max(cands)
                # the serial runs carry workers=None: pair them by repeat with the runs at n
                both = at + [r for r in runs if r["system"] == serial]
                row["at"][n] = {"system": s, "throughput_dps": tp,
                                "over_serial": pair_ratio(both, w, s, serial)}
            out.append(row)
    return out


def scaling_markdown(rows, worker_counts, cpus, workloads_meta):
    heads = ["%d workers%s" % (n, " (oversubscribed: %d CPUs)" % cpus if n > cpus else "")
             for n in worker_counts]
    out = ["| workload | library (serial dp/s) | " + " | ".join(heads) + " |",
           "|" + "---|" * (len(worker_counts) + 2)]
    for row in rows:
        cells = []
        for n in worker_counts:
            a = row["at"].get(n)
            if a is None:
                cells.append("—")
            else:
                st = a["over_serial"]
                cells.append("%s× (%s)" % ("%.2f" % st["median"] if st else "n/a", a["system"]))
        serial = _num(row["serial_dps"]) if row["serial_dps"] else "—"
        w = row["workload"]
        out.append("| %s %s | %s (%s) | %s |" % (w, workloads_meta.get(w, ""), row["library"],
                                                 serial, " | ".join(cells)))
    return "\n".join(out)


def _ranking_panel(ax, rank, workloads_meta):
    """Per workload, each library's best configuration ÷ the best peer's (medians); the dataflow
    bar is the repeat-by-repeat ratio (median), as in the ranking table."""
    libs = []
    for row in rank:
        for f in row["best"]:
            if f not in libs:
                libs.append(f)
    width = 0.8 / max(1, len(libs))
    for i, lib in enumerate(libs):
        xs, ys, labels = [], [], []
        for j, row in enumerate(rank):
            b = row["best"].get(lib)
            ref = row["best"][SYSTEMS[row["best_peer"]][0]]["throughput_dps"]
            if b is None or not ref:
                continue
            st = row.get("ratio") if lib == "dataflow" else None
            y = st["median"] if st else b["throughput_dps"] / ref
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(y)
            labels.append("%.2f" % y)
        ax.bar(xs, ys, width, label=lib)
        for x, y, text in zip(xs, ys, labels):
            ax.annotate(text, (x, y), xytext=(0, 2), textcoords="offset points", ha="center",
                        va="bottom", fontsize=6)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rank)))
    ax.set_xticklabels(["%s: %s\nbest peer %s" % (r["workload"], workloads_meta[r["workload"]],
                                                   r["best_peer"]) for r in rank], fontsize=7)
    ax.set_ylabel("best config of each library ÷ best peer")
    ax.legend(fontsize=8, ncol=min(6, len(libs)))
    ax.grid(axis="y", alpha=0.3)
