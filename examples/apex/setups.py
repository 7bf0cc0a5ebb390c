"""The four ways the demo can run the same algorithm, for ``--setup`` and ``make demo-compare``.

* ``syncmgr``: Ray actors; an embedded syncmgr daemon holds every lock,
  Condition, Event, Value and Queue, the weights segment and (cpprb's default
  ``sharedctypes`` backend with ``ctx=`` the manager) all replay memory.
* ``syncmanager``: Ray actors on ``multiprocessing.SyncManager`` with cpprb's
  documented set-up: ``backend="SharedMemory"`` for the buffer and the authkey
  workaround for the proxies; the weights segment is a
  ``multiprocessing.shared_memory.SharedMemory``.
* ``mp``: no Ray, no manager: explorers and the evaluator are fork-started
  processes on ``multiprocessing``'s own primitives (what cannot cross into a
  Ray worker): the floor for cross-process coordination.
* ``single``: one process, cpprb's ``PrioritizedReplayBuffer``: the learner
  steps the explorers itself, no coordination at all (the evaluator is still
  a forked process, so evaluation stays out of the learner's time).
"""

from __future__ import annotations

import base64
import mmap
import multiprocessing as mp
import os
import secrets
import shutil
import tempfile
import time
from typing import Any, Optional

from . import actors
from .config import Config
from .limiter import LocalValue, RateLimiter

LABELS = {
    "syncmgr": "syncmgr (Ray actors; embedded daemon; cpprb default sharedctypes backend)",
    "syncmanager": "multiprocessing.SyncManager (Ray actors; cpprb SharedMemory backend, authkey workaround)",
    "mp": "plain multiprocessing (fork-started processes, no Ray)",
    "single": "one process (cpprb PrioritizedReplayBuffer, no coordination)",
}


