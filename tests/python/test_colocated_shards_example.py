"""examples/colocated_shards.py --local-nodes 2 --short: the co-located
replay shards layout on two simulated Ray nodes (ray.cluster_utils) runs
end to end: each shard's learner samples and updates priorities on its
node's buffer, explorers on the other node feed it over TCP+TLS, the
driver-node stop Event and weights Value serve both nodes, and nothing is
left behind."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")
pytest.importorskip("cpprb")
pytest.importorskip("gymnasium")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_example_runs_short_on_two_simulated_nodes(tmp_path):
    shm_before = set(glob.glob("/dev/shm/*"))
    out = subprocess.run([sys.executable, os.path.join(REPO, "examples", "colocated_shards.py"), "--local-nodes", "2",
                          "--short", "--json", str(tmp_path / "figures.json")],
                         capture_output=True, text=True, timeout=170)
    assert out.returncode == 0 and "colocated shards: OK" in out.stdout, (out.stdout[-2000:], out.stderr[-4000:])
    import json

    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["nodes"] == 2 and len(figures["shards"]) == 2
    assert all(s["updates"] >= 300 for s in figures["shards"])
    assert sum(s["ingested"] for s in figures["shards"]) > 0
    assert any(e["remote"] and e["sent"] > 0 for e in figures["explorers"])
    assert set(glob.glob("/dev/shm/*")) <= shm_before
