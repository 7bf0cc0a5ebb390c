"""The report's PNG plots (matplotlib, imported only here, when a report is written).
"""

from __future__ import annotations

import os
import sys
import textwrap
from typing import Any

from bench.common import FLOOR, REDIS, SYNCMANAGER, SYNCMGR, log
from bench.systems import _run_quiet
from bench.workloads import LAT_FLOOR_SIZE, LAT_OPS, LAT_RTS, WORKLOADS


def make_plots(R: dict[str, Any], out_dir: str, notes: list[str]) -> list[str]:
    try:
        import matplotlib
    except ImportError:
        log("matplotlib is not installed in this venv: installing it now "
            f"({sys.executable} -m pip install matplotlib) for the plots; "
            "`pip install -e 'pyclient[bench]'` installs it for good")
        ok = _run_quiet([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], 600)
        try:
            import importlib

            importlib.invalidate_caches()
            import matplotlib  # noqa: F811
        except ImportError:
            notes.append("plots skipped: matplotlib is not installed and could not be installed"
                         + ("" if ok else " (pip failed)"))
            return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {FLOOR: "#888888", SYNCMGR: "#1f77b4", SYNCMANAGER: "#d62728", REDIS: "#2ca02c"}
    files = []
    lat = R["latency"]
    systems = R["systems"]
    keys = [k for k, _, _, _ in LAT_OPS if k not in ("raw_ping",) and any(k in lat.get(s, {}) for s in systems)]
    labels = {"rtt": "round trip 8 B", "lock": "Lock acq+rel", "ev_is_set": "Event is_set", "ev_set": "Event set",
              "val_get": "Value get", "val_set": "Value set", "add": "atomic add", "lgs": "lock+get+set",
              "q8": "Queue 8 B", "q64k": "Queue 64 KiB", "q1m": "Queue 1 MiB", "create_named": "create named",
              "create_anon": "create anon", "unpickle": "unpickle+call\n(fresh process)"}
    series = [FLOOR] + systems
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(keys) + 1.8))
    h = 0.8 / len(series)
    for j, s in enumerate(series):
        ys, xs, errs = [], [], []
        for i, k in enumerate(keys):
            if s == FLOOR:
                rts = LAT_RTS[k]
                fl = lat.get(FLOOR, {}).get(k) or lat.get(FLOOR, {}).get(f"echo{LAT_FLOOR_SIZE[k]}")
                if not fl or not rts:
                    continue
                v = {"median": fl["median"] * rts, "p99": fl["p99"] * rts}
            else:
                v = lat.get(s, {}).get(k)
                if not v:
                    continue
            ys.append(i + (j - (len(series) - 1) / 2) * h)
            xs.append(v["median"])
            errs.append(max(v["p99"] - v["median"], 0))
        if xs:
            ax.barh(ys, xs, height=h, color=colors.get(s), label=s + (" (echo x RTs)" if s == FLOOR else ""),
                    xerr=[[0] * len(errs), errs], error_kw={"elinewidth": 0.6, "capsize": 1.5, "alpha": 0.6})
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([labels.get(k, k) for k in keys])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("latency, microseconds (bar: median, whisker: p99; log scale)")
    ax.set_title("Single-client latency per operation")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    p = os.path.join(out_dir, "bench-latency.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    files.append(p)

    tp = R.get("throughput", {})
    if tp:
        fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(13, 4.2))
        for ax, (wl, label) in zip(axes, WORKLOADS):
            cells = tp.get(wl, {})
            ns = sorted(int(n) for n in cells)
            for s in systems:
                xs = [n for n in ns if s in cells.get(n, cells.get(str(n), {}))]
                ys = [cells.get(n, cells.get(str(n)))[s]["ops_per_s"] for n in xs]
                if xs:
                    ax.plot(xs, ys, marker="o", color=colors.get(s), label=s)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ns)
            ax.set_xticklabels([str(n) for n in ns])
            ax.set_yscale("log")
            ax.set_xlabel("client processes")
            ax.set_title(textwrap.fill(label, 40), fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel("aggregate ops/s (log)")
        axes[0].legend(fontsize=8)
        fig.suptitle("Multi-client throughput vs client count")
        fig.tight_layout()
        p = os.path.join(out_dir, "bench-throughput.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files.append(p)
    return files
