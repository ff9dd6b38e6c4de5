"""Patch plans: a slide's patch coordinates at a physical resolution, and their files (floor 6).

:func:`plan_patches` is a pure function of a slide and its parameters.  The
level policy, with ``target`` the MPP asked for (``mpp``, or the magnification
turned into one through the slide's objective power and MPP):

* a level whose MPP is within ``mpp_tolerance`` (relative, default 5 %) of
  ``target`` is read as it is: ``read_size == size``, the effective MPP is
  that level's (the closest such level);
* otherwise the finer level closest to ``target`` is read at
  ``read_size = size * target / level_mpp`` pixels (a float) and reduced to
  ``size`` by the exact area filter (:meth:`wsitool.Slide.read_patches` with
  ``read_size``); the effective MPP is ``level_mpp * read_size / size`` =
  ``target``;
* a target finer than level 0 beyond the tolerance is an error unless
  ``allow_upscale`` (then level 0 is read at less than ``size`` and enlarged);
* a slide without resolution metadata needs ``mpp_override``.

(MONAI picks the closest level within 10 % or refuses; LazySlide and hs2p read the
finer level and resize beyond 5 %, never upscaling, which is the rule here.)

The grid starts at the slide's origin with a stride of ``size - overlap`` output
pixels (in level-0 pixels: ``(size - overlap) * read_size / size * downsample``,
rounded to whole level-0 pixels); only patches wholly inside the slide are
planned.  With a tissue mask, patches whose tissue fraction is below
``min_tissue`` are dropped.

Files: Parquet (pyarrow; several slides in one file, a ``slide`` column, the
identities and parameters as JSON in the schema metadata under ``wsitool``) and
HDF5 in CLAM's layout (h5py; one slide: a ``coords`` dataset of level-0 ``(x, y)``
with the attributes ``patch_level`` and ``patch_size``, the read size at
``patch_level``, plus wsitool's own attributes).  Both are written to a
temporary name and renamed; an existing output is an error.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import IO

import numpy as np

from ..errors import InvalidRegionError, WsiError
from ..ground.outputs import check_output, open_file
from ..version import __version__
from .tissue import TissueMask, TissueParams, detect_tissue, load_mask

__all__ = ["SlideIdentity", "PatchPlan", "plan_patches", "read_plan", "read_plans", "load_plans", "write_plans",
           "PlanFileError", "COLUMNS"]

#: The columns of a plan's table, with their dtypes.
COLUMNS = {"x": np.int64, "y": np.int64, "level": np.int32, "read_size": np.float64, "size": np.int32,
           "effective_mpp": np.float64, "tissue": np.float32}


class PlanFileError(WsiError, ValueError):
    """A plan file that cannot be read or written (not a plan, an unknown extension)."""


@dataclass(frozen=True)
class SlideIdentity:
    """Which slide a plan belongs to.

    Attributes:
        path: the slide's absolute path (or URL).
        size: its size in bytes (a folder: the sum of its files), or None.
        quickhash: OpenSlide's ``openslide.quickhash-1`` where the format has it, else None.
    """

    path: str
    size: int | None
    quickhash: str | None

    @classmethod
    def of(cls, slide) -> SlideIdentity:
        """The identity of an open slide (a remote one: its URL without credentials or query)."""
        remote = getattr(slide, "remote", None)
        if remote is not None:
            try:
                quick = slide.properties.get("openslide.quickhash-1")
            except WsiError:
                quick = None
            return cls(remote["url"].split("?", 1)[0], remote.get("size"), quick)   # no query: no token
        path = os.path.abspath(slide.path)
        if os.path.isdir(path):
            size = sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
        else:
            size = os.path.getsize(path)
        try:
            quick = slide.properties.get("openslide.quickhash-1")
        except WsiError:
            quick = None
        return cls(path, size, quick)


@dataclass
class PatchPlan:
    """The patches of one slide: a coordinate table plus what made it.

    Attributes:
        slide: the :class:`SlideIdentity`.
        params: every parameter of :func:`plan_patches` (JSON-safe values).
        level: the level read.
        size: output patch side, pixels.
        read_size: side of the window read at ``level`` (``== size`` when no resampling), pixels.
        effective_mpp: micrometres per pixel of the output patches.
        x, y: ``(n,)`` int64 level-0 corners.
        tissue: ``(n,)`` float32 tissue fractions (NaN without a mask).
    """

    slide: SlideIdentity
    params: dict
    level: int
    size: int
    read_size: float
    effective_mpp: float
    x: np.ndarray
    y: np.ndarray
    tissue: np.ndarray
    mask: TissueMask | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.x)

    @property
    def locations(self) -> np.ndarray:
        """``(n, 2)`` int64 level-0 ``(x, y)``, as :meth:`wsitool.Slide.read_patches` takes them."""
        return np.stack([self.x, self.y], 1)

    @property
    def resampled(self) -> bool:
        """True when the windows are read larger (or smaller) than ``size`` and area-filtered."""
        return self.read_size != self.size

    def read_kwargs(self) -> dict:
        """Keyword arguments of :meth:`wsitool.Slide.read_patches` for this plan's patches."""
        return dict(size=(self.size, self.size), level=self.level,
                    read_size=(self.read_size, self.read_size) if self.resampled else None)

    def read_patches(self, slide, **kwargs):
        """``slide.read_patches`` of every patch of the plan (``kwargs``: batch_size, threads, ...)."""
        return slide.read_patches(self.locations, **self.read_kwargs(), **kwargs)

    def table(self) -> dict[str, np.ndarray]:
        """The coordinate table as columns (see :data:`COLUMNS`)."""
        n = len(self)
        return {
            "x": self.x.astype(np.int64), "y": self.y.astype(np.int64),
            "level": np.full(n, self.level, np.int32), "read_size": np.full(n, self.read_size),
            "size": np.full(n, self.size, np.int32), "effective_mpp": np.full(n, self.effective_mpp),
            "tissue": self.tissue.astype(np.float32),
        }

    def meta(self) -> dict:
        return {"slide": asdict(self.slide), "params": self.params, "level": self.level, "size": self.size,
                "read_size": self.read_size, "effective_mpp": self.effective_mpp, "wsitool": __version__}

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> None:
        """Write to ``.parquet`` or ``.h5`` / ``.hdf5`` (CLAM's layout) by extension; see :func:`write_plans`."""
        write_plans([self], path, overwrite=overwrite)


