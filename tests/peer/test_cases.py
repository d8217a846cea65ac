"""The peer suite collects, its cases build and run, and the stock baseline is current."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from cases import PeerCase, collect_cases  # noqa: E402

BASELINE = Path(__file__).parent / "stock_baseline.json"


@pytest.fixture(scope="module")
def all_cases() -> list[PeerCase]:
    return collect_cases()


def test_collects_enough_unique_cases(all_cases: list[PeerCase]) -> None:
    runnable = [c for c in all_cases if c.skip is None]
    assert len(runnable) >= 400
    assert len({c.file for c in runnable}) >= 120
    ids = [c.id for c in all_cases]
    assert len(ids) == len(set(ids))
    # Nothing is dropped silently: every skipped entry says why.
    assert all(c.skip for c in all_cases if c.skip is not None)


def test_sample_builds_and_runs_eagerly(all_cases: list[PeerCase]) -> None:
    # Cases Arm itself expects to fail, or with float8 inputs (no CPU kernels for
    # eager float8 ops), are in the suite but cannot be checked by running eagerly.
    eligible = [
        c for c in all_cases
        if c.skip is None and c.arm_xfail is None and not any("float8" in d for d in c.input_dtypes)
    ]
    for case in random.Random(0).sample(eligible, 5):
        m, x = case.build()
        assert isinstance(m, torch.nn.Module) and not m.training, case.id
        assert isinstance(x, tuple), case.id
        with torch.no_grad():
            m(*x)
        # Rebuilding gives the same inputs (the seeding works).
        _, x2 = case.build()
        for a, b in zip(x, x2):
            if isinstance(a, torch.Tensor):
                torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=case.id)


def test_baseline_covers_every_case(all_cases: list[PeerCase]) -> None:
    assert BASELINE.exists(), "run benchmarks/peer_baseline.py"
    recorded = json.loads(BASELINE.read_text())["cases"]
    missing = [c.id for c in all_cases if c.id not in recorded]
    assert not missing, f"{len(missing)} cases missing from the stock baseline (stale? rerun benchmarks/peer_baseline.py --resume): {missing[:5]}"
    for c in all_cases:
        entry = recorded[c.id]
        assert ("skipped" in entry) == (c.skip is not None), c.id
