"""The Deep Zoom writer: ``NAME.dzi`` and ``NAME_files/<level>/<col>_<row>.<format>`` (floor 6).

* Deep Zoom: ``NAME.dzi`` (XML, namespace
  ``http://schemas.microsoft.com/deepzoom/2008``: ``Image`` with
  ``TileSize``, ``Overlap``, ``Format``; ``Size`` with ``Width``/``Height``)
  and ``NAME_files/<level>/<col>_<row>.<format>``, level 0 being 1 x 1 and
  the last the full image; level sizes halve with ``ceil``; a tile is
  ``TileSize`` plus ``Overlap`` on each side that has a neighbour, clipped to
  the level (the grid of OpenSlide's ``DeepZoomGenerator``, whose tiles this
  matches in number, size and, at full resolution, pixels; OpenSeadragon
  clips tile bounds to the image the same way).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from xml.sax.saxutils import quoteattr

from ..errors import WsiError
from ..ground import outputs as atomic
from .associated import PAINTED_KEY
from .encode import TileCounter, TileStream
from .options import ExportOptions


def dzi_paths(output: Path) -> tuple[Path, Path]:
    """``(NAME.dzi, NAME_files)`` for an output given with or without ``.dzi``."""
    if output.suffix.lower() == ".dzi":
        stem = output.stem
        dzi = output
    else:
        stem = output.name
        dzi = output.with_name(stem + ".dzi")
    return dzi, dzi.with_name(stem + "_files")


def write_dzi(tiles: TileStream, final: Path, files_dir: Path,
              dims: Sequence[tuple[int, int]], counter: TileCounter, options: ExportOptions, *,
              sources: Sequence[str] = (), painted: Callable[[], int] | None = None) -> int:
    """Write a Deep Zoom export; returns the bytes written (tiles and ``.dzi``).

    ``tiles`` yields ``(level, col, row, bytes)`` (level 0 the full resolution,
    as :func:`~wsitool.export.encode.encoded_tiles` numbers them) for the levels
    ``dims`` (``(width, height)`` in pixels, full resolution first),
    ``options.tile_size`` square tiles with overlap ``options.overlap`` (pixels),
    JPEG for ``options.compression`` ``jpeg``, else PNG.  Everything is made in a
    hidden folder beside ``final`` and renamed into place, the ``_files`` folder
    first and the ``.dzi`` last (what viewers open), replacing an existing output
    only with ``options.overwrite``; ``painted()``, if given, is the count of
    painted tiles recorded in a comment of the ``.dzi``.

    Raises:
        OutputExistsError, OutputIsSourceError: see :func:`wsitool.ground.outputs.check_output`.
        OSError: the folder cannot be written (disk full, permissions), naming ``final``.

    Any error from ``tiles`` propagates; nothing is then left under either name.
    """
    ext = "jpeg" if options.compression == "jpeg" else "png"
    partial = atomic.create_dir(final, sources)  # the tiles folder and the .dzi are made in it
    try:
        tmp_files = partial.path / files_dir.name
        nbytes = _write_tiles(tiles, tmp_files, len(dims), ext, counter)
        xml = _dzi_xml(ext, options.overlap, options.tile_size, dims[0], painted)
        tmp_dzi = partial.path / final.name
        tmp_dzi.write_text(xml, encoding="utf-8")
        nbytes += len(xml)
        # Commit: tiles folder first, the .dzi (what viewers open) last.
        atomic.check_output(final, sources, options.overwrite)
        atomic.check_output(files_dir, sources, options.overwrite, kind="dir")
        if options.overwrite:
            _replace(tmp_files, tmp_dzi, files_dir, final, partial.path / "old")
        else:  # neither name may appear meanwhile: no-replace renames
            _commit_new(tmp_files, tmp_dzi, files_dir, final, sources)
        partial.abort()
        return nbytes
    except BaseException as exc:
        tiles.close()
        partial.abort()
        if isinstance(exc, OSError) and not isinstance(exc, WsiError):
            raise atomic.user_error(exc, final) from None
        raise


def _write_tiles(tiles: Iterable[tuple[int, int, int, bytes]], tmp_files: Path, n: int, ext: str,
                 counter: TileCounter) -> int:
    """The tiles as ``tmp_files/<n - 1 - level>/<col>_<row>.<ext>``; returns their bytes."""
    for k in range(n):
        (tmp_files / str(n - 1 - k)).mkdir(parents=True)
    nbytes = 0
    for k, c, r, data in tiles:
        with open(tmp_files / str(n - 1 - k) / f"{c}_{r}.{ext}", "wb") as fh:
            fh.write(data)
        nbytes += len(data)
        counter.add()
    return nbytes


def _dzi_xml(ext: str, ov: int, T: int, size: tuple[int, int], painted: Callable[[], int] | None) -> str:
    """The ``.dzi`` document (module notes) of a ``size`` = ``(width, height)`` image."""
    w, h = size
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<Image xmlns="http://schemas.microsoft.com/deepzoom/2008" Format={quoteattr(ext)} '
        f'Overlap="{ov}" TileSize="{T}">\n'
        f'  <Size Width="{w}" Height="{h}"/>\n'
        + (f"  <!-- wsitool: {PAINTED_KEY}={painted()} -->\n" if painted is not None else "")
        + "</Image>\n"
    )


def _commit_new(tmp_files: Path, tmp_dzi: Path, files_dir: Path, final: Path, sources: Sequence[str]) -> None:
    """Rename the tiles folder, then the ``.dzi``, to names that must not exist; if the
    ``.dzi`` cannot be, the folder (ours, just renamed) is taken back."""
    atomic.commit(tmp_files, files_dir, sources=sources)
    try:
        atomic.commit(tmp_dzi, final, sources=sources)
    except BaseException:
        os.rename(files_dir, tmp_files)  # ours, just renamed: take it back
        raise


def _replace(tmp_files: Path, tmp_dzi: Path, files_dir: Path, final: Path, old: Path) -> None:
    """Replace an existing output: the previous one moved into ``old`` (in the partial
    folder, removed with it), ours renamed into place; on failure ours is taken out
    again and the previous output put back."""
    old.mkdir()
    old_files, old_dzi = old / files_dir.name, old / final.name
    if files_dir.exists():
        os.replace(files_dir, old_files)
    if final.exists():
        os.replace(final, old_dzi)
    try:
        os.replace(tmp_files, files_dir)
        os.replace(tmp_dzi, final)
    except BaseException:  # take ours out again and put the previous output back
        if not tmp_files.exists() and files_dir.exists():
            shutil.rmtree(files_dir, ignore_errors=True)
        if not tmp_dzi.exists():
            final.unlink(missing_ok=True)
        if old_files.exists():
            os.replace(old_files, files_dir)
        if old_dzi.exists():
            os.replace(old_dzi, final)
        raise