def _target_mpp(slide, mpp0: float, mpp, magnification) -> float:
    if (mpp is None) == (magnification is None):
        raise InvalidRegionError(f"{slide.path}: give exactly one of mpp and magnification")
    if mpp is not None:
        if not (mpp > 0 and math.isfinite(mpp)):
            raise InvalidRegionError(f"{slide.path}: mpp must be positive, got {mpp!r}")
        return float(mpp)
    if not (magnification > 0 and math.isfinite(magnification)):
        raise InvalidRegionError(f"{slide.path}: magnification must be positive, got {magnification!r}")
    objective = slide.objective_power
    if objective is None:
        raise InvalidRegionError(f"{slide.path}: magnification needs the slide's objective power, which it "
                                 "does not record; give an MPP instead")
    return mpp0 * objective / float(magnification)


def choose_level(slide, mpp0: float, target: float, tolerance: float,
                 allow_upscale: bool) -> tuple[int, float]:
    """``(level, level_mpp)`` per the policy of the module docstring.

    Raises:
        InvalidRegionError: ``target`` finer than level 0 beyond the tolerance,
            without ``allow_upscale``.
    """
    mpps = [mpp0 * ds for ds in slide.level_downsamples]
    close = [(abs(m / target - 1), i) for i, m in enumerate(mpps) if abs(m / target - 1) <= tolerance]
    if close:
        i = min(close)[1]
        return i, mpps[i]
    finer = [i for i, m in enumerate(mpps) if m < target]
    if finer:
        i = max(finer, key=lambda j: mpps[j])
        return i, mpps[i]
    if not allow_upscale:
        raise InvalidRegionError(
            f"{slide.path}: {target:g} um/px is finer than level 0 ({mpp0:g} um/px) beyond the tolerance "
            f"{tolerance:g}; patches would be upscaled (allow_upscale=True / --allow-upscale to do it)")
    return 0, mpps[0]


