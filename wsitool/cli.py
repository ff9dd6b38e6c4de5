"""Command-line interface: a thin typer layer over the Python API.

Each command parses its arguments, calls the API and formats the result with
rich.  Expected errors print one line, ``wsitool: error: <file>: <cause>``,
and exit with the code of their class (:data:`EXIT_CODES`); no traceback.

Exit codes:
    0 success; 1 other wsitool error; 2 bad command-line usage;
    3 unsupported format; 4 corrupt file; 5 invalid region request;
    6 resource limit exceeded; 7 tile decode error; 8 no CUDA device;
    9 file not found or other I/O error; 130 interrupted (Ctrl-C).
    ``wsitool stress`` adds its own verdict codes (see its help).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import typer
from rich.console import Console
from rich.table import Table

from . import errors

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Read, convert and stress-test tiled pyramidal whole-slide images (SVS, TIFF, OME-TIFF).",
)
console = Console()
err_console = Console(stderr=True)

EXIT_CODES: list[tuple[type[BaseException], int]] = [
    (errors.UnsupportedFormatError, 3),
    (errors.CorruptFileError, 4),
    (errors.InvalidRegionError, 5),
    (errors.ResourceLimitError, 6),
    (errors.TileDecodeError, 7),
    (errors.DeviceUnavailableError, 8),
    (errors.WsiError, 1),
    (FileNotFoundError, 9),
    (OSError, 9),
]


def exit_code_for(exc: BaseException) -> int:
    """The documented exit code of an exception (1 if not a known class)."""
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return 1


def fail(message: str, code: int) -> "typer.Exit":
    """Print one error line to stderr and return the Exit to raise."""
    err_console.print(f"[bold red]wsitool: error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def handle_errors(func: Callable) -> Callable:
    """Decorator mapping expected exceptions to one line and an exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except typer.Exit:
            raise
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None
        except (errors.WsiError, OSError) as exc:
            if isinstance(exc, OSError) and not isinstance(exc, errors.WsiError):
                where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
                message = f"{where}{exc.strerror or exc}"
            else:
                message = str(exc)
            raise fail(message, exit_code_for(exc)) from None

    return wrapper


def _apply_max_pixels(max_pixels: Optional[int]) -> None:
    if max_pixels is not None:
        from .settings import set_limits

        if max_pixels <= 0:
            raise fail("--max-pixels must be positive", 2)
        set_limits(max_region_pixels=max_pixels, max_region_bytes=max(max_pixels * 8, 2**31))


# ---------------------------------------------------------------------- info


@app.command()
@handle_errors
def info(
    slide: Path = typer.Argument(..., help="Slide file (SVS, TIFF, OME-TIFF)."),
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
) -> None:
    """Show levels, tile sizes, compression, MPP, vendor and associated images."""
    from .gpu import backend_report
    from .slide import open_slide

    with open_slide(slide) as s:
        levels = [
            {
                "level": lv.index,
                "width": lv.width,
                "height": lv.height,
                "downsample": lv.downsample,
                "tile_width": lv.tile_width,
                "tile_height": lv.tile_height,
                "tiled": lv.tiled,
                "compression": lv.compression,
                "photometric": lv.photometric,
                "samples": lv.samples,
                "dtype": str(lv.dtype),
                "decoder": lv.decoder,
            }
            for lv in s.levels
        ]
        assoc = {}
        for name in s.associated_images:
            try:
                h, w = s.associated_images[name].shape[:2]
                assoc[name] = [w, h]
            except errors.WsiError as exc:
                assoc[name] = f"unreadable: {exc}"
        data = {
            "path": str(slide),
            "vendor": s.vendor,
            "dimensions": list(s.dimensions),
            "level_count": s.level_count,
            "mpp_x": s.mpp_x,
            "mpp_y": s.mpp_y,
            "objective_power": s.objective_power,
            "levels": levels,
            "associated_images": assoc,
            "backends": backend_report(),
            "properties": dict(s.properties),
        }
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    mpp = f"{data['mpp_x']:.4g} x {data['mpp_y']:.4g} µm/px" if data["mpp_x"] else "unknown"
    obj = f"{data['objective_power']:g}x" if data["objective_power"] else "unknown"
    console.print(f"[bold]{slide}[/]  vendor [cyan]{data['vendor']}[/]  MPP {mpp}  objective {obj}")
    table = Table(title="Levels")
    for col in ("level", "dimensions", "downsample", "tile", "compression", "photometric",
                "samples", "decoder"):
        table.add_column(col)
    for lv in levels:
        table.add_row(
            str(lv["level"]), f"{lv['width']} x {lv['height']}", f"{lv['downsample']:.4f}",
            f"{lv['tile_width']} x {lv['tile_height']}" + ("" if lv["tiled"] else " (strips)"),
            lv["compression"], lv["photometric"], f"{lv['samples']} x {lv['dtype']}", lv["decoder"],
        )
    console.print(table)
    if assoc:
        at = Table(title="Associated images")
        at.add_column("name")
        at.add_column("size")
        for name, size in assoc.items():
            at.add_row(name, f"{size[0]} x {size[1]}" if isinstance(size, list) else size)
        console.print(at)
    bt = Table(title="Decode backends")
    bt.add_column("backend")
    bt.add_column("available")
    bt.add_column("decodes")
    for b in data["backends"]:
        bt.add_row(b["name"], "yes" if b["available"] else "no", b["decodes"])
    console.print(bt)


