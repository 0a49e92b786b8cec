"""Whole-sample shares for parts of different speeds (issue 33, J3): placer's
rule rounds so that the slowest part is fastest, never by largest
remainders alone.  Hand cases, the invariants, and the rule against brute
force over every rounding of small batches."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celeritas_cli.errors import InvalidInput
from celeritas_cli.transform.batch import balance_samples, whole_samples


def compositions(batch: int, parts: int):
    """Every split of *batch* into *parts* whole shares of at least one sample."""
    for cuts in itertools.combinations(range(1, batch), parts - 1):
        bounds = (0, *cuts, batch)
        yield [bounds[i + 1] - bounds[i] for i in range(parts)]


def slowest(samples, time_of):
    return max(time_of(i, b) for i, b in enumerate(samples))


def test_largest_remainders_no_longer_overload_the_slow_part():
    # speeds 1, 1, 2.6 on 7 samples: proportional 1.52, 1.52, 3.96; largest remainders 2, 1, 4 take
    # 2 s on the first part, 1, 1, 5 take at most 5 / 2.6 = 1.92 s
    assert whole_samples(7, 3, [1.0, 1.0, 2.6]) == [1, 1, 5]
    # equal speeds and exact proportions are untouched
    assert whole_samples(10, 4) == [3, 3, 2, 2] == whole_samples(10, 4, [1.0] * 4)
    assert whole_samples(8, 2, [1.0, 3.0]) == [2, 6]


def test_the_nmt_rounding_by_hand():
    """The zoo's nmt on moirai-intra-server (J3) in miniature: two fast and two
    slow devices (0.68293 x), a batch of 512, proportional shares 152.12 /
    103.88, and a fixed 0.01 s per step (the launches and parameter reads
    a replica pays whatever its share).  Largest remainders give 152, 152,
    104, 104: the slow replicas take (104/512 + 0.01) / 0.68293 = 0.31207 s.
    153, 153, 103, 103: 153/512 + 0.01 = 0.30883 s and 0.30921 s; 154, 154,
    102, 102: 0.31078 s.  So 153/103."""
    speed = [1.0, 1.0, 0.68293, 0.68293]
    assert [round(512 * s / sum(speed), 2) for s in speed] == [152.12, 152.12, 103.88, 103.88]
    start = whole_samples(512, 4, speed)
    assert start == [152, 152, 104, 104]  # no fixed time: 104 / 512 / 0.68293 = 0.29743 < 153 / 512 = 0.29883

    def time_of(i, b):
        return (b / 512 + 0.01) / speed[i]

    assert slowest(start, time_of) == pytest.approx(0.31207, abs=1e-5)
    best = balance_samples(start, time_of)
    assert best == [153, 153, 103, 103]
    assert slowest(best, time_of) == pytest.approx(0.30921, abs=1e-5)
    assert slowest([154, 154, 102, 102], time_of) == pytest.approx(0.31078, abs=1e-5)


def test_every_share_keeps_a_sample():
    # one part 100 times as fast: it cannot take every sample
    assert whole_samples(4, 4, [100.0, 1.0, 1.0, 1.0]) == [1, 1, 1, 1]
    assert whole_samples(5, 3, [100.0, 1.0, 1.0]) == [3, 1, 1]
    assert balance_samples([1, 3], lambda i, b: 10.0 * b if i == 0 else b) == [1, 3]
    with pytest.raises(InvalidInput, match="cannot be split 4 ways"):
        whole_samples(3, 4, [1.0] * 4)


@settings(max_examples=150, deadline=None)
@given(batch=st.integers(1, 14), speeds=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=4),
       fixed=st.lists(st.floats(0.0, 3.0), min_size=4, max_size=4))
def test_the_rule_is_the_best_rounding_by_brute_force(batch, speeds, fixed):
    """Sum = batch, every share >= 1, and no rounding has a faster slowest
    part: for shares of speeds alone (``whole_samples``) and for any fixed
    time per part on top (``balance_samples`` from them)."""
    parts = len(speeds)
    if batch < parts:
        return
    shares = whole_samples(batch, parts, speeds)
    assert sum(shares) == batch and min(shares) >= 1

    def plain(i, b):
        return b / speeds[i]

    def with_fixed(i, b):
        return fixed[i] + b / speeds[i]

    for time_of, got in ((plain, shares), (with_fixed, balance_samples(shares, with_fixed))):
        assert sum(got) == batch and min(got) >= 1
        best = min(slowest(c, time_of) for c in compositions(batch, parts))
        assert math.isclose(slowest(got, time_of), best, rel_tol=1e-12)


def test_a_move_never_puts_a_part_over_its_memory():
    # times 1 and 6 per sample: unconstrained [3, 1] (3 s); part 0 holds at most 2 samples, so [2, 2] (4 s),
    # and at most 1: nothing moves ([1, 3], 6 s) - the fit is kept, the speed given up
    time = lambda i, b: b * (1, 2)[i]  # noqa: E731
    assert balance_samples([1, 3], time) == [3, 1]
    assert balance_samples([1, 3], time, fits=lambda j, b: j != 0 or b <= 2) == [2, 2]
    assert balance_samples([1, 3], time, fits=lambda j, b: j != 0 or b <= 1) == [1, 3]