def plan_patches(slide, *, mpp: float | None = None, magnification: float | None = None, size: int = 224,
                 overlap: int = 0, mask="auto", min_tissue: float = 0.5, mpp_tolerance: float = 0.05,
                 mpp_override: float | None = None, allow_upscale: bool = False,
                 tissue: TissueParams | None = None, threads: int | None = None) -> PatchPlan:
    """Plan the patches of ``slide`` at a physical resolution (see the module docstring).

    Args:
        slide: an open :class:`wsitool.Slide`.
        mpp: micrometres per pixel of the output patches; or
        magnification: an objective magnification (e.g. 20), turned into an MPP
            through the slide's objective power.
        size: output patch side, pixels.
        overlap: output pixels shared by neighbouring patches (``0 <= overlap < size``).
        mask: ``"auto"`` (default: :func:`~wsitool.patches.tissue.detect_tissue`),
            None (no tissue filter; ``tissue`` is NaN), or a user's mask (see
            :func:`~wsitool.patches.tissue.load_mask`).
        min_tissue: smallest tissue fraction of a kept patch, 0..1.
        mpp_tolerance: relative difference within which a level is read as it is.
        mpp_override: level-0 MPP for a slide without resolution metadata (or to
            correct a wrong one).
        allow_upscale: allow reading level 0 smaller than ``size`` and enlarging it.
        tissue: :class:`~wsitool.patches.tissue.TissueParams` for ``mask="auto"``.
        threads: decode threads for the tissue thumbnail.

    Returns:
        The :class:`PatchPlan` (patches in row-major order).

    Raises:
        InvalidRegionError: a bad parameter, a slide without MPP and no
            ``mpp_override``, or an upscale not allowed.
    """
    size = int(size)
    overlap = int(overlap)
    _check_options(slide, size, overlap, min_tissue, mpp_tolerance)
    mpp0 = _level0_mpp(slide, mpp_override)
    target = _target_mpp(slide, mpp0, mpp, magnification)
    level, level_mpp = choose_level(slide, mpp0, target, float(mpp_tolerance), allow_upscale)
    exact = abs(level_mpp / target - 1) <= mpp_tolerance
    read_size = float(size) if exact else size * target / level_mpp
    effective = level_mpp * read_size / size
    ds = slide.level_downsamples[level]
    extent = read_size * ds                       # level-0 pixels a patch covers
    x, y = _grid(slide.dimensions, extent, stride=(size - overlap) * read_size / size * ds)
    tmask = None
    if mask is None:
        frac = np.full(len(x), np.nan, np.float32)
    else:
        tmask = (detect_tissue(slide, tissue, mpp_override=mpp_override, threads=threads) if mask == "auto"
                 else load_mask(mask, slide, params=tissue, mpp_override=mpp_override, threads=threads))
        frac = tmask.fraction(x, y, extent, extent)
        keep = frac >= min_tissue
        x, y, frac = x[keep], y[keep], frac[keep]
    params = dict(mpp=mpp, magnification=magnification, size=size, overlap=overlap,
                  mask=mask if mask in (None, "auto") else "user", min_tissue=min_tissue,
                  mpp_tolerance=mpp_tolerance, mpp_override=mpp_override, allow_upscale=allow_upscale,
                  tissue=asdict(tissue or TissueParams()) if mask == "auto" else None,
                  level0_mpp=mpp0, target_mpp=target,
                  level_dimensions=list(slide.level_dimensions[level]), level_downsample=float(ds))
    return PatchPlan(SlideIdentity.of(slide), params, level, size, read_size, effective, x, y, frac, tmask)


def _check_options(slide, size: int, overlap: int, min_tissue: float, mpp_tolerance: float) -> None:
    """InvalidRegionError (naming the slide) for a size, overlap, tissue fraction or tolerance out of range."""
    if size < 1 or not 0 <= overlap < size:
        raise InvalidRegionError(f"{slide.path}: need size >= 1 and 0 <= overlap < size, got {size}, {overlap}")
    if not 0 <= min_tissue <= 1:
        raise InvalidRegionError(f"{slide.path}: min_tissue must be in 0..1, got {min_tissue!r}")
    if not mpp_tolerance >= 0:
        raise InvalidRegionError(f"{slide.path}: mpp_tolerance must be >= 0, got {mpp_tolerance!r}")


