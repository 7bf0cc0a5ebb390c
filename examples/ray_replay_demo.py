"""Ape-X DQN (distributed prioritized replay) on Ray, coordinated by syncmgr.

Explorer actors play the environment with Ape-X's epsilons, compute n-step
transitions and their initial priorities (their own TD errors) and add them to
one cpprb ``MPPrioritizedReplayBuffer`` whose memory is segments of an
embedded syncmgr daemon. The learner (this process) samples, trains a numpy
MLP (double DQN, Huber loss, Adam) and writes priorities back. A two-sided
rate limiter keeps samples per insert near its target; weights reach every
explorer and the evaluator through one shared-memory segment with a version
counter; episodes stream to the learner through a Queue. An evaluator actor
judges the published weights out of the learner's loop.

The run succeeds when the mean greedy return over 20 episodes (on seeds
derived from --seed) reaches the environment's own threshold (475 for
CartPole-v1, 200 for LunarLander-v3) at 3 evaluations in a row, within the
budget. The exit status is 0 only then, and only if the run left nothing
behind in /dev/shm or the temp directory.

    python examples/ray_replay_demo.py                      # learn CartPole-v1, summarise, plot
    python examples/ray_replay_demo.py --env LunarLander-v3 --max-seconds 900
    python examples/ray_replay_demo.py --setup syncmanager  # the same job on SyncManager
    python examples/ray_replay_demo.py --compare            # every setup over 5 seeds (see apex/compare.py)

It prints ``summary: PATH``, a JSON file with the evaluations, throughput and
the paths of the plot and of the final policy's weights (``.npz``, see
docs/ray.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import tempfile
from typing import Optional

# One BLAS thread per process: the learner's matrices are small, and on a machine whose cores
# the explorers and the evaluator already use, BLAS threads only contend (measured on 2 loaded
# cores: 17 ms per LunarLander gradient step with them). Set before numpy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from apex import compare, config, learner, report  # noqa: E402


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = config.Config()
    p.add_argument("--env", choices=sorted(config.ENVS), default=d.env)
    p.add_argument("--setup", choices=config.SETUPS, default=d.setup)
    for f in dataclasses.fields(config.Config):
        if f.name in ("env", "setup"):
            continue
        p.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(d, f.name)), default=getattr(d, f.name))
    p.add_argument("--out-dir", default=os.path.join(tempfile.gettempdir(), f"syncmgr-demo-{os.getuid()}"),
                   help="where the plot, the JSON summary and the weights go")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    compare.add_arguments(p)
    args = p.parse_args(argv)
    given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in (argv if argv is not None else sys.argv[1:])
             if a.startswith("--")}
    for name, value in config.ENVS[args.env].overrides:
        if name not in given:
            setattr(args, name, value)
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the run still stops its workers and removes what it made.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.compare:
        return compare.main(args)
    if args.env == "LunarLander-v3":
        try:
            import Box2D  # noqa: F401
        except ImportError:
            print("LunarLander-v3 needs gymnasium's box2d extra: "
                  f"{sys.executable} -m pip install 'gymnasium[box2d]'", file=sys.stderr)
            return 2
    cfg = config.Config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config.Config)}).resolved()
    auto = " (from the machine's CPUs)" if not args.explorers else ""
    print(f"Ape-X DQN on {cfg.env}, setup {cfg.setup}, seed {cfg.seed}: {cfg.explorers} explorers{auto} on "
          f"{cfg.num_cpus} CPUs, rate limiter {cfg.replay_ratio:g} samples per insert +- {cfg.tolerance} samples; "
          f"criterion: mean greedy return over {cfg.eval_episodes} episodes >= {cfg.threshold:.0f} at "
          f"{cfg.solve_streak} evaluations in a row, within {cfg.max_seconds:.0f} s", flush=True)
    stem = os.path.join(args.out_dir, f"apex-{cfg.env}-{cfg.setup}-seed{cfg.seed}")
    os.makedirs(args.out_dir, exist_ok=True)
    res = learner.run(cfg, progress=not args.quiet, npz_path=stem + ".npz")
    for line in report.summary_lines(res):
        print(line)
    summary = report.summary_json(res, stem + ".png", stem + ".npz")
    report.plot(summary, stem + ".png", cfg.spec.random_return)
    report.write_json(summary, stem + ".json")
    print(f"  plot                  {stem}.png")
    print(f"  weights               {stem}.npz")
    print(f"summary: {stem}.json", flush=True)
    if not res["solved"]:
        print(f"demo FAILED: the criterion was not met ({res['reason']})", file=sys.stderr)
        return 1
    if res["left_behind"]:
        print(f"demo FAILED: {len(res['left_behind'])} things left behind", file=sys.stderr)
        return 1
    print("demo finished OK: solved by the environment's own rule, nothing left behind")
    return 0


if __name__ == "__main__":
    sys.exit(main())
