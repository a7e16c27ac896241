"""Padded batches: attention_mask and position_ids give each row the logits it has alone."""

from __future__ import annotations

import pytest
import torch
from test_export import ALL_MECHANISMS, CONFIGS, make_model

from attnlab.model.attention import padding_mask


def test_padding_mask_is_causal_without_padding_keys() -> None:
    mask = padding_mask(torch.tensor([[0, 1, 1], [1, 1, 1]]), 2)  # 1 cached position, 2 new
    assert mask.shape == (2, 1, 2, 3)
    assert mask[0, 0].tolist() == [[False, True, False], [False, True, True]]
    assert mask[1, 0].tolist() == [[True, True, False], [True, True, True]]
    # a padding query sees only itself (never an empty, NaN row)
    assert padding_mask(torch.tensor([[0, 1]]), 2)[0, 0].tolist() == [[True, False], [False, True]]


@pytest.mark.parametrize("name", [*sorted(CONFIGS), *ALL_MECHANISMS])
def test_left_padded_rows_match_unpadded(name: str) -> None:
    model = make_model(**{**CONFIGS, **ALL_MECHANISMS}[name])
    gen = torch.Generator().manual_seed(3)
    short, long = (
        torch.randint(1, 64, (1, 5), generator=gen),
        torch.randint(1, 64, (1, 9), generator=gen),
    )
    pad = 9 - 5
    ids = torch.cat([torch.cat([torch.zeros(1, pad, dtype=torch.long), short], 1), long])
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :pad] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        both = model(ids, all_logits=True, attention_mask=mask, position_ids=positions)[0]
        alone = [model(x, all_logits=True)[0] for x in (short, long)]
        torch.testing.assert_close(both[0, pad:], alone[0][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(both[1], alone[1][0], atol=1e-5, rtol=0)
        # the same through the KV cache: a padded prefill, then one token for both rows
        cache = model.new_cache()
        model(ids, cache=cache, attention_mask=mask, position_ids=positions)
        nxt = torch.tensor([[7], [7]])
        mask2 = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
        step = model(nxt, cache=cache, attention_mask=mask2, position_ids=positions[:, -1:] + 1)[0]
        ref = [model(torch.cat([x, nxt[:1]], 1))[0] for x in (short, long)]
    torch.testing.assert_close(step[:, -1], torch.cat(ref)[:, -1], atol=1e-5, rtol=0)
