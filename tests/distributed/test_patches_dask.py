"""Patch plans on Dask (wsitool.distributed.patches): the array and the bag equal ``read_patches``.

One ``LocalCluster`` of two single-threaded worker processes for the module;
skipped with the reason where ``dask[array]`` / ``distributed`` are absent.  The
plans are made without tissue detection on the repository's own sample.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import shutil

import numpy as np
import pytest

import wsitool
from wsitool.errors import InvalidRegionError, WsiError
from wsitool.patches.plan import PatchPlan, SlideIdentity, plan_patches

from helpers import REPO_SAMPLES

HAVE_DASK = all(importlib.util.find_spec(m) is not None for m in ("dask", "distributed"))
pytestmark = pytest.mark.skipif(
    not HAVE_DASK, reason='dask[array] and distributed are not installed (pip install "wsitool[dask]")')

SAMPLE = REPO_SAMPLES / "sample-aperio-jpeg.svs"


@pytest.fixture(scope="module")
def plans():
    with wsitool.open_slide(SAMPLE) as s:
        return [plan_patches(s, mpp=0.5, size=64, mask=None),    # level 0 as it is
                plan_patches(s, mpp=1.3, size=64, mask=None)]    # level 1 through the area filter


@pytest.fixture(scope="module")
def reference(plans):
    with wsitool.open_slide(SAMPLE) as s:
        return np.concatenate([np.concatenate(list(p.read_patches(s, batch_size=40))) for p in plans])


@pytest.fixture(scope="module")
def client():
    import logging

    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                           silence_logs=logging.ERROR)
    c = Client(cluster)
    yield c
    c.close()
    cluster.close()


def test_array_on_a_local_cluster_equals_read_patches(plans, reference, client):
    from wsitool.distributed import patches_to_dask

    arr = patches_to_dask(plans, batch_size=50)
    assert arr.shape == reference.shape and arr.dtype == np.uint8
    # chunks by batch, never across two plans: 432 = 8 x 50 + 32, then 54 = 50 + 4
    assert arr.chunks[0] == (50,) * 8 + (32, 50, 4)
    assert arr.chunks[1:] == ((64,), (64,), (3,))
    np.testing.assert_array_equal(arr.compute(), reference)
    # a slice computes only its chunks, on the cluster
    np.testing.assert_array_equal(arr[430:440].compute(), reference[430:440])
    # the graph holds paths, not open slides
    graph = dict(arr.__dask_graph__())
    assert pickle.loads(pickle.dumps(graph)).keys() == graph.keys()


def test_bag_on_a_local_cluster_equals_read_patches(plans, reference, client):
    from wsitool.distributed import patches_to_bag

    bag = patches_to_bag(plans, batch_size=100)
    assert bag.npartitions == 5 + 1
    records = bag.compute()
    assert [len(r["index"]) for r in records] == [100] * 4 + [32, 54]
    idx = np.concatenate([r["index"] for r in records])
    assert idx.tolist() == list(range(len(reference)))
    np.testing.assert_array_equal(np.concatenate([r["patches"] for r in records]), reference)
    last = records[-1]
    assert set(last["slide"].tolist()) == {1}
    np.testing.assert_array_equal(np.stack([last["x"], last["y"]], 1), plans[1].locations)
    # the bag's own operations run on the cluster too
    assert bag.map(lambda r: int(r["patches"].shape[0])).sum().compute() == len(reference)


def test_a_changed_slide_is_refused(plans, tmp_path):
    from wsitool.distributed import patches_to_dask

    p = plans[0]
    bad = PatchPlan(SlideIdentity(p.slide.path, p.slide.size + 1, None), {}, p.level, p.size, p.read_size,
                    p.effective_mpp, p.x, p.y, p.tissue)
    with pytest.raises(WsiError, match="plan it again"):
        patches_to_dask(bad)
    # rewritten after the array was built: refused at compute time
    copy = tmp_path / "copy.svs"
    shutil.copy(SAMPLE, copy)
    with wsitool.open_slide(copy) as s:
        plan = plan_patches(s, mpp=0.5, size=64, mask=None)
    arr = patches_to_dask(plan, batch_size=100)
    st = os.stat(copy)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(WsiError, match="changed"):
        arr.compute(scheduler="sync")


def test_bad_options(plans):
    from wsitool.distributed import patches_to_dask

    other = PatchPlan(plans[0].slide, {}, 0, 32, 32.0, 0.5, plans[0].x[:2], plans[0].y[:2], plans[0].tissue[:2])
    with pytest.raises(InvalidRegionError, match="different patch sizes"):
        patches_to_dask([plans[0], other])
    with pytest.raises(InvalidRegionError):
        patches_to_dask([])
    with pytest.raises(InvalidRegionError):
        patches_to_dask(plans, batch_size=0)
    empty = PatchPlan(plans[0].slide, {}, 0, 64, 64.0, 0.5, plans[0].x[:0], plans[0].y[:0], plans[0].tissue[:0])
    assert patches_to_dask(empty).shape == (0, 64, 64, 3)