# ---------------------------------------------------------------------- read-region


def write_image(path: Path, array, *, overwrite: bool = True) -> None:
    """Write ``array`` ((h, w, c) numpy) to PNG, TIFF or .npy by extension, atomically.

    The data goes to a temporary file in the destination folder, renamed over
    ``path`` only when complete.  Raises ``ValueError`` for an unknown extension.
    """
    import numpy as np

    ext = path.suffix.lower()
    if ext not in (".png", ".tif", ".tiff", ".npy"):
        raise ValueError(f"{path}: unknown output extension {ext!r} (use .png, .tif, .tiff or .npy)")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path}: exists")
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        if ext == ".npy":
            with open(tmp, "wb") as fh:
                np.save(fh, array)
        elif ext == ".png":
            import imagecodecs

            arr = array
            if arr.ndim == 3 and arr.shape[2] not in (1, 2, 3, 4):
                arr = arr[..., :3]
            with open(tmp, "wb") as fh:
                fh.write(imagecodecs.png_encode(np.ascontiguousarray(arr)))
        else:
            import tifffile

            photometric = "rgb" if array.ndim == 3 and array.shape[2] in (3, 4) else "minisblack"
            extrasamples = ("unassalpha",) if array.ndim == 3 and array.shape[2] == 4 else None
            tifffile.imwrite(tmp, array, photometric=photometric, extrasamples=extrasamples,
                             compression="zlib")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@app.command("read-region")
@handle_errors
def read_region_cmd(
    slide: Path = typer.Argument(..., help="Slide file."),
    location: Tuple[int, int] = typer.Option(
        (0, 0), "--location", "-l", help="X Y of the top-left pixel, level-0 pixels."
    ),
    level: int = typer.Option(0, "--level", "-L", help="Pyramid level (0 = full resolution)."),
    size: Tuple[int, int] = typer.Option(..., "--size", "-s", help="WIDTH HEIGHT in pixels of LEVEL."),
    output: Path = typer.Option(..., "--output", "-o", help="Output file: .png, .tif/.tiff or .npy."),
    mode: str = typer.Option("rgba", "--mode", help="rgba (default), rgb, or raw (native samples; .npy/.tif)."),
    threads: Optional[int] = typer.Option(None, "--threads", "-t", help="Decode threads (default: CPU count)."),
    on_error: str = typer.Option("raise", "--on-error", help="raise (default) or fill corrupt tiles with background."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    max_pixels: Optional[int] = typer.Option(None, "--max-pixels", help="Refuse regions larger than this many pixels."),
) -> None:
    """Read a region (OpenSlide semantics) and write it to an image file."""
    from .slide import open_slide

    _apply_max_pixels(max_pixels)
    ext = output.suffix.lower()
    if ext not in (".png", ".tif", ".tiff", ".npy"):
        raise fail(f"{output}: unknown output extension {ext!r} (use .png, .tif, .tiff or .npy)", 2)
    import warnings

    from .region import TileWarning

    with open_slide(slide) as s, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TileWarning)
        arr = s.read_region(location, level, size, mode=mode, threads=threads, on_error=on_error,
                            device=device)
    filled = [w for w in caught if issubclass(w.category, TileWarning)]
    for w in filled:  # --on-error fill: one line per bad tile, then the count
        err_console.print(f"[yellow]wsitool: warning:[/] {w.message}", highlight=False, soft_wrap=True)
    if filled:
        err_console.print(f"[yellow]wsitool: warning:[/] {len(filled)} bad tile(s) filled with background",
                          highlight=False, soft_wrap=True)
    if device != "cpu":
        arr = arr.get()
    write_image(output, arr)
    console.print(
        f"wrote {output} ({arr.shape[1]} x {arr.shape[0]} x {arr.shape[2]} {arr.dtype}) "
        f"from {slide} level {level} at ({location[0]}, {location[1]})",
        highlight=False,
    )


def main(argv: Optional[List[str]] = None) -> None:
    """Console-script entry point."""
    logging.getLogger("tifffile").setLevel(logging.ERROR)
    app(args=argv, prog_name="wsitool")


if __name__ == "__main__":  # pragma: no cover
    main()
