"""Shared test helpers: a distinct-rows forward (a speed-up of the Dream sampler tests), G-tests (the Dream and LLaDA
sampler-frequency tests) and the padded Dream canvas of the FP8 copy tests."""

from __future__ import annotations

import torch

DREAM_MASK = 4
"""The tiny Dream's mask token id."""


def padded_canvas() -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [3, 12], mask [3, 12]) of three left-padded tiny-Dream canvases (0, 2 and 5 pads), the last 5 positions
    masked: the input of the FP8 / FP4 Dream copy tests."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(5, 100, (3, 12), generator=g)
    x[:, 7:] = DREAM_MASK
    m = torch.ones(3, 12, dtype=torch.bool)
    m[1, :2] = False
    m[2, :5] = False
    return torch.where(m, x, 1), m


class UniqueRows(torch.nn.Module):
    """Test speed-up for uncached draws: forwards each distinct canvas row once (rows are independent), so 20,000
    draws from one prompt cost a forward per distinct partial canvas. Uncached forwards only."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None, positions=None, **kw):
        assert kw.get("kv_cache") is None, "UniqueRows serves uncached forwards only"
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
        both = torch.cat([input_ids, attention_mask.long()], 1)
        uniq, inverse = torch.unique(both, dim=0, return_inverse=True)
        T = input_ids.shape[1]
        out = self.model(uniq[:, :T], uniq[:, T:].bool(), positions=positions).logits
        return type("Out", (), {"logits": out[inverse]})()


def _p_value(G: float, df: int) -> float:
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(G / 2, dtype=torch.float64)))


def g_test(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, int, float]:
    """(G, df, p) of observed counts against expected counts [K] (bins expecting < 5 pooled)."""
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum()[None]]).double()
    exp = torch.cat([expected[~small], expected[small].sum()[None]]).double()
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    G = 2 * float(torch.where(obs > 0, obs * (obs / exp).log(), torch.zeros_like(obs)).sum())
    return G, obs.numel() - 1, _p_value(G, obs.numel() - 1)


def g_test_two_sample(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int, float]:
    """(G, df, p) of the homogeneity of two count vectors [K] (totals may differ: each bin's pooled count splits in
    proportion to the totals; bins whose smaller expectation is < 5 are pooled)."""
    na, nb = float(a.sum()), float(b.sum())
    pooled = (a + b).double()
    ea, eb = pooled * na / (na + nb), pooled * nb / (na + nb)
    small = torch.minimum(ea, eb) < 5
    fold = lambda x: torch.cat([x[~small], x[small].sum()[None]])  # noqa: E731
    a, b, ea, eb = fold(a.double()), fold(b.double()), fold(ea), fold(eb)
    keep = (ea + eb) > 0
    a, b, ea, eb = a[keep], b[keep], ea[keep], eb[keep]
    term = lambda o, e: torch.where(o > 0, o * (o / e).log(), torch.zeros_like(o)).sum()  # noqa: E731
    G = 2 * float(term(a, ea) + term(b, eb))
    return G, a.numel() - 1, _p_value(G, a.numel() - 1)


def completion_counts(completion: torch.Tensor) -> dict[str, int]:
    """{'t1 t2 …': count} of the rows of completion [N, L]."""
    out: dict[str, int] = {}
    for row in completion.tolist():
        key = " ".join(map(str, row))
        out[key] = out.get(key, 0) + 1
    return out
