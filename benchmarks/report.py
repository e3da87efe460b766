"""Summaries, pair-by-pair ratios, the Markdown table and the PNG chart (harness side, no numpy)."""
import statistics

from .systems import SYSTEMS, applies

SERIAL = "dataflow-serial"
TABLE = "dataflow-table"
SERIAL_RATIO_WORKLOADS = (4, 5, "img")   # the goals there are relative to serial MapData


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
def write_png(rows, workloads_meta, path, title):
    """Bar chart of the ratios; returns a message saying what happened."""
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
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 4.2 * len(panels)), squeeze=False)
    for ax, (prow, key, ylabel, series_of) in zip(axes[:, 0], panels):
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
