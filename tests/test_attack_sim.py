"""Part I schedulers: ids that `step()` could not sort are refused at `add_request`, all of them."""
from __future__ import annotations

import decimal
import itertools

import numpy as np
import pytest

from inflight.sim.schedulers import ContinuousBatchScheduler, PriorityScheduler, StaticBatchScheduler


@pytest.mark.parametrize("cls", [ContinuousBatchScheduler, StaticBatchScheduler, PriorityScheduler])
def test_ids_that_only_some_other_ids_sort_with_are_refused(cls):
    """(1, 7) sorts with (3, 'y') but not with (1, 'x'): checked against one other id, it was
    accepted when that one was (3, 'y'), and then every step() raised TypeError while sorting."""
    for order in itertools.permutations([(3, "y"), (1, 7), (1, "x")]):
        s = cls(4)
        accepted = []
        for rid in order:
            try:
                s.add_request(rid, 2)
                accepted.append(rid)
            except TypeError as exc:
                assert "cannot be sorted with the other ids" in str(exc)
        assert len(accepted) == 2
        while s.has_unfinished():
            s.step()  # never raises


@pytest.mark.parametrize("nan", [np.float32("nan"), decimal.Decimal("NaN"), float("nan")])
def test_every_nan_id_is_refused(nan):
    """Only Python's float NaN was refused: numpy's float32 NaN sorted silently out of order and
    Decimal's raised decimal.InvalidOperation on the next id."""
    s = ContinuousBatchScheduler(2)
    with pytest.raises(ValueError, match="NaN cannot be sorted"):
        s.add_request(nan, 1)
    assert not s.has_unfinished()


def test_priorities_that_are_not_a_mapping_are_named():
    """was: TypeError: cannot convert dictionary update sequence element #0 to a sequence."""
    with pytest.raises(TypeError, match=r"priorities must be a mapping of request id -> priority, got list \(\[1, 2\]\)"):
        PriorityScheduler(2, priorities=[1, 2])
