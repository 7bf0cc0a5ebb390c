"""The learner's loop and a whole run: set up, launch, learn until solved or out of budget, clean up."""

from __future__ import annotations

import collections
import dataclasses
import os
import queue
import time
from typing import Any, Optional

import numpy as np

from .actors import ExplorerCore
from .config import Config
from .qnet import QNetwork, q_forward, save_policy
from .report import SHM_DIR, Progress, ShmWatch, mapped_shm
from .setups import make_setup
from .weights import WeightsBroadcast

TICK = 0.5  # seconds between two points of the time series


def drain(q: Any) -> list[Any]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def run(cfg: Config, *, progress: bool = True, npz_path: Optional[str] = None) -> dict:
    """One training run; returns its figures (see report.summary_json). Starts a local Ray
    cluster for the Ray setups unless one is up, and removes everything it made."""
    cfg = cfg.resolved()
    t_wall0 = time.monotonic()
    watch = ShmWatch()
    setup = make_setup(cfg)
    res: dict[str, Any] = {"setup": cfg.setup, "label": setup.label, "config": dataclasses.asdict(cfg)}
    registry: set[str] = set()
    limiter = stop = None
    try:
        spec = cfg.spec
        env_dict = {"obs": {"shape": spec.obs_dim, "dtype": np.float32}, "act": {"dtype": np.int64},
                    "rew": {"dtype": np.float32}, "next_obs": {"shape": spec.obs_dim, "dtype": np.float32},
                    "discount": {"dtype": np.float32}}
        before = mapped_shm()
        rb = setup.buffer(env_dict)
        replay = mapped_shm() - before
        registry = setup.registry()
        res["replay_files"] = len(replay)
        res["replay_bytes"] = sum(os.stat(os.path.join(SHM_DIR, n)).st_size for n in replay
                                  if os.path.exists(os.path.join(SHM_DIR, n)))
        res["replay_in_registry"] = len(replay & registry)
        limiter = setup.limiter()
        stop = setup.event()
        stats_q, evals_q = setup.queue(), setup.queue()
        rng = np.random.default_rng(cfg.seed)
        net = QNetwork([spec.obs_dim, cfg.hidden, cfg.hidden, spec.n_actions], rng, lr=cfg.lr,
                       grad_clip=cfg.grad_clip)
        shapes = [p.shape for p in net.params]
        weights = WeightsBroadcast(setup.segment(WeightsBroadcast.size_for(shapes)), setup.version_value(),
                                   shapes)
        weights.publish(net.params, 0, 0)  # the explorers act on weights from their first step
        t_up = setup.launch(rb, limiter, weights, stop, stats_q, evals_q)
        res["startup_seconds"] = time.monotonic() - t_wall0 - max(0.0, time.time() - t_up)
        learned = learn(cfg, setup, rb, limiter, weights, stop, stats_q, evals_q, net, t_up, watch, progress)
        res.update(learned)
        stop.set()
        limiter.stop()
        explorers, ev = setup.join(stats_q, timeout=120)
        inline = res.pop("inline_explorers")
        res["explorers"], res["evaluator"] = explorers or inline, ev
        res["stored"] = rb.get_stored_size()
        res["inserts"], res["samples_granted"] = limiter.counts()
        watch.poll()
        registry |= setup.registry()
        if npz_path:
            version = (res["solved_at"] or (res["evaluations"][-1] if res["evaluations"] else {})).get("version")
            params = learned["published"].get(version, net.params)
            save_policy(params, npz_path, env=cfg.env, version=version if version is not None else -1)
            res["weights"] = npz_path
        res.pop("published", None)
    finally:
        if stop is not None:
            stop.set()
        if limiter is not None:
            limiter.stop()
        setup.shutdown()
    res["manager_stop_seconds"] = getattr(setup, "manager_stop_seconds", None)
    res["wall_seconds"] = time.monotonic() - t_wall0
    # The daemon names every segment at random ("syncmgr-<random>-sm-<random>"): a new file is the
    # run's only if its registry listed it or one of its processes mapped or opened it, never by
    # its name's prefix (other daemons on the machine make files with the same prefix).
    left, foreign = watch.left(registry)
    res["shm_pending_atexit"] = [n for n in left if cfg.setup == "syncmanager" and n.startswith("psm_")]
    res["shm_left"] = [n for n in left if n not in res["shm_pending_atexit"]]
    res["shm_foreign"] = foreign
    res["temp_left"] = [p for p in setup.temp_paths if os.path.exists(p)]
    res["left_behind"] = [os.path.join(SHM_DIR, n) for n in res["shm_left"]] + res["temp_left"]
    return res


