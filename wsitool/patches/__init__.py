"""Training-set patch pipelines: tissue detection, patch plans at a physical resolution, extraction (floor 6).

* :mod:`.tissue`: a tissue mask from a thumbnail at about 8 micrometres per pixel
  (:func:`detect_tissue`), or a user's mask; GeoJSON polygons.
* :mod:`.plan`: the coordinate table of a slide's patches at an MPP or a
  magnification (:func:`plan_patches`), saved as Parquet or as HDF5 in CLAM's layout.
* :mod:`.extract`: patches of a plan written as WebDataset-style tar shards.
* :mod:`.preview`: the thumbnail with the mask and the patch grid drawn on it.

The plans feed :meth:`wsitool.Slide.read_patches` (each tile decoded once per
batch), the PyTorch datasets of :mod:`wsitool.torchdata` and the Dask form in
:mod:`wsitool.distributed.patches`.
"""

from .plan import PatchPlan, SlideIdentity, plan_patches, read_plan
from .tissue import TissueMask, TissueParams, detect_tissue, load_mask

__all__ = ["PatchPlan", "SlideIdentity", "TissueMask", "TissueParams", "detect_tissue", "load_mask",
           "plan_patches", "read_plan"]
