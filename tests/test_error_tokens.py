"""The repeated-n-gram error-token detector (dllm_ais/rl/error_tokens.py)."""

import torch

from dllm_ais.rl.error_tokens import error_keep, repeated_ngram_fraction


def test_repeated_ngram_fraction_hand_computed():
    ids = torch.tensor([
        [1, 2, 3, 1, 2, 3, 1, 2],  # 3-grams 123 231 312 123 231 312: 3 of 6 repeat
        [1, 2, 3, 4, 5, 6, 7, 8],  # all distinct
        [7, 7, 7, 7, 7, 9, 9, 9],  # counted prefix 7 7 7 7: 3-grams 777 777 -> 1 of 2
        [5, 5, 5, 5, 5, 5, 5, 5],  # 3 counted tokens: one 3-gram, nothing to repeat
    ])
    mask = torch.ones(4, 8, dtype=torch.bool)
    mask[2, 4:] = False
    mask[3, 3:] = False
    torch.testing.assert_close(repeated_ngram_fraction(ids, mask, n=3), torch.tensor([0.5, 0.0, 0.5, 0.0]))
    # n = 1: row 0 has 8 unigrams of which 5 were seen before
    assert repeated_ngram_fraction(ids[:1], mask[:1], n=1).item() == 5 / 8


def test_error_keep():
    frac = torch.tensor([0.0, 0.3, 0.9])
    assert error_keep(frac, None).tolist() == [True, True, True]
    assert error_keep(frac, 0.3).tolist() == [True, True, False]