def learn(cfg: Config, setup: Any, rb: Any, limiter: Any, weights: WeightsBroadcast, stop: Any, stats_q: Any,
          evals_q: Any, net: QNetwork, t_up: float, watch: ShmWatch, progress: bool) -> dict:
    """Sample, train, write priorities back and publish weights; read the evaluator's verdicts and
    the explorers' episodes; stop when solved or out of budget."""
    target = net.copy_params()
    inline = [ExplorerCore(i, cfg) for i in range(cfg.explorers)] if setup.name == "single" else []
    for core in inline:
        core.params = net.copy_params()
    published: collections.OrderedDict[int, list[np.ndarray]] = collections.OrderedDict()
    published[weights.current()] = net.copy_params()
    updates = samples = 0
    tm = {"sample": 0.0, "update_priorities": 0.0, "gradient": 0.0, "limiter_wait": 0.0, "explore": 0.0}
    tm_last = dict(tm)
    episodes: list[dict] = []
    evaluations: list[dict] = []
    series: list[dict] = []
    solved_at: Optional[dict] = None
    streak, reason = 0, ""
    bar = Progress(cfg.threshold, enabled=progress)
    t0 = time.monotonic() - max(0.0, time.time() - t_up)  # the moment every worker was up
    last_tick = time.monotonic()
    last_ins = last_smp = last_upd = 0
    t_first: Optional[float] = None
    inline_added = 0
    nonfinite: list[dict] = []

    def tick(now: float, final: bool = False) -> None:
        nonlocal last_tick, last_ins, last_smp, last_upd, tm_last, streak, solved_at, reason
        ins, smp = limiter.peek()
        dt = max(now - last_tick, 1e-9)
        du = updates - last_upd
        keep = not final or dt >= TICK / 2  # a last sliver of a window says nothing about rates
        point = {"t": now - t0, "inserted_per_s": (ins - last_ins) / dt, "sampled_per_s": (smp - last_smp) / dt,
                 "updates_per_s": du / dt, "inserts": ins, "samples": smp,
                 "window_ratio": (smp - last_smp) / (ins - last_ins) if ins > last_ins else None,
                 "ratio": smp / ins if ins else None}
        if du:
            spent = {k: (tm[k] - tm_last[k]) / du for k in tm}
            span = now - max(last_tick, t_first if t_first is not None else last_tick)  # not the warm-up
            spent["other"] = max(0.0, span / du - sum(spent.values()))
            point["ms_per_update"] = {k: 1e3 * v for k, v in spent.items()}
        if keep:
            series.append(point)
        last_tick, last_ins, last_smp, last_upd, tm_last = now, ins, smp, updates, dict(tm)
        for ep in drain(stats_q) if not inline else []:
            ep["wall_s"] = ep.pop("t") - (time.time() - (time.monotonic() - t0))
            episodes.append(ep)
        for ev in drain(evals_q):
            if solved_at is not None:
                break  # an evaluation that came after the criterion was met (the job ends at the criterion)
            ev["wall_s"] = ev.pop("t") - (time.time() - (time.monotonic() - t0))
            evaluations.append(ev)
            streak = streak + 1 if ev["mean_return"] >= cfg.threshold else 0
            if streak >= cfg.solve_streak and solved_at is None:
                solved_at = ev
                reason = (f"solved: mean greedy return >= {cfg.threshold:.0f} over {ev['episodes']} episodes "
                          f"at {cfg.solve_streak} evaluations in a row")
        last = evaluations[-1]["mean_return"] if evaluations else None
        bar.update(max((e["mean_return"] for e in evaluations), default=0.0),
                   {"t": f"{now - t0:.0f}s", "env steps": str(ins), "updates": str(updates),
                    "last eval": f"{last:.0f}" if last is not None else "-", "streak": str(streak),
                    "updates/s": f"{updates / (now - t_first):.0f}" if t_first is not None and now > t_first
                    else "-"})

    try:
        while True:
            now = time.monotonic()
            if now - last_tick >= TICK:
                tick(now)
                if solved_at is not None:
                    break
                if now - watch.last_poll >= 5.0:
                    watch.poll()
                why = setup.failed()
                if why:
                    reason = why
                    break
            if now - t0 > cfg.max_seconds:
                reason = f"time budget ({cfg.max_seconds:.0f} s) reached"
                break
            if updates >= cfg.max_updates:
                reason = f"update budget ({cfg.max_updates}) reached"
                break
            if last_ins >= cfg.max_env_steps:
                reason = f"environment-step budget ({cfg.max_env_steps}) reached"
                break
            if inline:
                ins, smp = limiter.peek()
                if limiter.can_insert(ins, smp, cfg.chunk + cfg.nstep):
                    t = time.perf_counter()
                    core = inline[inline_added % len(inline)]
                    batch, finished = core.chunk()
                    for ep in finished:
                        ep["wall_s"] = time.monotonic() - t0
                        del ep["t"]
                        episodes.append(ep)
                    if batch is not None and limiter.insert(len(batch["act"]), timeout=0):
                        rb.add(**batch)
                        core.added += len(batch["act"])
                    inline_added += 1
                    tm["explore"] += time.perf_counter() - t
                    continue
            t = time.perf_counter()
            ok = limiter.sample(cfg.batch_size, timeout=0.2)
            tm["limiter_wait"] += time.perf_counter() - t
            if not ok:
                if limiter.is_stopped():
                    reason = "the limiter was stopped"
                    break
                continue
            if t_first is None:
                t_first = time.monotonic()
            beta = cfg.beta0 + (1.0 - cfg.beta0) * min(1.0, updates / cfg.beta_updates)
            t = time.perf_counter()
            s = rb.sample(cfg.batch_size, beta)
            t2 = time.perf_counter()
            act = s["act"].ravel().astype(np.int64)
            next_q_online = net(s["next_obs"])
            next_q_target = q_forward(target, s["next_obs"])
            best_next = next_q_target[np.arange(len(act)), np.argmax(next_q_online, axis=1)]
            y = s["rew"].ravel() + s["discount"].ravel() * best_next
            _, td, grads = net.loss_and_grads(s["obs"], act, y.astype(np.float32),
                                              s["weights"].ravel().astype(np.float32))
            if not np.isfinite(td).all() or not all(np.isfinite(g).all() for g in grads):
                # Never let one bad batch poison the network: skip it, say what was wrong, go on.
                bad = [k for k in ("obs", "rew", "next_obs", "discount", "weights") if not np.isfinite(s[k]).all()]
                nonfinite.append({"update": updates, "fields": bad or ["td"]})
                continue
            net.apply(grads)
            t3 = time.perf_counter()
            rb.update_priorities(s["indexes"], np.abs(td).astype(np.float64) + 1e-6)
            t4 = time.perf_counter()
            tm["sample"] += t2 - t
            tm["gradient"] += t3 - t2
            tm["update_priorities"] += t4 - t3
            updates += 1
            samples += len(act)
            if updates % cfg.target_every == 0:
                target = net.copy_params()
            if updates % cfg.publish_every == 0:
                version = weights.publish(net.params, updates, limiter.peek()[0])
                published[version] = net.copy_params()
                while len(published) > 1000:
                    published.popitem(last=False)
                for core in inline:
                    core.params = published[version]
    finally:
        bar.close()
        stop.set()
        limiter.stop()
    now = time.monotonic()
    tick(now, final=True)  # the last window, and any verdict that came meanwhile
    inline_figs = [{"rank": c.rank, "eps": c.eps, "steps": c.steps, "added": c.added, "episodes": c.episodes,
                    "weight_pulls": 0, "weight_retries": 0, "add_calls": 0, "add_seconds": 0.0,
                    "limiter_wait_seconds": 0.0} for c in inline]
    for c in inline:
        c.close()
    return {"reason": reason, "solved": solved_at is not None, "solved_at": solved_at,
            "evaluations": evaluations, "episodes": episodes, "series": series, "updates": updates,
            "samples": samples, "nonfinite_batches": nonfinite, "learn_seconds": max(now - t0, 1e-9),
            "updating_seconds": max(now - t_first, 1e-9) if t_first is not None else 0.0,
            "timings": tm, "published_versions": len(published), "published": published,
            "weight_publications": updates // cfg.publish_every, "inline_explorers": inline_figs,
            "mean_return_final": evaluations[-1]["mean_return"] if evaluations else None,
            "best_return": max((e["mean_return"] for e in evaluations), default=None)}
