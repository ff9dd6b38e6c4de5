"""One ``.npz`` or Zarr store holding many regions, written through :mod:`wsitool.ground.outputs` (floor 7)."""

from __future__ import annotations

import contextlib
import zipfile
from pathlib import Path

import numpy as np

from ..errors import DaskUnavailableError
from ..ground import outputs as atomic


class PackWriter:
    """Write arrays one by one into ``<dest>`` (.npz zip or Zarr group), atomically.

    The store is made as a :mod:`wsitool.ground.outputs` partial (an exclusive new file,
    or a fresh folder for Zarr) and renamed onto ``dest`` by :meth:`commit`.
    """

    def __init__(self, dest: Path, fmt: str, sources=(), overwrite: bool = False):
        self.dest = dest
        self.fmt = fmt
        self.overwrite = overwrite
        self._fh = None
        if fmt == "npz":
            self.partial, self._fh = atomic.open_file(dest, sources, read=True)
            try:
                self._zip = zipfile.ZipFile(self._fh, "w", compression=zipfile.ZIP_STORED,
                                            allowZip64=True)
            except BaseException:
                self.abort()
                raise
        else:
            try:
                import zarr
            except ImportError:
                raise DaskUnavailableError(
                    "--pack with format zarr needs the zarr package (pip install zarr)"
                ) from None
            self.partial = atomic.create_dir(dest, sources)
            try:
                self._group = zarr.open_group(str(self.partial.path), mode="a")
            except BaseException:
                self.abort()
                raise

    def add(self, name: str, arr: np.ndarray) -> None:
        if self.fmt == "npz":
            with self._zip.open(f"{name}.npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.ascontiguousarray(arr), allow_pickle=False)
        elif hasattr(self._group, "create_array"):  # zarr >= 3
            z = self._group.create_array(name, shape=arr.shape, dtype=arr.dtype,
                                         chunks=(min(arr.shape[0], 512), min(arr.shape[1], 512), arr.shape[2]))
            z[...] = arr
        else:  # pragma: no cover - zarr 2
            self._group.create_dataset(name, data=arr)

    def commit(self) -> None:
        if self.fmt == "npz":
            self._zip.close()
            if self._fh is not None:
                self._fh.close()
        self.partial.commit(self.overwrite)

    def abort(self) -> None:
        """Remove the partial store, unfinished (also with an entry still open, as a signal in
        :meth:`add` leaves it): no zip directory is written, now or when the zip is collected."""
        if self.fmt == "npz":
            zf = getattr(self, "_zip", None)
            if zf is not None:
                zf.fp = None  # ZipFile.close() (and its __del__) then do nothing
            if self._fh is not None:
                with contextlib.suppress(Exception):
                    self._fh.close()
        self.partial.abort()


