"""Ape-X DQN (distributed prioritized replay) coordinated by syncmgr.

The job ``examples/ray_replay_demo.py`` runs, split by concern:

* :mod:`apex.config`   -- every knob of a run, the environments, the solve rule;
* :mod:`apex.qnet`     -- the numpy Q-network, its gradient and Adam; the ``.npz`` policy format;
* :mod:`apex.limiter`  -- a two-sided samples-per-insert rate limiter (Reverb's ``SampleToInsertRatio``);
* :mod:`apex.weights`  -- the weights broadcast: one shared-memory segment and a version counter (a seqlock);
* :mod:`apex.actors`   -- the explorers (Ape-X epsilons, n-step returns, initial priorities) and the evaluator;
* :mod:`apex.setups`   -- the four ways to run it: syncmgr, SyncManager, plain multiprocessing, one process;
* :mod:`apex.learner`  -- the learner's loop and a whole run;
* :mod:`apex.report`   -- what a run left behind, the printed summary, the JSON summary and the plot;
* :mod:`apex.compare`  -- ``make demo-compare``: every setup over seeds, interleaved.
"""
