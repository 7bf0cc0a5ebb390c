"""What a run left behind, and what it shows: the printed summary, the JSON summary and the plot."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from typing import Any

import numpy as np

SHM_DIR = "/dev/shm"


def descendants(root: int) -> list[int]:
    """root and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


class ShmWatch:
    """What this run put in /dev/shm: a snapshot before and after, and the names
    this process and its descendants (the daemon, Ray, the explorers) had mapped
    or open while it ran, so that a file another program made meanwhile is not
    blamed on the run (and one the run made is, whatever its prefix)."""

    def __init__(self) -> None:
        self.before = self.listing()
        self.touched: set[str] = set()
        self.last_poll = 0.0

    @staticmethod
    def listing() -> set[str]:
        return set(os.listdir(SHM_DIR)) if os.path.isdir(SHM_DIR) else set()

    def poll(self) -> None:
        self.last_poll = time.monotonic()
        procs = descendants(os.getpid())
        prefix = SHM_DIR + "/"
        for pid in procs:
            try:
                with open(f"/proc/{pid}/maps") as f:
                    for line in f:
                        i = line.find(prefix)
                        if i >= 0:
                            self.touched.add(line[i + len(prefix):].rstrip("\n").removesuffix(" (deleted)"))
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    except OSError:
                        continue
                    if target.startswith(prefix):
                        self.touched.add(target[len(prefix):].removesuffix(" (deleted)"))
            except OSError:
                continue  # exited meanwhile, or not ours to read

    def left(self, extra_names: set[str]) -> tuple[list[str], list[str]]:
        """(files the run left behind, new files it never touched): a new file
        is the run's if its processes touched it or it is named in extra_names
        (its daemon's registry)."""
        new = self.listing() - self.before
        ours = sorted(n for n in new if n in self.touched or n in extra_names)
        return ours, sorted(new - set(ours))


