"""wsitool.torchdata: PyTorch datasets over patch plans.

Every patch a dataset gives is compared with ``Slide.read_patches`` of the same
plan row.  DataLoaders run with 0, 1 and 2 workers under fork, spawn and
forkserver.  The plans are made without tissue detection (``mask=None``) on the
repository's own samples, so the tests need neither the shared slides nor a
mask.  Skipped with the reason where PyTorch is absent (the ``torch`` extra).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import wsitool
from wsitool.errors import InvalidRegionError, WsiError
from wsitool.patches.plan import PatchPlan, SlideIdentity, plan_patches

from helpers import REPO, REPO_SAMPLES

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed (pip install 'wsitool[torch]')")

JPEG = REPO_SAMPLES / "sample-aperio-jpeg.svs"
J2K = REPO_SAMPLES / "sample-aperio-j2k.svs"
SIZE = 64


def _plans():
    """Three plans of 64-pixel patches: the JPEG sample at its MPP 0.5 (level 0, 432
    patches) and at 1.3 (level 1 through the area filter, 54 patches), and a
    hand-made grid on level 1 of the JPEG 2000 sample (a second file)."""
    with wsitool.open_slide(JPEG) as s:
        a = plan_patches(s, mpp=0.5, size=SIZE, mask=None)
        b = plan_patches(s, mpp=1.3, size=SIZE, mask=None)
    with wsitool.open_slide(J2K) as s:
        w, h = s.level_dimensions[1]
        ds = s.level_downsamples[1]
        xs, ys = np.meshgrid(np.arange(0, w - SIZE, 80), np.arange(0, h - SIZE, 80))
        c = PatchPlan(SlideIdentity.of(s), {}, 1, SIZE, float(SIZE), 1.0,
                      np.round(xs.ravel() * ds).astype(np.int64), np.round(ys.ravel() * ds).astype(np.int64),
                      np.full(xs.size, np.nan, np.float32))
    return [a, b, c]


@pytest.fixture(scope="module")
def plans():
    return _plans()


@pytest.fixture(scope="module")
def reference(plans):
    """``(n, 64, 64, 3)``: every patch of the plans, by ``read_patches``, in dataset index order."""
    out = []
    for p in plans:
        with wsitool.open_slide(p.slide.path) as s:
            out.extend(s.read_patches(p.locations, **p.read_kwargs(), batch_size=50))
    return np.concatenate(out)


def _collect(loader):
    """All batches of a loader: ``(indices, patches (n, h, w, 3) numpy, per-batch index lists)``;
    the first batch's tensor in ``_collect.first``."""
    idx, pats, batches = [], [], []
    _collect.first = None
    for patches, coords in loader:
        if _collect.first is None:
            _collect.first = patches
        assert patches.dtype.is_floating_point is False
        idx.append(coords["index"].numpy())
        pats.append(patches.permute(0, 2, 3, 1).numpy())
        batches.append(tuple(coords["index"].tolist()))
    return np.concatenate(idx), np.concatenate(pats), batches


# ------------------------------------------------------------------ import boundaries