def _level0_mpp(slide, mpp_override: float | None) -> float:
    """Level-0 micrometres per pixel: ``mpp_override``, else the geometric mean of the slide's x and y MPP."""
    if mpp_override is not None:
        if not (mpp_override > 0 and math.isfinite(mpp_override)):
            raise InvalidRegionError(f"{slide.path}: mpp_override must be positive, got {mpp_override!r}")
        return float(mpp_override)
    if slide.mpp is not None:
        return float(math.sqrt(slide.mpp[0] * slide.mpp[1]))
    raise InvalidRegionError(f"{slide.path}: the slide records no resolution (MPP); give mpp_override "
                             "(--mpp-override) with its level-0 micrometres per pixel")


def _grid(dimensions: tuple[int, int], extent: float, stride: float) -> tuple[np.ndarray, np.ndarray]:
    """Level-0 corners ``(x, y)``, ``(n,)`` int64 each, row-major, of the patches of ``extent`` level-0
    pixels wholly inside a slide of ``dimensions``, every ``stride`` level-0 pixels (rounded)."""
    W0, H0 = dimensions
    nx = int(math.floor((W0 - extent) / stride)) + 1 if W0 >= extent else 0
    ny = int(math.floor((H0 - extent) / stride)) + 1 if H0 >= extent else 0
    xs = np.round(np.arange(nx) * stride).astype(np.int64)
    ys = np.round(np.arange(ny) * stride).astype(np.int64)
    gx, gy = np.meshgrid(xs, ys)
    return gx.ravel(), gy.ravel()


# ------------------------------------------------------------------ files


def _kind(path) -> str:
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext == ".parquet":
        return "parquet"
    if ext in (".h5", ".hdf5"):
        return "hdf5"
    raise PlanFileError(f"{os.fspath(path)}: a plan file ends in .parquet, .h5 or .hdf5")


