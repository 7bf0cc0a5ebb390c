"""``make demo-compare``: every setup over the same seeds, interleaved, in fresh processes.

Each run is ``ray_replay_demo.py --setup S --seed N`` in a child process; its
JSON summary gives the figures. The table reports, per setup, the median and
the spread (min-max) of wall-clock and env steps to the criterion, the final
return and the throughput; the overlay plot draws every run's greedy return
against wall-clock. docs/benchmarks.md is rewritten only with --write-docs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
from typing import Optional

import numpy as np

from .config import SETUPS, machine_cpus
from .report import ShmWatch, load_json, write_json

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(REPO, "examples", "ray_replay_demo.py")
BENCH_BEGIN = "<!-- demo-compare:begin (written by `make demo-compare WRITE_DOCS=1`; edit examples/apex/compare.py) -->"
BENCH_END = "<!-- demo-compare:end -->"
COLORS = {"syncmgr": "tab:blue", "syncmanager": "tab:orange", "mp": "tab:green", "single": "tab:red"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compare", action="store_true", help="run every setup over --repeats seeds, interleaved")
    p.add_argument("--repeats", type=int, default=5, help="with --compare: seeds --seed, --seed+1, ...")
    p.add_argument("--setups", default=",".join(SETUPS), help="with --compare: which setups, comma-separated")
    p.add_argument("--write-docs", action="store_true",
                   help="with --compare: rewrite the demo's section of docs/benchmarks.md")
    p.add_argument("--tabulate", metavar="DIR", default=None,
                   help="with --compare: no runs, tabulate the summaries an earlier --compare left in DIR")


def _passthrough(argv: list[str]) -> list[str]:
    """The flags of the compare command line that every run takes too."""
    own = {"--compare", "--write-docs", "--quiet"}
    with_value = {"--repeats", "--setups", "--setup", "--seed", "--out-dir", "--tabulate"}
    out, it = [], iter(argv)
    for a in it:
        name = a.split("=")[0]
        if name in own:
            continue
        if name in with_value:
            if "=" not in a:
                next(it, None)
            continue
        out.append(a)
    return out


def run_one(setup: str, seed: int, extra: list[str], out_dir: str) -> tuple[int, Optional[dict], list[str]]:
    """One run in a fresh interpreter: (exit code, its summary, /dev/shm files still there after it exited)."""
    cmd = [sys.executable, DEMO, "--setup", setup, "--seed", str(seed), "--quiet", "--out-dir", out_dir, *extra]
    before = ShmWatch.listing()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    after = ShmWatch.listing()
    path = next((ln.split("summary: ", 1)[1].strip() for ln in proc.stdout.splitlines()
                 if ln.startswith("summary: ")), None)
    if path is None or not os.path.exists(path):
        print(proc.stdout[-3000:], file=sys.stderr)
        return proc.returncode, None, []
    s = load_json(path)
    ours = set(s["shm_pending_atexit"]) | {os.path.basename(p) for p in s["left_behind"]}
    return proc.returncode, s, sorted((after - before) & ours)


def main(args: argparse.Namespace) -> int:
    setups = [s for s in args.setups.split(",") if s]
    bad = [s for s in setups if s not in SETUPS]
    if bad:
        print(f"unknown setups: {bad}", file=sys.stderr)
        return 2
    extra = _passthrough(sys.argv[1:])
    out_dir = os.path.join(args.out_dir, "compare")
    os.makedirs(out_dir, exist_ok=True)
    runs: dict[str, list[dict]] = {s: [] for s in setups}
    failures: list[str] = []
    if args.tabulate:
        for name in sorted(os.listdir(args.tabulate)):
            if name.endswith(".json"):
                s = load_json(os.path.join(args.tabulate, name))
                if s["setup"] in runs:
                    left = os.path.join(args.tabulate, f"left-{s['setup']}-seed{s['seed']}.txt")
                    s["left_after_exit"] = (load_json(left)["left_after_exit"] if os.path.exists(left) else
                                            [os.path.basename(p) for p in s["left_behind"]])
                    s["_mtime"] = os.path.getmtime(os.path.join(args.tabulate, name))
                    runs[s["setup"]].append(s)
        return finish(runs, args, extra, out_dir, failures)
    order = [(setups[(r + i) % len(setups)], args.seed + r) for r in range(args.repeats) for i in range(len(setups))]
    for n, (setup, seed) in enumerate(order, 1):
        rc, s, left = run_one(setup, seed, extra, out_dir)
        if s is None:
            failures.append(f"{setup} seed {seed}: no summary (exit {rc})")
            print(f"[{n}/{len(order)}] {setup:12s} seed {seed}: FAILED (exit {rc})", flush=True)
            continue
        s["left_after_exit"] = left
        runs[setup].append(s)
        at = s["solved_at"]
        print(f"[{n}/{len(order)}] {setup:12s} seed {seed}: "
              + (f"criterion at {at['wall_s']:.1f} s, {at['env_steps']} env steps" if at else f"not solved "
                 f"({s['reason']})")
              + f"; {s['throughput']['updates_per_s']:.0f} updates/s; left after exit: {len(left)}", flush=True)
        write_json({k: s[k] for k in ("setup", "seed", "left_after_exit")},
                   os.path.join(out_dir, f"left-{setup}-seed{seed}.txt"))
    return finish(runs, args, extra, out_dir, failures)


def finish(runs: dict[str, list[dict]], args: argparse.Namespace, extra: list[str], out_dir: str,
           failures: list[str]) -> int:
    lines = table(runs, args, extra)
    plot_path = os.path.join(out_dir, "demo-compare.png")
    overlay(runs, plot_path)
    print()
    print("\n".join(lines))
    print(f"\noverlay plot: {plot_path}")
    for f in failures:
        print("error: " + f, file=sys.stderr)
    if args.write_docs:
        docs_png = os.path.join(REPO, "docs", "demo-compare.png")
        overlay(runs, docs_png)
        write_bench_section(lines)
        print(f"wrote the comparison into docs/benchmarks.md and {docs_png}")
    return 0 if not failures else 1


def _stat(xs: list[float], fmt: str = "{:.0f}") -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{fmt.format(float(np.median(xs)))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def _utc(t: float) -> str:
    return f"{datetime.datetime.fromtimestamp(t, datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"


def table(runs: dict[str, list[dict]], args: argparse.Namespace, extra: list[str]) -> list[str]:
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    env = next((s["env"] for v in runs.values() for s in v), "CartPole-v1")
    any_s = next((s for v in runs.values() for s in v), None)
    rule = any_s["rule"] if any_s else ""
    times = [s["_mtime"] for v in runs.values() for s in v if "_mtime" in s]
    when = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load average at the end {load} "
            "(1/5/15 min)" if not times else f"runs ended {_utc(min(times))}–{_utc(max(times))[-9:]}")
    seeds = sorted({s["seed"] for v in runs.values() for s in v})
    head = [f"Ape-X DQN on {env}, {max((len(v) for v in runs.values()), default=0)} seeds per setup "
            f"({', '.join(map(str, seeds))}), setups interleaved ({when}, {machine_cpus()} CPUs, Python "
            f"{platform.python_version()}{', flags ' + ' '.join(extra) if extra else ''}). Criterion: {rule}. "
            "Wall-clock is from the moment every worker was up; medians, with min–max in brackets over the "
            "runs that met the criterion.", "",
            "| setup | met | wall-clock to criterion (s) | env steps to criterion | updates to criterion | "
            "s per 100k env steps | final return | inserted/s | sampled/s | learner updates/s | workers up (s) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = []
    for setup, v in runs.items():
        solved = [s for s in v if s["solved_at"]]
        rows.append(
            f"| {setup} | {len(solved)}/{len(v)} | {_stat([s['solved_at']['wall_s'] for s in solved], '{:.1f}')} | "
            f"{_stat([s['solved_at']['env_steps'] for s in solved])} | "
            f"{_stat([s['solved_at']['updates'] for s in solved])} | "
            f"{_stat([1e5 * s['solved_at']['wall_s'] / s['solved_at']['env_steps'] for s in solved], '{:.1f}')} | "
            f"{_stat([s['final_return'] for s in v])} | "
            f"{_stat([s['throughput']['added_per_s'] for s in v])} | "
            f"{_stat([s['throughput']['samples_per_s'] for s in v])} | "
            f"{_stat([s['throughput']['updates_per_s'] for s in v])} | "
            f"{_stat([s['startup_seconds'] for s in v], '{:.1f}')} |")
    notes = ["", "The algorithm, its hyperparameters and the seeds are the same in every setup, so env steps "
             "to the criterion should match across setups: their spread is the algorithm's own (seed to seed, "
             "and the explorers' asynchrony), not the coordination's. Only wall-clock should differ, by how "
             "fast each setup moves transitions, samples and weights. The rate limiter holds every setup at "
             "the same samples-per-insert ratio, so the env steps per learner update are the same too. With "
             "5 seeds the algorithm's own spread in env steps is wide enough to hide the coordination in the "
             "wall-clock medians; seconds per 100k env steps (wall-clock to the criterion over env steps to "
             "it) takes it out and compares the setups' speed on the same work."]
    for setup, v in runs.items():
        runs_left = [s for s in v if s.get("left_after_exit")]
        left = [n for s in runs_left for n in s["left_after_exit"]]
        pend = max((len(s["shm_pending_atexit"]) for s in v), default=0)
        notes.append(f"- {setup}: left behind after the run's process exited: "
                     + (f"{len(left)} file(s) in {len(runs_left)} of {len(v)} runs ({', '.join(left)})" if left
                        else "nothing")
                     + (f" ({pend} cpprb SharedMemory files per run waited for its atexit hook)" if pend else ""))
    return head + rows + notes


def overlay(runs: dict[str, list[dict]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    thr = None
    for setup, v in runs.items():
        for i, s in enumerate(v):
            ev = s["evaluations"]
            thr = s["threshold"]
            ax.plot([e["wall_s"] for e in ev], [e["mean_return"] for e in ev], color=COLORS.get(setup), lw=1,
                    alpha=0.8, label=setup if i == 0 else None)
            if s["solved_at"]:
                ax.plot([s["solved_at"]["wall_s"]], [s["solved_at"]["mean_return"]], "o", color=COLORS.get(setup),
                        ms=4)
    if thr is not None:
        ax.axhline(thr, color="g", ls="--", lw=1, label=f"threshold {thr:.0f}")
    ax.set_xlabel("seconds since the workers were up")
    ax.set_ylabel("mean greedy return")
    ax.set_title("Ape-X DQN, every setup and seed (dots: criterion met)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=70)
    plt.close(fig)


def write_bench_section(lines: list[str]) -> None:
    """Replace (or append) the demo's own section of docs/benchmarks.md, between its markers."""
    path = os.path.join(REPO, "docs", "benchmarks.md")
    text = open(path).read() if os.path.exists(path) else ""
    body = "\n".join([BENCH_BEGIN, "## The Ray replay demo: every setup, over seeds", "",
                      "`make demo-compare WRITE_DOCS=1` runs `examples/ray_replay_demo.py` in fresh processes, "
                      "each setup on the same seeds, interleaved, and writes this section and "
                      "[demo-compare.png](demo-compare.png) (the rest of the file is `make bench`'s). Setups: "
                      "`syncmgr` (Ray actors, an embedded daemon, cpprb's default backend); `syncmanager` "
                      "(Ray actors on `multiprocessing.SyncManager` with cpprb's documented set-up: "
                      "`backend=\"SharedMemory\"` and the authkey workaround); `mp` (fork-started processes on "
                      "plain `multiprocessing`, no Ray: the floor that cannot cross into Ray workers); "
                      "`single` (one process, cpprb's `PrioritizedReplayBuffer`, no coordination at all).", "",
                      *lines, "", "![return against wall-clock, every setup and seed](demo-compare.png)", "",
                      BENCH_END])
    start, end = text.find(BENCH_BEGIN.split(" (")[0]), text.find(BENCH_END)
    if start >= 0 and end > start:
        text = text[:start] + body + text[end + len(BENCH_END):]
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    with open(path, "w") as f:
        f.write(text)


