"""`pypto_lab.data`: NPUDataLoader yields torch's batches, its profile is sane and its advice follows
the starvation rule, bad arguments are refused with the rule, value and fix, and the two shipped
training sets load. No timing thresholds: only relations and behaviour."""

from dataclasses import replace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pypto_lab.hw.chip import get_chip
from pypto_lab.train.data import NPUDataLoader, host_memcpy_gbps, image_folder, text_dataset, text_set


def _same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    else:
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)


def _toy(n=37):
    return TensorDataset(torch.arange(n * 6, dtype=torch.float32).reshape(n, 6), torch.arange(n) % 3)


@pytest.mark.parametrize("drop_last", [False, True])
def test_yields_torch_batches(drop_last):
    ds = _toy()
    ours = list(NPUDataLoader(ds, batch_size=5, drop_last=drop_last))
    theirs = list(DataLoader(ds, batch_size=5, drop_last=drop_last))
    assert len(ours) == len(theirs) == len(NPUDataLoader(ds, batch_size=5, drop_last=drop_last))
    for a, b in zip(ours, theirs, strict=True):
        _same(a, b)


def test_yields_torch_batches_with_workers_and_prefetch():
    ds = text_set(seq_len=16)
    loader = NPUDataLoader(ds, batch_size=32, num_workers=2, prefetch_factor=3)
    assert loader.loader.prefetch_factor == 3 and loader.prefetch == 3
    for a, b in zip(loader, DataLoader(ds, batch_size=32), strict=True):
        _same(a, b)
    assert len(loader.wait_ms) == len(loader)


def test_seeded_shuffle_is_reproducible_and_a_permutation():
    ds = _toy()
    first = torch.cat([x for x, _ in NPUDataLoader(ds, batch_size=4, shuffle=True, seed=3)])
    again = torch.cat([x for x, _ in NPUDataLoader(ds, batch_size=4, shuffle=True, seed=3)])
    assert torch.equal(first, again)
    assert torch.equal(first[first[:, 0].argsort()], ds.tensors[0])


def test_profile_fields_are_sane():
    ds = image_folder(size=32)
    loader = NPUDataLoader(ds, batch_size=8)
    prof = loader.profile(batches=4)
    assert prof.batches == 4 and len(prof.wait_ms) == 4
    assert all(w > 0 for w in prof.wait_ms)
    assert 0 < prof.wait_ms_median <= prof.wait_ms_p90 <= max(prof.wait_ms)
    assert prof.bytes_per_batch == 8 * 3 * 32 * 32 * 4 + 8 * 8  # float images + int64 labels
    assert 0 < prof.h2d_ms_pinned < prof.h2d_ms_pageable
    assert prof.h2d_ms == prof.h2d_ms_pageable and not prof.pinned
    assert prof.workers == 0 and prof.prefetch == 0
    assert prof.samples_per_s > 0
    assert prof.host_link_gbps == get_chip("Ascend910B1").host_link_gbps
    assert prof.host_memcpy_gbps == host_memcpy_gbps() > 0


def test_pinned_copy_is_cheaper_than_pageable_for_the_same_batch():
    ds = image_folder(size=32)
    pinned = NPUDataLoader(ds, batch_size=8, pin_memory=True).profile(batches=2)
    pageable = NPUDataLoader(ds, batch_size=8, pin_memory=False).profile(batches=2)
    assert pinned.pinned and not pageable.pinned
    assert pinned.bytes_per_batch == pageable.bytes_per_batch
    assert pinned.h2d_ms < pageable.h2d_ms
    # the copy cost follows the link: a larger batch costs more
    bigger = NPUDataLoader(ds, batch_size=16, pin_memory=True).profile(batches=1)
    assert bigger.h2d_ms > pinned.h2d_ms


def test_starves_and_advice():
    prof = NPUDataLoader(text_set(), batch_size=16).profile(batches=3)
    assert prof.starves(1e-6)
    assert not prof.starves(1e9)
    starving = prof.advice(1e-6)
    assert starving.startswith("low NPU utilisation: data not ready")
    assert "num_workers (now 0)" in starving and "pin_memory=True" in starving
    assert "NPU idle" in starving
    assert "the NPU is the bottleneck" in prof.advice(1e9)
    with pytest.raises(ValueError, match=r"step_ms must be > 0.*got 0"):
        prof.starves(0)


def test_overlap_uses_the_longer_of_wait_and_copy():
    prof = NPUDataLoader(_toy(), batch_size=4).profile(batches=2)
    overlapped = replace(prof, pinned=True, workers=2, prefetch=2)
    assert overlapped.overlapped and not prof.overlapped
    assert overlapped.feed_ms == max(overlapped.wait_ms_median, overlapped.h2d_ms)
    assert prof.feed_ms == prof.wait_ms_median + prof.h2d_ms
    assert "num_workers (now 2)" in overlapped.advice(1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, r"batch_size must be an integer >= 1; got 0: pass batch_size=1"),
        ({"num_workers": -1}, r"num_workers must be an integer >= 0; got -1: pass 0"),
        (
            {"prefetch_factor": 2},
            r"prefetch_factor needs worker processes.*num_workers=0: set num_workers >= 1",
        ),
        ({"num_workers": 1, "prefetch_factor": 0}, r"prefetch_factor must be an integer >= 1.*got 0: pass 2"),
        ({"chip": "Ascend999Z"}, r"chip must be a known chip preset; got 'Ascend999Z'.*known chips"),
    ],
)
def test_bad_input_names_rule_value_and_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NPUDataLoader(_toy(), **kwargs)


def test_chip_without_host_link_is_refused():
    chip = replace(get_chip("Ascend910B1"), name="NoLink", host_link_gbps=0.0)
    with pytest.raises(ValueError, match=r"chip 'NoLink' has no host link bandwidth.*add host_link_gbps"):
        NPUDataLoader(_toy(), chip=chip)


def test_profile_needs_a_batch():
    with pytest.raises(ValueError, match=r"batches must be an integer >= 1; got 0"):
        NPUDataLoader(_toy()).profile(batches=0)


def test_image_folder_loads():
    ds = image_folder(size=64)
    assert len(ds.classes) >= 2 and len(ds) > 0
    x, y = ds[0]
    assert x.shape == (3, 64, 64) and x.dtype == torch.float32 and 0 <= y < len(ds.classes)
    assert image_folder(size=224)[0][0].shape == (3, 224, 224)
    assert len(set(ds.targets)) == len(ds.classes)
    with pytest.raises(ValueError, match=r"size must be an integer in 1\.\.224.*got 300"):
        image_folder(size=300)


def test_text_set_loads():
    ds = text_set(seq_len=12)
    assert len(ds.classes) >= 2 and len(ds) >= 200
    ids, label = ds[0]
    assert ids.shape == (12,) and ids.dtype == torch.long and 0 <= label < len(ds.classes)
    assert int(ids.max()) < len(ds.vocab) and int(ids[0]) >= 2  # first token is a real word
    assert len(set(ds.targets)) == len(ds.classes)
    assert torch.equal(ds.encode("zzzz unseen"), torch.tensor([1, 1] + [0] * 10))
    assert len(text_dataset(tokenizer_max_len=8)[0][0]) == 8
    with pytest.raises(ValueError, match=r"seq_len must be an integer >= 1.*got 0"):
        text_set(seq_len=0)