class PosixSegment:
    """A POSIX shared-memory file in /dev/shm, made and unlinked by the learner, that pickles by
    name and maps again in the receiving process. (``multiprocessing.shared_memory`` would have
    every attaching Ray worker register it with its own resource tracker, which unlinks it when
    that worker exits, before Python 3.13.)"""

    def __init__(self, size: int = 0, name: Optional[str] = None) -> None:
        self.owner = name is None
        if name is None:
            name = f"apex-w-{os.getpid()}-{secrets.token_hex(4)}"
            fd = os.open(os.path.join("/dev/shm", name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(fd, size)
        else:
            fd = os.open(os.path.join("/dev/shm", name), os.O_RDWR)
        try:
            self.name, self.map = name, mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    @property
    def buf(self) -> memoryview:
        return memoryview(self.map)

    def __reduce__(self) -> tuple:
        return (PosixSegment, (0, self.name))

    def destroy(self) -> None:
        if self.owner:  # the mapping goes with the process; views of it may still be alive
            os.unlink(os.path.join("/dev/shm", self.name))
            self.owner = False


class RawSegment:
    """A ``RawArray`` of bytes, inherited by fork-started processes."""

    def __init__(self, ctx: Any, size: int) -> None:
        self.raw = ctx.RawArray("B", size)

    @property
    def buf(self) -> memoryview:
        return memoryview(self.raw).cast("B")

    def destroy(self) -> None:
        pass


class Setup:
    """Primitives, buffer and workers of one setup; ``shutdown()`` ends everything it started."""

    name = ""
    uses_ray = False

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.label = LABELS[self.name]
        self.authkey_b64: Optional[str] = None
        self.segments: list[Any] = []
        self.temp_paths: list[str] = []  # directories the run made that must be gone at the end
        self.rb_kwargs: dict[str, Any] = {}

    # primitives (overridden)
    def condition(self) -> Any: raise NotImplementedError
    def value(self) -> Any: raise NotImplementedError
    def event(self) -> Any: raise NotImplementedError
    def queue(self) -> Any: raise NotImplementedError
    def segment(self, size: int) -> Any: raise NotImplementedError

    def limiter(self) -> RateLimiter:
        cfg = self.cfg
        return RateLimiter(self.condition(), self.value(), self.value(), self.value(), self.value(),
                           samples_per_insert=cfg.replay_ratio, min_size=cfg.warmup, error_buffer=cfg.tolerance)

    def buffer(self, env_dict: dict) -> Any:
        from cpprb import MPPrioritizedReplayBuffer

        return MPPrioritizedReplayBuffer(self.cfg.buffer_size, env_dict, alpha=self.cfg.alpha, **self.rb_kwargs)

    def version_value(self) -> Any:
        return self.value()

    def registry(self) -> set[str]:
        """/dev/shm names the coordinator's registry holds (syncmgr only)."""
        return set()

    def launch(self, rb: Any, limiter: Any, weights: Any, stop: Any, stats_q: Any, evals_q: Any) -> float:
        """Start the explorers and the evaluator and wait until every one is up; returns that moment."""
        raise NotImplementedError

    def failed(self) -> Optional[str]:
        """Why a worker has ended before stop, or None."""
        return None

    def join(self, stats_q: Any, timeout: float) -> tuple[list[dict], dict]:
        """Wait for the workers after stop: (the explorers' figures, the evaluator's)."""
        raise NotImplementedError

    def shutdown(self) -> None:
        for s in self.segments:
            s.destroy()
        self.segments = []


class RaySetup(Setup):
    uses_ray = True

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.manager: Any = None
        self.own_ray = False
        self.futures: list[Any] = []
        self.eval_future: Any = None
        self.actors: list[Any] = []
        self.manager_stop_seconds: Optional[float] = None

    def start_ray(self, env: Optional[dict] = None) -> None:
        import ray

        import apex

        # Ship the package's code to the workers with the tasks (a cluster that was up before
        # this process knows nothing of examples/).
        ray.cloudpickle.register_pickle_by_value(apex)
        if not ray.is_initialized():
            # A temp dir of the run's own, removed at the end: Ray leaves its session
            # directories behind otherwise. Started after the manager, so Ray's processes
            # inherit SYNCMGR_ADDRESS and SYNCMGR_AUTHKEY_FILE (no runtime_env, which would cost
            # each actor a worker set-up of its own).
            tmp = tempfile.mkdtemp(prefix="apex-ray-")
            self.temp_paths.append(tmp)
            ray.init(num_cpus=self.cfg.num_cpus, include_dashboard=False, configure_logging=False,
                     log_to_driver=True, object_store_memory=100 << 20, _temp_dir=tmp)
            self.own_ray = True
        self.actor_opts: dict[str, Any] = {"num_cpus": min(1.0, self.cfg.num_cpus / (self.cfg.explorers + 2))}
        if env and not self.own_ray:
            self.actor_opts["runtime_env"] = env  # a cluster that was up before the manager: per actor

    def launch(self, rb: Any, limiter: Any, weights: Any, stop: Any, stats_q: Any, evals_q: Any) -> float:
        import dataclasses

        import ray

        cfg = dataclasses.asdict(self.cfg)
        ex_cls = ray.remote(actors.ExplorerActor).options(**self.actor_opts)
        ev_cls = ray.remote(actors.EvaluatorActor).options(**self.actor_opts)
        self.actors = [ex_cls.remote(i, cfg, self.authkey_b64) for i in range(self.cfg.explorers)]
        self.actors.append(ev_cls.remote(cfg, self.authkey_b64))
        ray.get([a.ready.remote() for a in self.actors], timeout=300)  # every worker is up and imported
        t_up = time.time()
        self.futures = [a.run.remote(rb, limiter, weights, stop, stats_q) for a in self.actors[:-1]]
        self.eval_future = self.actors[-1].run.remote(weights, stop, evals_q)
        return t_up

    def failed(self) -> Optional[str]:
        import ray

        done, _ = ray.wait([*self.futures, self.eval_future], timeout=0)
        if done:
            try:
                ray.get(done)
            except Exception as e:  # noqa: BLE001 - reported, and the run stops
                return f"a worker failed: {e}"
            return "a worker stopped early"
        return None

    def join(self, stats_q: Any, timeout: float) -> tuple[list[dict], dict]:
        import ray

        explorers = ray.get(self.futures, timeout=timeout)
        ev = ray.get(self.eval_future, timeout=timeout)
        return explorers, ev

    def shutdown(self) -> None:
        import ray

        # Ray first, so every worker's connections to the manager are closed before it stops:
        # the daemon then stops with no client left and removes every segment at once.
        try:
            for a in self.actors:
                ray.kill(a)
            self.actors = []
            super().shutdown()
            if self.own_ray:
                ray.shutdown()
        finally:
            try:
                if self.manager is not None:
                    t = time.monotonic()
                    self.manager.shutdown()
                    self.manager_stop_seconds = time.monotonic() - t
            finally:
                for p in self.temp_paths:
                    if self.own_ray and os.path.basename(p).startswith("apex-ray-"):
                        shutil.rmtree(p, ignore_errors=True)


class SyncmgrSetup(RaySetup):
    name = "syncmgr"

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        import syncmgr

        self.manager = syncmgr.Manager()
        self.manager.start()
        self.temp_paths.append(os.path.dirname(self.manager.address))  # the daemon's socket directory
        # cpprb's default backend ("sharedctypes") takes every array from ctx: the daemon's registry.
        self.rb_kwargs = {"ctx": self.manager}
        try:
            self.start_ray(self.manager.runtime_env())
        except BaseException:
            self.manager.shutdown()
            raise

    def condition(self) -> Any: return self.manager.Condition()
    def value(self) -> Any: return self.manager.Value("q", 0)
    def event(self) -> Any: return self.manager.Event()
    def queue(self) -> Any: return self.manager.Queue()

    def segment(self, size: int) -> Any:
        return self.manager.SharedMemory(create=True, size=size)  # the daemon removes it at shutdown

    def registry(self) -> set[str]:
        segs = self.manager._c().call("shm_list", {})["segments"]
        return {os.path.basename(s["path"]) for s in segs}


class SyncManagerSetup(RaySetup):
    name = "syncmanager"

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.manager = mp.get_context().Manager()
        # cpprb's documented Ray set-up: SyncManager for locks and events, the SharedMemory
        # backend for data (sharedctypes memory cannot be pickled into Ray workers), and the
        # authkey workaround for the proxies.
        self.authkey_b64 = base64.b64encode(bytes(mp.current_process().authkey)).decode()
        self.rb_kwargs = {"ctx": self.manager, "backend": "SharedMemory"}
        try:
            self.start_ray()
        except BaseException:
            self.manager.shutdown()
            raise

    def condition(self) -> Any: return self.manager.Condition()
    def value(self) -> Any: return self.manager.Value("q", 0)
    def event(self) -> Any: return self.manager.Event()
    def queue(self) -> Any: return self.manager.Queue()

    def segment(self, size: int) -> Any:
        s = PosixSegment(size)
        self.segments.append(s)
        return s


class ForkSetup(Setup):
    """Fork-started workers on multiprocessing's own primitives."""

    name = "mp"

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.ctx = mp.get_context("fork")
        self.rb_kwargs = {"ctx": self.ctx}
        self.procs: list[Any] = []
        self.done_q: Any = None

    def condition(self) -> Any: return self.ctx.Condition()
    def value(self) -> Any: return self.ctx.Value("q", 0, lock=False)
    def event(self) -> Any: return self.ctx.Event()
    def queue(self) -> Any: return self.ctx.Queue()

    def segment(self, size: int) -> Any:
        return RawSegment(self.ctx, size)

    def _start(self, target: Any, args: tuple) -> None:
        p = self.ctx.Process(target=_report, args=(self.done_q, target, args), daemon=True)
        p.start()
        self.procs.append(p)

    def launch(self, rb: Any, limiter: Any, weights: Any, stop: Any, stats_q: Any, evals_q: Any) -> float:
        self.done_q = self.ctx.Queue()
        for i in range(self.cfg.explorers):
            self._start(actors.explore, (i, self.cfg, rb, limiter, weights, stop, stats_q))
        self._start(actors.evaluate_loop, (self.cfg, weights, stop, evals_q))
        return time.time()  # forked: up as soon as started

    def failed(self) -> Optional[str]:
        for p in self.procs:
            if not p.is_alive():
                return f"a worker process exited early (exit code {p.exitcode})"
        return None

    def join(self, stats_q: Any, timeout: float) -> tuple[list[dict], dict]:
        results: list[dict] = []
        deadline = time.monotonic() + timeout
        while len(results) < len(self.procs) and time.monotonic() < deadline:
            try:
                results.append(self.done_q.get(timeout=0.2))
            except Exception:  # noqa: BLE001 - queue.Empty; keep draining the stats so no child blocks
                _drain(stats_q)
        _drain(stats_q)
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        errors = [r["error"] for r in results if "error" in r]
        if errors or len(results) < len(self.procs):
            raise RuntimeError("; ".join(errors) or "a worker process did not report")
        explorers = sorted((r["result"] for r in results if "rank" in r["result"]), key=lambda r: r["rank"])
        ev = next((r["result"] for r in results if "rank" not in r["result"]), {})
        return explorers, ev

    def shutdown(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        self.procs = []
        super().shutdown()


class SingleSetup(ForkSetup):
    """One process: the learner steps the explorers; only the evaluator is forked."""

    name = "single"

    def limiter(self) -> RateLimiter:
        cfg = self.cfg
        return RateLimiter.local(samples_per_insert=cfg.replay_ratio, min_size=cfg.warmup,
                                 error_buffer=cfg.tolerance)

    def value(self) -> Any:
        return LocalValue()

    def buffer(self, env_dict: dict) -> Any:
        from cpprb import PrioritizedReplayBuffer

        return PrioritizedReplayBuffer(self.cfg.buffer_size, env_dict, alpha=self.cfg.alpha)

    def version_value(self) -> Any:
        return self.ctx.Value("q", 0, lock=False)  # read by the forked evaluator

    def launch(self, rb: Any, limiter: Any, weights: Any, stop: Any, stats_q: Any, evals_q: Any) -> float:
        self.done_q = self.ctx.Queue()
        self._start(actors.evaluate_loop, (self.cfg, weights, stop, evals_q))
        return time.time()


def _report(done_q: Any, target: Any, args: tuple) -> None:
    try:
        done_q.put({"result": target(*args)})
    except BaseException as e:  # noqa: BLE001 - reported to the learner
        done_q.put({"error": f"{type(e).__name__}: {e}", "result": {}})
        raise


def _drain(q: Any) -> list[Any]:
    import queue

    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def make_setup(cfg: Config) -> Setup:
    cls = {"syncmgr": SyncmgrSetup, "syncmanager": SyncManagerSetup, "mp": ForkSetup,
           "single": SingleSetup}.get(cfg.setup)
    if cls is None:
        raise ValueError(f"unknown setup {cfg.setup!r}")
    return cls(cfg)