class Progress:
    """On a terminal, a tqdm bar of the best greedy return against the target;
    otherwise (CI logs) a plain line every few seconds."""

    def __init__(self, target: float, every: float = 2.0, enabled: bool = True) -> None:
        self.enabled, self.every, self.last = enabled, every, 0.0
        self.bar: Any = None
        if enabled and sys.stdout.isatty():
            from tqdm import tqdm

            try:
                sized = os.get_terminal_size(sys.stdout.fileno()).columns > 0
            except OSError:
                sized = False
            self.bar = tqdm(total=int(target), desc="best greedy return", leave=True, file=sys.stdout,
                            dynamic_ncols=sized, ncols=None if sized else 120,  # a pty without a size: 120
                            bar_format="{desc}: {n:.0f}/{total_fmt} |{bar}| {elapsed}{postfix}")

    def update(self, best: float, info: dict[str, str], force: bool = False) -> None:
        if self.bar is not None:
            self.bar.n = max(0.0, min(best, float(self.bar.total)))
            self.bar.set_postfix(info, refresh=False)
            self.bar.refresh()
            return
        now = time.monotonic()
        if self.enabled and (force or now - self.last >= self.every):
            self.last = now
            print("  " + "  ".join(f"{k} {v}" for k, v in info.items()), flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def mapped_shm() -> set[str]:
    """The /dev/shm files this process has mapped (not counting unlinked ones, e.g. Ray's object store)."""
    names = set()
    with open("/proc/self/maps") as f:
        for line in f:
            i = line.find(SHM_DIR + "/")
            if i >= 0 and not line.rstrip("\n").endswith(" (deleted)"):
                names.add(line[i + len(SHM_DIR) + 1:].rstrip("\n"))
    return names


# --- the printed summary ---------------------------------------------------------------------------


def _ms(res: dict) -> dict[str, float]:
    """The learner's mean time per update by part, in ms, over the whole run."""
    upd = max(res["updates"], 1)
    out = {k: 1e3 * v / upd for k, v in res["timings"].items()}
    out["other"] = max(0.0, 1e3 * res["updating_seconds"] / upd - sum(out.values())) if res["updating_seconds"] else 0
    return out


def summary_lines(res: dict) -> list[str]:
    cfg = res["config"]
    ex = res["explorers"]
    added = sum(e["added"] for e in ex)
    steps = sum(e["steps"] for e in ex)
    ls, us = res["learn_seconds"], res["updating_seconds"] or 1e-9
    add_calls = max(sum(e["add_calls"] for e in ex), 1)
    lines = ["", f"summary ({res['label']})", f"  outcome               {res['reason']}"]
    s = res["solved_at"]
    if s:
        lines.append(f"  criterion met at      {s['wall_s']:.1f} s from the explorers' start, {s['env_steps']} env "
                     f"steps, {s['updates']} updates")
    evs = res["evaluations"]
    lines.append(f"  evaluations           {len(evs)} (mean greedy return of {cfg['eval_episodes']} episodes; "
                 f"threshold {cfg['threshold']:.0f}): " + " ".join(f"{e['mean_return']:.0f}" for e in evs[-24:]))
    lines += [
        f"  explorers             {len(ex)}, epsilon " + " / ".join(f"{e['eps']:.4f}" for e in ex),
        f"  env steps             {steps}  ({sum(e['episodes'] for e in ex)} episodes; "
        f"{len(res['episodes'])} episode records streamed to the learner)",
        f"  transitions added     {added}  ({cfg['nstep']}-step, with Ape-X initial priorities; stored "
        f"{res['stored']})",
        f"  samples drawn         {res['samples']}  ({res['updates']} batches of {cfg['batch_size']})",
        f"  replay ratio          {res['samples'] / max(res['inserts'], 1):.2f} samples per insert over the run "
        f"(target {cfg['replay_ratio']:g}, tolerance {cfg['tolerance']} samples)",
        f"  weights               {res['weight_publications']} publications; explorers took "
        f"{sum(e['weight_pulls'] for e in ex)}, retried {sum(e['weight_retries'] for e in ex)} reads",
    ]
    if res["nonfinite_batches"]:
        lines.append(f"  non-finite batches    {len(res['nonfinite_batches'])} skipped, first: "
                     f"{res['nonfinite_batches'][0]}")
    if res.get("replay_files"):
        where = (f"{res['replay_in_registry']} of them segments in syncmgr's registry"
                 if res["setup"] == "syncmgr" else "not in any registry")
        lines.append(f"  replay memory         {res['replay_files']} files in /dev/shm, "
                     f"{res['replay_bytes'] / 2**20:.1f} MiB; {where}")
    ms = _ms(res)
    lines += [
        f"  throughput            {added / ls:8.0f} transitions added/s, {res['samples'] / us:8.0f} samples/s, "
        f"{res['updates'] / us:6.0f} updates/s",
        f"  add                   {1e3 * sum(e['add_seconds'] for e in ex) / add_calls:6.2f} ms per add "
        f"({add_calls} calls)",
        "  learner, per update   " + ", ".join(f"{k} {v:.2f} ms" for k, v in ms.items()),
        f"  wall time             {res['wall_seconds']:.1f} s  (workers up {res['startup_seconds']:.1f} s after "
        f"the start, learning {ls:.1f} s)",
    ]
    if res["left_behind"]:
        lines.append(f"  left behind           {len(res['left_behind'])}: {' '.join(res['left_behind'][:20])}")
    else:
        lines.append("  left behind           nothing (/dev/shm, temp dirs)")
    if res["shm_pending_atexit"]:
        lines.append(f"  /dev/shm              {len(res['shm_pending_atexit'])} cpprb SharedMemory files still there; "
                     "cpprb unlinks them from an atexit hook when this process exits (a killed learner leaks them)")
    return lines


# --- the JSON summary --------------------------------------------------------------------------------


def summary_json(res: dict, plot: str, weights: str) -> dict:
    cfg = res["config"]
    ex = res["explorers"]
    us = res["updating_seconds"] or 1e-9
    return {
        "env": cfg["env"], "threshold": cfg["threshold"], "solved": res["solved"], "reason": res["reason"],
        "rule": f"mean greedy return over >= {cfg['eval_episodes']} episodes >= threshold at "
                f"{cfg['solve_streak']} evaluations in a row",
        "plot": plot, "weights": weights, "left_behind": res["left_behind"],
        "setup": res["setup"], "label": res["label"], "seed": cfg["seed"], "explorers": len(ex),
        "cpus": cfg["num_cpus"], "config": cfg,
        "solved_at": _eval_row(res["solved_at"]) if res["solved_at"] else None,
        "evaluations": [_eval_row(e) for e in res["evaluations"]],
        "final_return": res["mean_return_final"],
        "env_steps": sum(e["steps"] for e in ex), "updates": res["updates"], "samples": res["samples"],
        "inserts": res["inserts"], "nonfinite_batches": res["nonfinite_batches"],
        "throughput": {"added_per_s": sum(e["added"] for e in ex) / res["learn_seconds"],
                       "samples_per_s": res["samples"] / us, "updates_per_s": res["updates"] / us},
        "learner_ms_per_update": _ms(res),
        "manager_stop_seconds": res["manager_stop_seconds"],
        "wall_seconds": res["wall_seconds"], "startup_seconds": res["startup_seconds"],
        "learn_seconds": res["learn_seconds"],
        "explorer_figures": ex, "evaluator": res["evaluator"],
        "shm_pending_atexit": res["shm_pending_atexit"], "shm_foreign": res["shm_foreign"],
        "series": res["series"],
        "episodes": [{k: e[k] for k in ("rank", "return", "length", "wall_s")} for e in res["episodes"]],
    }


def _eval_row(e: dict) -> dict:
    return {"wall_s": e["wall_s"], "env_steps": e["env_steps"], "updates": e["updates"],
            "mean_return": e["mean_return"], "min_return": e["min_return"], "episodes": e["episodes"],
            "seeds": e["seeds"], "version": e["version"]}


def write_json(data: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


# --- the plot ------------------------------------------------------------------------------------------


def plot(summary: dict, path: str, random_return: float) -> None:
    """Return against wall-clock and env steps, throughput, replay ratio, the learner's time per update."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    (a_t, a_s, a_x), (a_r, a_b, a_n) = axes
    evs, eps, series = summary["evaluations"], summary["episodes"], summary["series"]
    thr = summary["threshold"]
    for ax, key, label in ((a_t, "wall_s", "seconds since the explorers started"),
                           (a_s, "env_steps", "env steps")):
        if key == "wall_s" and eps:
            ax.scatter([e["wall_s"] for e in eps], [e["return"] for e in eps], s=3, c="0.7",
                       label="explorers' episodes (epsilon-greedy)")
        ax.plot([e[key] for e in evs], [e["mean_return"] for e in evs], marker="o", ms=3,
                label=f"greedy evaluation (mean of {evs[0]['episodes'] if evs else '-'})")
        ax.axhline(thr, color="g", ls="--", lw=1, label=f"threshold {thr:.0f}")
        ax.axhline(random_return, color="grey", ls=":", lw=1, label="random policy")
        if summary["solved_at"]:
            ax.axvline(summary["solved_at"][key], color="g", lw=0.8)
        ax.set_xlabel(label)
        ax.set_ylabel("return")
        ax.legend(loc="lower right", fontsize=7)
    a_t.set_title(f"{summary['env']}, setup {summary['setup']}, seed {summary['seed']}", fontsize=9)
    a_s.set_title("return against env steps", fontsize=9)
    t = [p["t"] for p in series]
    a_x.plot(t, [p["inserted_per_s"] for p in series], label="transitions inserted/s")
    a_x.plot(t, [p["sampled_per_s"] for p in series], label="transitions sampled/s")
    a_x.set_xlabel("seconds since the explorers started")
    a_x.set_ylabel("per second")
    a_x.set_xlim(left=0)
    a_x.legend(fontsize=7)
    a_x.set_title("throughput", fontsize=9)
    cfg = summary["config"]
    tw = [p["t"] for p in series if p["window_ratio"] is not None]
    a_r.plot(tw, [p["window_ratio"] for p in series if p["window_ratio"] is not None], lw=0.8,
             label="per 0.5 s window")
    a_r.plot([p["t"] for p in series if p["ratio"] is not None],
             [p["ratio"] for p in series if p["ratio"] is not None], lw=1.5, label="whole run so far")
    a_r.axhline(cfg["replay_ratio"], color="g", ls="--", lw=1, label=f"target {cfg['replay_ratio']:g}")
    a_r.set_xlabel("seconds since the explorers started")
    a_r.set_ylabel("samples per insert")
    a_r.set_xlim(left=0)
    a_r.set_ylim(0, 3 * cfg["replay_ratio"])
    a_r.legend(fontsize=7)
    a_r.set_title(f"replay ratio (limiter tolerance {cfg['tolerance']} samples)", fontsize=9)
    timed = [p for p in series if "ms_per_update" in p]
    groups = np.array_split(np.arange(len(timed)), min(len(timed), 30)) if timed else []
    parts = ["sample", "update_priorities", "gradient", "limiter_wait", "explore", "other"]
    xs, bottoms = [], None
    stacks: dict[str, list[float]] = {k: [] for k in parts}
    for g in groups:
        xs.append(float(np.mean([timed[i]["t"] for i in g])))
        for k in parts:
            stacks[k].append(float(np.mean([timed[i]["ms_per_update"].get(k, 0.0) for i in g])))
    width = (xs[-1] - xs[0]) / max(len(xs) - 1, 1) * 0.8 if len(xs) > 1 else 1.0
    bottoms = np.zeros(len(xs))
    for k in parts:
        if any(stacks[k]):
            a_b.bar(xs, stacks[k], width=width, bottom=bottoms, label=k.replace("_", " "))
            bottoms += np.array(stacks[k])
    a_b.set_xlabel("seconds since the explorers started")
    a_b.set_ylabel("ms per learner update")
    a_b.legend(fontsize=7)
    a_b.set_title("the learner's time per update", fontsize=9)
    a_n.axis("off")
    s = summary["solved_at"]
    tp = summary["throughput"]
    text = [f"solved: {summary['solved']}", *textwrap.wrap(summary["rule"], 48),
            f"at {s['wall_s']:.1f} s, {s['env_steps']} env steps, {s['updates']} updates" if s else "",
            f"explorers {summary['explorers']} on {summary['cpus']} CPUs",
            f"{tp['added_per_s']:.0f} inserted/s, {tp['samples_per_s']:.0f} sampled/s, "
            f"{tp['updates_per_s']:.0f} updates/s",
            f"workers up in {summary['startup_seconds']:.1f} s; wall {summary['wall_seconds']:.1f} s",
            f"left behind: {len(summary['left_behind'])}", "", *textwrap.wrap(summary["label"], 48)]
    a_n.text(0, 1, "\n".join(x for x in text if x), va="top", fontsize=8, family="monospace", wrap=True)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=60)
    plt.close(fig)


def load_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)

