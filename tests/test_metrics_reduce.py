"""Metrics combine over processes by kind: log-weight min/max as min/max, everything else averaged."""

import torch

from dllm_ais import metrics as M


def _two_ranks(rows):
    """A `reduce` for reduce_row that combines the given per-rank rows (rank 0's values are the call's input)."""
    def reduce(values, kind):
        keys = sorted(k for k in rows[0] if k != M.STEP and M.reduction(k) == kind)
        assert values == [rows[0][k] for k in keys]
        stacked = torch.tensor([[r[k] for k in keys] for r in rows], dtype=torch.float64)  # [ranks, keys]
        return {"mean": stacked.mean(0), "min": stacked.amin(0), "max": stacked.amax(0)}[kind].tolist()
    return reduce


def test_min_max_metrics_reduce_as_min_max_and_the_rest_as_mean():
    rank0 = {M.STEP: 3, M.AIS_LOG_W_MIN: -0.5, M.AIS_LOG_W_MAX: 0.25, M.LOSS_POLICY: 1.0, "ais/log_w_mean": 0.0}
    rank1 = {M.STEP: 3, M.AIS_LOG_W_MIN: -0.125, M.AIS_LOG_W_MAX: 2.0, M.LOSS_POLICY: 3.0, "ais/log_w_mean": 1.0}
    out = M.reduce_row(rank0, _two_ranks([rank0, rank1]))
    assert out == {M.STEP: 3, M.AIS_LOG_W_MIN: -0.5, M.AIS_LOG_W_MAX: 2.0, M.LOSS_POLICY: 2.0, "ais/log_w_mean": 0.5}
    assert list(out) == list(rank0), "the row keeps its key order"
    assert M.reduction(M.AIS_LOG_W_MIN) == "min" and M.reduction(M.AIS_LOG_W_MAX) == "max"
    assert M.reduction(M.AIS_LAMBDA) == "mean"