def write_plans(plans: list[PatchPlan], path: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Write ``plans`` to ``path``: Parquet (any number of slides) or HDF5 (one slide, CLAM's layout).

    Written to a partial file in the same folder and renamed when complete
    (:mod:`wsitool.ground.outputs`); never onto a slide.

    Raises:
        PlanFileError: an unknown extension, or several plans to one HDF5 file.
        OutputExistsError: ``path`` exists and not ``overwrite``.
        ImportError: pyarrow (Parquet) or h5py (HDF5) absent: ``pip install 'wsitool[patches]'``.
    """
    kind = _kind(path)
    if kind == "hdf5" and len(plans) != 1:
        raise PlanFileError(f"{os.fspath(path)}: CLAM's HDF5 layout holds one slide; write Parquet or one "
                            f".h5 per slide")
    sources = [p.slide.path for p in plans]
    check_output(path, sources, overwrite)
    partial, fh = open_file(path, sources, read=True)  # (h5py reads back what it writes)
    with partial:
        with fh:
            if kind == "parquet":
                _write_parquet(plans, fh)
            else:
                _write_hdf5(plans[0], fh)
        partial.commit(overwrite)


def _write_parquet(plans: list[PatchPlan], fh: IO[bytes]) -> None:
    import pyarrow as pa  # optional: the patches extra
    import pyarrow.parquet as pq

    cols: dict[str, list] = {k: [] for k in ("slide", *COLUMNS)}
    for plan in plans:
        table = plan.table()
        cols["slide"].append(np.full(len(plan), plan.slide.path, dtype=object))
        for k in COLUMNS:
            cols[k].append(table[k])
    arrays = {k: (np.concatenate(v) if v else np.empty(0, COLUMNS.get(k, object))) for k, v in cols.items()}
    table = pa.table({k: pa.array(v) for k, v in arrays.items()})
    meta = {b"wsitool": json.dumps([p.meta() for p in plans]).encode()}
    pq.write_table(table.replace_schema_metadata(meta), fh)


def _write_hdf5(plan: PatchPlan, fh: IO[bytes]) -> None:
    import h5py  # optional: the patches extra

    with h5py.File(fh, "w") as f:
        coords = f.create_dataset("coords", data=plan.locations.astype(np.int64))
        coords.attrs["patch_level"] = plan.level
        coords.attrs["patch_size"] = int(round(plan.read_size))
        # the other attributes CLAM's patching writes (create_patches_fp.py), for readers that look
        dims = plan.params.get("level_dimensions")
        if dims:
            coords.attrs["level_dim"] = np.asarray(dims, np.int64)
            coords.attrs["downsampled_level_dim"] = np.asarray(dims, np.int64)
        ds = plan.params.get("level_downsample")
        if ds:
            coords.attrs["downsample"] = np.asarray([ds, ds], np.float64)
        coords.attrs["name"] = os.path.splitext(os.path.basename(plan.slide.path))[0]
        coords.attrs["wsitool"] = json.dumps(plan.meta())
        f.create_dataset("tissue", data=plan.tissue.astype(np.float32))


def _plans_from(meta: list[dict], columns: dict[str, np.ndarray]) -> list[PatchPlan]:
    plans = []
    for m in meta:
        sel = columns["slide"] == m["slide"]["path"] if "slide" in columns else slice(None)
        plans.append(PatchPlan(SlideIdentity(**m["slide"]), m["params"], int(m["level"]), int(m["size"]),
                               float(m["read_size"]), float(m["effective_mpp"]),
                               np.asarray(columns["x"][sel], np.int64), np.asarray(columns["y"][sel], np.int64),
                               np.asarray(columns["tissue"][sel], np.float32)))
    return plans


def read_plans(path: str | os.PathLike) -> list[PatchPlan]:
    """The plans in a file written by :func:`write_plans`.

    Raises:
        PlanFileError: not a plan file (an unknown extension, or no wsitool metadata).
        FileNotFoundError: ``path`` does not exist.
    """
    kind = _kind(path)
    if not os.path.exists(path):
        raise FileNotFoundError(2, "no such plan file", os.fspath(path))
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq  # optional: the patches extra

            table = pq.read_table(path)
            raw = (table.schema.metadata or {}).get(b"wsitool")
            if raw is None:
                raise PlanFileError(f"{os.fspath(path)}: not a wsitool patch plan (no wsitool metadata)")
            columns = {k: table.column(k).to_numpy(zero_copy_only=False) for k in table.column_names}
            return _plans_from(json.loads(raw), columns)
        import h5py  # optional: the patches extra

        with h5py.File(path, "r") as f:
            if "coords" not in f or "wsitool" not in f["coords"].attrs:
                raise PlanFileError(f"{os.fspath(path)}: not a wsitool patch plan (no coords with wsitool attributes)")
            coords = f["coords"][()]
            meta = json.loads(f["coords"].attrs["wsitool"])
            tissue = f["tissue"][()] if "tissue" in f else np.full(len(coords), np.nan, np.float32)
        return _plans_from([meta], {"x": coords[:, 0], "y": coords[:, 1], "tissue": tissue})
    except (OSError, ValueError, KeyError) as exc:
        if isinstance(exc, (PlanFileError, FileNotFoundError)):
            raise
        raise PlanFileError(f"{os.fspath(path)}: not a readable patch plan ({exc})") from None


def load_plans(plans) -> list[PatchPlan]:
    """Plans from a :class:`PatchPlan`, a plan file's path, or a (nested) sequence of either, in order
    (the consumers' one way to take plans: :mod:`wsitool.torchdata`, :mod:`wsitool.distributed.patches`).

    Raises:
        PlanFileError, FileNotFoundError: as :func:`read_plans`.
    """
    if isinstance(plans, PatchPlan):
        return [plans]
    if isinstance(plans, (str, os.PathLike)):
        return read_plans(plans)
    out: list[PatchPlan] = []
    for p in plans:
        out.extend(load_plans(p))
    return out


def read_plan(path: str | os.PathLike) -> PatchPlan:
    """The one plan in ``path`` (see :func:`read_plans`); PlanFileError if it holds several."""
    plans = read_plans(path)
    if len(plans) != 1:
        raise PlanFileError(f"{os.fspath(path)}: holds {len(plans)} slides' plans; use read_plans")
    return plans[0]
