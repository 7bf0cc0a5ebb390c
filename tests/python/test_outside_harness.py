"""The outside-suite harness judges outcomes as documented: an unlisted
failure, a listed difference that passes, and a stock pass that syncmgr
skips each fail the run; a fix from another branch only adds a note."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "outside"))

import expected  # noqa: E402
import run_outside  # noqa: E402


@pytest.fixture
def table(monkeypatch):
    t = {"s": {"C.test_diff": expected.Expected("on purpose", difference=True),
               "C.test_bug": expected.Expected("bug", fixed_on="py"),
               "C.test_spawn_only": expected.Expected("spawn", methods=("spawn",), difference=True)}}
    monkeypatch.setattr(run_outside, "EXPECTED", t)
    return t


def res(**outcomes):
    return {"tests": {f"C.{k}": {"outcome": v, "detail": "Traceback\nAssertionError: x"} for k, v in outcomes.items()}}


def no_retry(tid):
    return None


def test_listed_failures_pass_and_unlisted_fail(table):
    problems, _ = run_outside.judge("s", "fork", res(test_diff="failed", test_bug="error", test_ok="passed"),
                                    None, no_retry)
    assert problems == []
    problems, _ = run_outside.judge("s", "fork", res(test_diff="failed", test_bug="failed", test_new="failed"),
                                    None, no_retry)
    assert len(problems) == 1 and "C.test_new" in problems[0]
    # listed for spawn only: a failure under fork is a regression
    problems, _ = run_outside.judge("s", "fork", res(test_diff="failed", test_bug="failed",
                                                     test_spawn_only="failed"), None, no_retry)
    assert len(problems) == 1 and "C.test_spawn_only" in problems[0]


def test_passing_difference_fails_passing_bug_fix_notes(table):
    problems, notes = run_outside.judge("s", "fork", res(test_diff="passed", test_bug="passed"), None, no_retry)
    assert len(problems) == 1 and "C.test_diff" in problems[0]
    assert any("C.test_bug" in n and "py" in n for n in notes)


def test_stock_pass_skipped_by_syncmgr_fails(table):
    stock = res(test_a="passed", test_b="passed", test_diff="passed", test_bug="passed")
    mine = res(test_a="skipped", test_diff="failed", test_bug="failed")
    problems, _ = run_outside.judge("s", "fork", mine, stock, no_retry)
    assert sorted(p.split()[0] for p in problems) == ["C.test_a", "C.test_b"]


def test_retry_pass_is_a_note_retry_fail_a_problem(table):
    mine = res(test_diff="failed", test_bug="failed", test_flaky="failed")
    problems, notes = run_outside.judge("s", "fork", mine, None, lambda tid: {"outcome": "passed"})
    assert problems == [] and any("retried" in n for n in notes)
    assert mine["tests"]["C.test_flaky"]["outcome"] == "retried"
    problems, _ = run_outside.judge("s", "fork", res(test_diff="failed", test_bug="failed", test_flaky="failed"),
                                    None, lambda tid: {"outcome": "failed"})
    assert len(problems) == 1


def test_crash_fails(table):
    r = res(test_diff="failed", test_bug="failed")
    r["crash"] = "Traceback\nKeyboardInterrupt"
    problems, _ = run_outside.judge("s", "fork", r, None, no_retry)
    assert problems and "crashed" in problems[0]
