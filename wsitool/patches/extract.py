"""Patches of a plan written as WebDataset-style tar shards (floor 6).

A shard is a plain tar file (``{prefix}-{index:06d}.tar``) holding, per patch,
two members with the same key: ``{key}.jpg`` (or ``.png``), the patch, and
``{key}.json``, where it came from: the slide's path, level-0 ``x``/``y``,
``level``, ``read_size``, ``size``, ``effective_mpp`` and ``tissue``.  The key
is ``{slide stem}_{x}_{y}`` with every character outside ``[A-Za-z0-9_-]``
replaced by ``_`` (WebDataset groups members by the part of the name before the
first dot, so the key has none).  Members carry a fixed time stamp and mode,
so the same plan gives byte-identical shards.

Each shard is written to a partial file and renamed when complete
(:mod:`wsitool.ground.outputs`): an interrupted extraction leaves whole shards only; an
existing shard is an error unless ``overwrite``.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ..errors import InvalidRegionError
from ..ground.outputs import check_output, open_file
from .plan import PatchPlan

__all__ = ["extract_shards", "patch_key", "FORMATS"]

#: Image formats of the patches: extension of the member.
FORMATS = {"jpeg": "jpg", "png": "png"}
#: The time stamp of every member (2000-01-01T00:00:00Z): shards do not depend on when they were made.
_MTIME = 946684800


def patch_key(slide_path: str, x: int, y: int) -> str:
    """The WebDataset key of the patch at level-0 ``(x, y)`` of ``slide_path``."""
    stem = os.path.basename(os.path.normpath(slide_path)).split(".")[0] or "slide"
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{stem}_{x}_{y}")


def _encode(patch: np.ndarray, fmt: str, quality: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    img = Image.fromarray(patch)
    if fmt == "jpeg":
        img.save(buf, "JPEG", quality=quality, subsampling=0 if quality >= 90 else 2)
    else:
        img.save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = _MTIME
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def extract_shards(slide, plan: PatchPlan, out_dir: str | os.PathLike, *, fmt: str = "jpeg", quality: int = 90,
                   shard_size: int = 1000, prefix: str | None = None, batch_size: int = 64,
                   threads: int | None = None, overwrite: bool = False, progress=None) -> list[Path]:
    """Write every patch of ``plan`` (read from ``slide``) into tar shards in ``out_dir``.

    Args:
        slide: the open slide the plan was made for.
        plan: the :class:`~wsitool.patches.plan.PatchPlan`.
        out_dir: an existing folder.
        fmt: ``"jpeg"`` (default) or ``"png"`` (lossless).
        quality: JPEG quality, 1..100 (4:4:4 chroma at 90 and above).
        shard_size: patches per shard.
        prefix: shard name prefix (default: the slide's file name stem).
        batch_size, threads: as :meth:`wsitool.Slide.read_patches`.
        overwrite: replace existing shards of the same names.
        progress: None, or a callable ``progress(done)`` called after each batch.

    Returns:
        The paths of the shards written, in order.

    Raises:
        InvalidRegionError: a bad ``fmt``, ``quality`` or ``shard_size``.
        OutputExistsError: a shard exists and not ``overwrite``.
        TileDecodeError, OSError: reading the slide or writing a shard failed
            (the shard being written is removed; earlier shards stay complete).
    """
    out_dir = _checked_folder(slide, out_dir, fmt, quality, shard_size)
    stem = prefix or re.sub(r"[^A-Za-z0-9_-]", "_", os.path.basename(os.path.normpath(plan.slide.path)).split(".")[0])
    n = len(plan)
    names = [out_dir / f"{stem}-{i:06d}.tar" for i in range(-(-n // shard_size))]
    for name in names:
        check_output(name, [slide.path], overwrite)
    batches = plan.read_patches(slide, batch_size=min(batch_size, shard_size), threads=threads)
    members = _members(plan, batches, fmt, quality)
    done = 0

    def patch_done() -> None:
        nonlocal done
        done += 1
        if progress is not None and (done % batch_size == 0 or done == n):
            progress(done)

    for s, name in enumerate(names):
        _write_shard(name, [slide.path], members, min(n, (s + 1) * shard_size) - s * shard_size, patch_done,
                     overwrite=overwrite)
    return names


def _checked_folder(slide, out_dir: str | os.PathLike, fmt: str, quality: int, shard_size: int) -> Path:
    """``out_dir`` as a Path, after the checks of the options (InvalidRegionError) and of the folder
    (FileNotFoundError when it does not exist)."""
    if fmt not in FORMATS:
        raise InvalidRegionError(f"{slide.path}: patch format must be one of {sorted(FORMATS)}, got {fmt!r}")
    if not 1 <= int(quality) <= 100 or int(shard_size) < 1:
        raise InvalidRegionError(f"{slide.path}: need 1 <= quality <= 100 and shard_size >= 1")
    folder = Path(out_dir)
    if not folder.is_dir():
        raise FileNotFoundError(2, "output folder does not exist", str(folder))
    return folder


def _members(plan: PatchPlan, batches: Iterator[np.ndarray], fmt: str,
             quality: int) -> Iterator[tuple[tuple[str, bytes], tuple[str, bytes]]]:
    """The two tar members of each patch of ``plan``, in order: ``(key.jpg|png, encoded patch)`` and
    ``(key.json, where it came from)``; ``batches``: the plan's patches, read as they are needed."""
    table = plan.table()
    ext = FORMATS[fmt]
    i = 0
    for batch in batches:
        for patch in batch:
            x, y = int(table["x"][i]), int(table["y"][i])
            key = patch_key(plan.slide.path, x, y)
            image = (f"{key}.{ext}", _encode(patch, fmt, quality))
            meta = {"slide": plan.slide.path, "x": x, "y": y, "level": plan.level,
                    "read_size": plan.read_size, "size": plan.size,
                    "effective_mpp": plan.effective_mpp, "tissue": float(table["tissue"][i])}
            yield image, (f"{key}.json", json.dumps(meta, allow_nan=True).encode())
            i += 1


def _write_shard(name: Path, sources: list[str], members: Iterator[tuple[tuple[str, bytes], tuple[str, bytes]]],
                 count: int, patch_done: Callable[[], None], *, overwrite: bool) -> None:
    """The next ``count`` patches of ``members`` into the tar ``name``: written to a partial, renamed
    when complete (removed on an error)."""
    partial, fh = open_file(name, sources)
    with partial:
        with fh, tarfile.open(fileobj=fh, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for _ in range(count):
                for member, data in next(members):
                    _add(tar, member, data)
                patch_done()
        partial.commit(overwrite)
