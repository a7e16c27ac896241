"""Token files, the seeded batch sampler, fixed validation batches and sequential windows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from attnlab.data.bins import BatchSampler, fixed_batches, sequential_windows
from attnlab.data.token_files import read_tokens, write_tokens
from attnlab.errors import AttnlabError

TOKENS = np.arange(1000, dtype=np.uint16)  # each token is its own position


def draw(sampler: BatchSampler, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [sampler.next_batch() for _ in range(n)]


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize(
    ("vocab_size", "dtype"), [(65, "uint16"), (65536, "uint16"), (65537, "uint32")]
)
def test_write_read_round_trip_picks_smallest_dtype(tmp_path, vocab_size: int, dtype: str) -> None:
    ids = [0, 1, vocab_size - 1, 7]
    assert write_tokens(tmp_path / "t.bin", ids, vocab_size) == dtype
    assert (tmp_path / "t.bin").stat().st_size == len(ids) * np.dtype(dtype).itemsize
    assert read_tokens(tmp_path / "t.bin", dtype, vocab_size).tolist() == ids


def test_read_tokens_rejects_out_of_range_and_corrupt_files(tmp_path) -> None:
    path = tmp_path / "t.bin"
    write_tokens(path, [1, 2, 99], 100)
    with pytest.raises(AttnlabError, match=r"t\.bin: token id 99 >= vocab size 50"):
        read_tokens(path, "uint16", vocab_size=50)
    path.write_bytes(b"\x00\x01\x02")
    with pytest.raises(AttnlabError, match=r"t\.bin: 3 bytes"):
        read_tokens(path, "uint16")
    with pytest.raises(AttnlabError, match="not found"):
        read_tokens(tmp_path / "missing.bin", "uint16")
    with pytest.raises(AttnlabError, match="out"):
        write_tokens(path, [100], 100)


def test_batches_are_shifted_windows_of_the_data() -> None:
    x, y = BatchSampler(TOKENS, block_size=8, batch_size=4, seed=0).next_batch()
    assert x.shape == y.shape == (4, 8) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y, x + 1)
    assert torch.equal(x, x[:, :1] + torch.arange(8))  # contiguous windows


def test_same_seed_same_batches_regardless_of_global_rng() -> None:
    a = draw(BatchSampler(TOKENS, 16, 8, seed=3), 5)
    torch.manual_seed(12345)  # e.g. a different model initialisation
    torch.nn.Linear(4, 4)
    b = draw(BatchSampler(TOKENS, 16, 8, seed=3), 5)
    assert_same(a, b)
    c = draw(BatchSampler(TOKENS, 16, 8, seed=4), 5)
    assert not torch.equal(a[0][0], c[0][0])


def test_state_dict_resumes_the_identical_stream() -> None:
    reference = draw(BatchSampler(TOKENS, 16, 8, seed=1), 6)
    first = BatchSampler(TOKENS, 16, 8, seed=1)
    draw(first, 3)
    state = first.state_dict()
    resumed = BatchSampler(TOKENS, 16, 8, seed=999)  # seed is overridden by the state
    resumed.load_state_dict(state)
    assert resumed.batches_drawn == 3
    assert_same(draw(resumed, 3), reference[3:])
    with pytest.raises(AttnlabError, match="batch_size"):
        BatchSampler(TOKENS, 16, 4, seed=1).load_state_dict(state)


def test_ranks_together_see_the_global_batch() -> None:
    single = draw(BatchSampler(TOKENS, 16, 8, seed=2), 4)
    ranks = [draw(BatchSampler(TOKENS, 16, 8, seed=2, rank=r, world_size=2), 4) for r in (0, 1)]
    merged = [
        (torch.cat([r0[0], r1[0]]), torch.cat([r0[1], r1[1]]))
        for r0, r1 in zip(*ranks, strict=True)
    ]
    assert ranks[0][0][0].shape == (4, 16)
    assert_same(merged, single)


def test_sampler_rejects_bad_configuration() -> None:
    with pytest.raises(AttnlabError, match="too few"):
        BatchSampler(TOKENS[:16], 16, 2, seed=0)
    with pytest.raises(AttnlabError, match="divisible"):
        BatchSampler(TOKENS, 16, 3, seed=0, world_size=2)
    with pytest.raises(AttnlabError, match="rank"):
        BatchSampler(TOKENS, 16, 4, seed=0, rank=2, world_size=2)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 60), block=st.integers(1, 20), seed=st.integers(0, 2**32))
def test_sampler_windows_stay_in_range(n: int, block: int, seed: int) -> None:
    assume(n >= block + 1)
    tokens = np.arange(n, dtype=np.uint32)
    x, y = BatchSampler(tokens, block, 6, seed).next_batch()
    assert int(x.min()) >= 0 and int(y.max()) <= n - 1
    assert torch.equal(y, x + 1)  # tokens are their own positions: windows never wrap


def test_fixed_batches_are_reproducible() -> None:
    a = fixed_batches(TOKENS, 16, 4, n_batches=3, seed=7)
    assert len(a) == 3
    assert_same(a, fixed_batches(TOKENS, 16, 4, n_batches=3, seed=7))


@pytest.mark.parametrize(("n", "block", "batch"), [(2, 4, 3), (33, 8, 2), (41, 8, 5), (100, 7, 4)])
def test_sequential_windows_predict_every_token_exactly_once(
    n: int, block: int, batch: int
) -> None:
    tokens = np.arange(n, dtype=np.uint16)
    batches = list(sequential_windows(tokens, block, batch))
    targets = torch.cat([y.flatten() for _, y in batches])
    assert sorted(t for t in targets.tolist() if t != -1) == list(range(1, n))
    for x, y in batches:
        assert x.shape == y.shape and x.shape[1] == block and x.shape[0] <= batch
        real = y != -1
        assert torch.equal(y[real], x[real] + 1)  # each target follows its input


def test_sequential_windows_needs_two_tokens() -> None:
    with pytest.raises(AttnlabError, match="nothing to predict"):
        sequential_windows(np.zeros(1, dtype=np.uint16), 4, 2)