def test_importing_wsitool_does_not_import_torch():
    code = ("import sys, wsitool, wsitool.patches, wsitool.distributed; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=120).returncode == 0


def test_torchdata_without_torch_names_the_extra():
    code = "import sys; sys.modules['torch'] = None; import wsitool.torchdata"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "pip install 'wsitool[torch]'" in res.stderr


# ------------------------------------------------------------------ map-style


@needs_torch
def test_map_items_equal_read_patches(plans, reference):
    from wsitool.torchdata import PatchDataset

    ds = PatchDataset(plans)
    n = len(reference)
    assert len(ds) == n == sum(len(p) for p in plans)
    starts = np.cumsum([0] + [len(p) for p in plans])
    for i in (0, 7, 431, 432, 485, 486, n - 1, -1):
        patch, c = ds[i]
        j = i % n
        assert tuple(patch.shape) == (3, SIZE, SIZE) and str(patch.dtype) == "torch.uint8"
        np.testing.assert_array_equal(patch.permute(1, 2, 0).numpy(), reference[j])
        k = int(np.searchsorted(starts, j, side="right") - 1)
        assert c == {"index": j, "slide": k, "x": int(plans[k].x[j - starts[k]]),
                     "y": int(plans[k].y[j - starts[k]])}
    with pytest.raises(IndexError):
        ds[n]
    last = PatchDataset(plans, channels_last=True)[3][0]
    assert tuple(last.shape) == (3, SIZE, SIZE) and last.permute(1, 2, 0).is_contiguous()
    np.testing.assert_array_equal(last.permute(1, 2, 0).numpy(), reference[3])
    assert ds.paths == [str(p.slide.path) for p in plans]


@needs_torch
def test_getitems_reads_a_batch_in_the_samplers_order(plans, reference):
    import torch

    from wsitool.torchdata import PatchDataset, collate_patches

    ds = PatchDataset(plans, transform=lambda t: t.flip(0))
    idx = [500, 3, 431, 0, 440, 3, 486]
    patches, coords = collate_patches(ds.__getitems__(idx))
    assert tuple(patches.shape) == (len(idx), 3, SIZE, SIZE) and patches.is_contiguous()
    assert coords["index"].tolist() == idx
    np.testing.assert_array_equal(patches.flip(1).permute(0, 2, 3, 1).numpy(), reference[idx])
    last, _ = collate_patches(PatchDataset(plans, channels_last=True).__getitems__(idx))
    assert tuple(last.shape) == (len(idx), 3, SIZE, SIZE)
    assert last.is_contiguous(memory_format=torch.channels_last)
    np.testing.assert_array_equal(last.permute(0, 2, 3, 1).numpy(), reference[idx])


def test_collate_rejects_mixed_shapes():
    if not HAVE_TORCH:
        pytest.skip("PyTorch is not installed (pip install 'wsitool[torch]')")
    import torch

    from wsitool.torchdata import collate_patches

    c = {"index": 0, "slide": 0, "x": 0, "y": 0}
    with pytest.raises(ValueError, match="different shapes"):
        collate_patches([(torch.zeros(3, 4, 4), c), (torch.zeros(3, 5, 4), c)])
    with pytest.raises(ValueError, match="no samples"):
        collate_patches([])


@needs_torch
@pytest.mark.parametrize("workers,context", [(0, None), (1, "fork"), (2, "fork"), (2, "spawn")])
def test_map_dataloader_yields_exactly_the_plans_patches(plans, reference, workers, context):
    import torch
    from torch.utils.data import DataLoader

    from wsitool.torchdata import PatchDataset, collate_patches

    ds = PatchDataset(plans, max_open_slides=1)
    ds[0]  # slides opened in the parent before the workers fork: each worker must open its own
    loader = DataLoader(ds, batch_size=40, shuffle=True, num_workers=workers, collate_fn=collate_patches,
                        generator=torch.Generator().manual_seed(3),
                        multiprocessing_context=context)
    idx, pats, _ = _collect(loader)
    assert sorted(idx.tolist()) == list(range(len(reference)))
    assert idx.tolist() != list(range(len(reference)))   # the sampler's order, not the plan's
    np.testing.assert_array_equal(pats, reference[idx])


# ------------------------------------------------------------------ ordering


def test_epoch_order_and_rank_shards_partition_exactly():
    if not HAVE_TORCH:
        pytest.skip("PyTorch is not installed (pip install 'wsitool[torch]')")
    from wsitool.torchdata import epoch_order, rank_shard

    n = 1003
    srt = np.random.default_rng(0).permutation(n)
    assert epoch_order(srt, shuffle=False, seed=0, epoch=0, window=None).tolist() == srt.tolist()
    for window in (None, 64, 1, 2000):
        a = epoch_order(srt, shuffle=True, seed=5, epoch=2, window=window)
        assert np.array_equal(a, epoch_order(srt, shuffle=True, seed=5, epoch=2, window=window))
        assert not np.array_equal(a, epoch_order(srt, shuffle=True, seed=5, epoch=3, window=window))
        assert not np.array_equal(a, epoch_order(srt, shuffle=True, seed=6, epoch=2, window=window))
        assert sorted(a.tolist()) == list(range(n))
        for world in (1, 2, 3, 8):
            shards = [rank_shard(a, r, world) for r in range(world)]
            assert np.array_equal(np.concatenate(shards), a)
            assert max(map(len, shards)) - min(map(len, shards)) <= 1
            even = [rank_shard(a, r, world, drop_last=True) for r in range(world)]
            assert {len(s) for s in even} == {n // world}
            assert len(set(np.concatenate(even).tolist())) == n // world * world
    # a window shuffle keeps each window's patches together (neighbours on the slide)
    a = epoch_order(srt, shuffle=True, seed=1, epoch=0, window=100)
    pos = np.empty(n, np.int64)
    pos[srt] = np.arange(n)
    for k in range(10):
        assert len(set((pos[a[k * 100:(k + 1) * 100]] // 100).tolist())) == 1
    assert sorted(pos[a[1000:]].tolist()) == [1000, 1001, 1002]   # the short window stays last


@needs_torch
def test_iterable_order_is_reproducible_and_changes_with_the_epoch(plans, reference):
    from wsitool.torchdata import PatchIterableDataset

    def run(epoch, **kw):
        ds = PatchIterableDataset(plans, batch_size=32, seed=11, **kw)
        ds.set_epoch(epoch)
        idx, pats, batches = _collect(ds)
        np.testing.assert_array_equal(pats, reference[idx])
        assert len(batches) == len(ds)
        return idx, batches, ds

    a, batches, ds = run(4)
    assert sorted(a.tolist()) == list(range(len(reference)))
    assert np.array_equal(run(4)[0], a)
    assert not np.array_equal(run(5)[0], a)
    assert np.array_equal(a, ds.shard(4))
    assert all(len(b) == 32 for b in batches[:-1]) and len(batches[-1]) == len(reference) % 32
    plain = run(0, shuffle=False)[0]
    order = np.lexsort((np.concatenate([p.x for p in plans]), np.concatenate([p.y for p in plans]),
                        np.repeat(np.arange(3), [len(p) for p in plans])))
    assert plain.tolist() == order.tolist()
    full = run(4, shuffle_window=None)[0]
    assert sorted(full.tolist()) == list(range(len(reference))) and not np.array_equal(full, a)


@needs_torch
def test_ranks_partition_the_plans(plans):
    from wsitool.torchdata import PatchIterableDataset

    n = sum(len(p) for p in plans)
    for world in (2, 3):
        for epoch in (0, 1):
            got = []
            for rank in range(world):
                ds = PatchIterableDataset(plans, batch_size=16, seed=2, rank=rank, world_size=world)
                ds.set_epoch(epoch)
                idx = np.concatenate([c["index"].numpy() for _, c in ds])
                assert len(idx) in (n // world, n // world + 1)
                got.append(idx)
            assert sorted(np.concatenate(got).tolist()) == list(range(n))
        even = [PatchIterableDataset(plans, batch_size=16, rank=r, world_size=world, drop_last=True)
                for r in range(world)]
        counts = [[len(c["index"]) for _, c in ds] for ds in even]
        assert all(c == [16] * (n // world // 16) for c in counts) and all(len(ds) == len(c)
                                                                           for ds, c in zip(even, counts, strict=True))
    with pytest.raises(InvalidRegionError):
        PatchIterableDataset(plans, rank=2, world_size=2)
    with pytest.raises(InvalidRegionError):
        PatchIterableDataset(plans, rank=0)


@needs_torch
@pytest.mark.parametrize("workers,context,shuffle", [(0, None, True), (1, "fork", True), (2, "fork", True),
                                                     (2, "spawn", True), (2, "forkserver", True),
                                                     (0, None, False), (2, "fork", False)])
def test_iterable_dataloader_yields_exactly_the_plans_patches(plans, reference, workers, context, shuffle):
    import torch
    from torch.utils.data import DataLoader

    from wsitool.torchdata import PatchIterableDataset

    ds = PatchIterableDataset(plans, batch_size=24, seed=7, shuffle=shuffle, shuffle_window=2, max_open_slides=1,
                              channels_last=context == "fork")
    ds.set_epoch(3)
    next(iter(ds))  # slides opened in the parent before the workers start
    loader = DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context=context)
    idx, pats, batches = _collect(loader)
    np.testing.assert_array_equal(pats, reference[idx])
    first = _collect.first
    assert tuple(first.shape) == (24, 3, SIZE, SIZE)
    assert first.is_contiguous(memory_format=torch.channels_last if ds.channels_last else torch.contiguous_format)
    share = ds.shard(3)
    expected = [tuple(share[b:b + 24].tolist()) for b in range(0, len(share), 24)]
    assert sorted(batches) == sorted(expected)            # the same batches, each the same patches
    if workers <= 1:
        assert batches == expected                          # and in the epoch's order


@needs_torch
def test_set_epoch_reaches_persistent_workers(plans):
    from torch.utils.data import DataLoader

    from wsitool.torchdata import PatchIterableDataset

    ds = PatchIterableDataset(plans, batch_size=64, seed=1)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True,
                        multiprocessing_context="fork")
    for epoch in (0, 1, 2):
        ds.set_epoch(epoch)
        got = sorted(tuple(c["index"].tolist()) for _, c in loader)
        share = ds.shard(epoch)
        assert got == sorted(tuple(share[b:b + 64].tolist()) for b in range(0, len(share), 64))


# ------------------------------------------------------------------ per-process resources


@needs_torch
def test_pickles_by_path_without_open_slides(plans, reference):
    from wsitool.torchdata import PatchDataset, PatchIterableDataset

    ds = PatchIterableDataset(plans, batch_size=8, seed=3)
    ds.set_epoch(9)
    next(iter(ds))
    assert ds._pool is not None and ds._pool.open
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._pool is None and clone.epoch == 9
    clone.set_epoch(2)
    assert ds.epoch == 9           # a plain copy, not the original's shared epoch
    m = pickle.loads(pickle.dumps(PatchDataset(plans)))
    np.testing.assert_array_equal(m[100][0].permute(1, 2, 0).numpy(), reference[100])
    ds.close()
    assert ds._pool is None


@needs_torch
def test_open_slides_are_bounded_and_share_one_cache(plans, reference):
    from wsitool.read.cache import TileCache
    from wsitool.torchdata import PatchDataset

    ds = PatchDataset(plans, max_open_slides=1, cache_bytes=4 << 20)
    for i in (0, 500, 1, 501, 433):       # alternate between the two files
        np.testing.assert_array_equal(ds[i][0].permute(1, 2, 0).numpy(), reference[i])
        assert len(ds._pool.open) == 1
    cache = ds._pool.cache
    assert isinstance(cache, TileCache) and cache.max_bytes == 4 << 20
    assert 0 < cache.nbytes <= 4 << 20
    two = PatchDataset(plans, max_open_slides=2)
    for i in (0, 500, 1, 433):
        two[i]
    assert len(two._pool.open) == 2      # two plans of one file share its open slide


@needs_torch
def test_a_changed_slide_is_refused(plans, tmp_path):
    from wsitool.torchdata import PatchDataset

    p = plans[0]
    bad = PatchPlan(SlideIdentity(p.slide.path, p.slide.size + 1, None), {}, p.level, p.size, p.read_size,
                    p.effective_mpp, p.x, p.y, p.tissue)
    with pytest.raises(WsiError, match="plan it again"):
        PatchDataset(bad)[0]


@needs_torch
def test_bad_options(plans):
    from wsitool.torchdata import PatchDataset, PatchIterableDataset

    other = PatchPlan(plans[0].slide, {}, 0, 32, 32.0, 0.5, plans[0].x[:2], plans[0].y[:2], plans[0].tissue[:2])
    with pytest.raises(InvalidRegionError, match="different patch sizes"):
        PatchDataset([plans[0], other])
    with pytest.raises(InvalidRegionError):
        PatchDataset([])
    for kw in (dict(max_open_slides=0), dict(cache_bytes=-1), dict(threads=0)):
        with pytest.raises(InvalidRegionError):
            PatchDataset(plans, **kw)
    for kw in (dict(batch_size=0), dict(seed=-1), dict(shuffle_window=0)):
        with pytest.raises(InvalidRegionError):
            PatchIterableDataset(plans, **kw)


@needs_torch
def test_map_index_must_be_an_integer_in_range(plans):
    """``ds[1.5]`` and ``ds["3"]`` were read as patches 1 and 3 (``int(i)``), and ``ds[-n - 1]``
    said "patch index -1 out of range" (the index after adding n)."""
    from wsitool.torchdata import PatchDataset

    ds = PatchDataset(plans[:1])
    n = len(ds)
    for bad in (1.5, "3", None):
        with pytest.raises(TypeError, match="must be an integer"):
            ds[bad]
    with pytest.raises(IndexError, match=f"patch index {-n - 1} out of range"):
        ds[-n - 1]
    assert ds[np.int64(2)][1]["index"] == 2 and ds[-n][1]["index"] == 0


@needs_torch
def test_plan_files_are_accepted(plans, reference, tmp_path):
    pytest.importorskip("pyarrow", reason="pyarrow (Parquet plans) is not installed")
    from wsitool.patches.plan import write_plans
    from wsitool.torchdata import PatchDataset

    path = tmp_path / "plans.parquet"
    write_plans(plans[:1], path)
    ds = PatchDataset(str(path))
    assert len(ds) == len(plans[0])
    np.testing.assert_array_equal(ds[17][0].permute(1, 2, 0).numpy(), reference[17])


@needs_torch
def test_memory_of_persistent_workers_stays_flat_over_ten_epochs():
    """RSS of the main process plus two persistent workers, after a first epoch (imports,
    decoders, the first slide opened) and after ten more, grows by less than 20 MB.  Batches
    of 64 patches of 224 pixels (9.6 MB) and shuffle windows of 38.5 MB: made on the heap and
    moved to shared memory, such batches had grown the workers by ~100 MB in three epochs."""
    import psutil
    from torch.utils.data import DataLoader

    from wsitool.torchdata import PatchIterableDataset

    with wsitool.open_slide(JPEG) as s:
        xs, ys = np.meshgrid(np.arange(0, 1536 - 224 + 1, 64), np.arange(0, 1152 - 224 + 1, 64))
        plan = PatchPlan(SlideIdentity.of(s), {}, 0, 224, 224.0, 0.5, xs.ravel().astype(np.int64),
                         ys.ravel().astype(np.int64), np.full(xs.size, np.nan, np.float32))
    ds = PatchIterableDataset(plan, batch_size=64, seed=0)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True,
                        multiprocessing_context="fork")
    me = psutil.Process()

    def family_rss():
        kids = me.children(recursive=True)
        assert len(kids) >= 2
        return me.memory_info().rss + sum(k.memory_info().rss for k in kids)

    rss = []
    for epoch in range(11):
        ds.set_epoch(epoch)
        n = sum(len(c["index"]) for _, c in loader)
        assert n == len(plan)
        rss.append(family_rss())
    growth = (rss[-1] - rss[0]) / 2**20
    assert growth < 20, [round(r / 2**20) for r in rss]


@needs_torch
def test_iterable_transform_in_workers(plans, reference):
    import torch
    from torch.utils.data import DataLoader

    from wsitool.torchdata import PatchIterableDataset

    ds = PatchIterableDataset(plans, batch_size=50, seed=4, transform=lambda t: t.float().div(255))
    got = list(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"))
    idx = torch.cat([c["index"] for _, c in got]).numpy()
    pats = torch.cat([p for p, _ in got])
    assert pats.dtype == torch.float32 and tuple(pats.shape) == (len(reference), 3, SIZE, SIZE)
    np.testing.assert_allclose(pats.permute(0, 2, 3, 1).numpy(), reference[idx] / np.float32(255), rtol=1e-6)


@needs_torch
def test_pooled_batch_buffer_is_released_only_once_every_tensor_on_it_is_gone():
    """A worker's pooled batch buffer (wsitool.datasets.buffers._BatchPool) is offered again only when
    the process that unpickled the batch has dropped every tensor on it; views keep it held."""
    import multiprocessing

    import torch

    import wsitool.datasets.buffers as td

    def received(storage):     # the same shared memory, mapped anew (as the main process does)
        fd, size = storage._share_fd_cpu_()
        return torch.UntypedStorage._new_shared_fd_cpu(os.dup(fd), size)

    board = multiprocessing.RawArray("q", td._BOARD_WORKERS * td._SLOTS)
    saved, td._BOARD = td._BOARD, board
    try:
        pool = td._BatchPool(board, 1)
        storage, entry, token = pool.take(2 * 3 * 4 * 4)
        assert entry == td._SLOTS and token != 0
        first = td._rebuild_batch(received(storage), (2, 3, 4, 4), (48, 16, 4, 1), torch.zeros(4, 2, dtype=torch.int64),
                                  entry, token)
        patches, coords = first
        assert tuple(patches.shape) == (2, 3, 4, 4) and sorted(coords) == ["index", "slide", "x", "y"]
        view = patches[1]
        del storage, first, patches
        s2, e2, t2 = pool.take(96)              # the first buffer is held (a view): a second one
        assert e2 == entry + 1
        td._rebuild_batch(received(s2), (2, 3, 4, 4), (48, 16, 4, 1), torch.zeros(4, 2, dtype=torch.int64), e2, t2)
        assert board[entry] != token
        del view
        td._rebuild_batch(torch.UntypedStorage(96), (2, 3, 4, 4), (48, 16, 4, 1),
                          torch.zeros(4, 2, dtype=torch.int64), -1, 0)   # not pooled: posts the others
        assert board[entry] == token and board[e2] == t2
        again, e3, t3 = pool.take(96)
        assert e3 == entry and t3 != token
        again.copy_(torch.UntypedStorage(96))    # (the buffer's pages are the worker's own again)
    finally:
        td._BOARD = saved
        td._HELD.clear()


@needs_torch
def test_iterable_batches_kept_by_the_consumer_are_never_overwritten(plans, reference):
    """Batches the main process keeps (the workers' buffers never released) hold their patches,
    and batches it drops (buffers reused) are right too, both layouts, over two epochs."""
    import torch
    from torch.utils.data import DataLoader

    from wsitool.torchdata import PatchIterableDataset

    for channels_last in (False, True):
        ds = PatchIterableDataset(plans, batch_size=16, shuffle=False, channels_last=channels_last)
        loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True,
                            multiprocessing_context="fork")
        kept = list(loader)
        for _ in range(2):
            for patches, coords in loader:     # dropped as it goes: buffers reused
                np.testing.assert_array_equal(patches.permute(0, 2, 3, 1).numpy(), reference[coords["index"].numpy()])
        idx = torch.cat([c["index"] for _, c in kept]).numpy()
        pats = torch.cat([p for p, _ in kept]).permute(0, 2, 3, 1).numpy()
        assert sorted(idx.tolist()) == list(range(len(reference)))
        np.testing.assert_array_equal(pats, reference[idx])
        assert kept[0][0].is_contiguous(memory_format=torch.channels_last if channels_last else
                                        torch.contiguous_format)


@needs_torch
def test_iterable_without_buffer_reuse_sends_fresh_batches(plans, reference):
    """reuse_buffers=False: every batch in fresh shared memory (nothing pooled, nothing for the
    main process to release), the same patches."""
    import torch
    from torch.utils.data import DataLoader

    import wsitool.datasets.buffers as td
    from wsitool.torchdata import PatchIterableDataset

    td._HELD.clear()
    ds = PatchIterableDataset(plans, batch_size=16, shuffle=False, reuse_buffers=False)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    got = list(loader)
    assert td._HELD == []                       # no pooled batch was received
    idx = torch.cat([c["index"] for _, c in got]).numpy()
    assert sorted(idx.tolist()) == list(range(len(reference)))
    np.testing.assert_array_equal(torch.cat([p for p, _ in got]).permute(0, 2, 3, 1).numpy(), reference[idx])
