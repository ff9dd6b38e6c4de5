"""``wsitool info``: levels, metadata, associated images and decode backends of a slide (floor 9)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import errors
from ..codec.backends import backend_report
from ..export import painted_tiles
from ..read.icc import profile_description
from ..slide import open_slide
from .console import console, err_console, handle_errors, shown
from .group import app


def _icc_summary(profile: bytes | None) -> dict | None:
    """``{"bytes": n, "description": str | None}`` of an embedded ICC profile, or None."""
    return None if profile is None else {"bytes": len(profile), "description": profile_description(profile)}


@app.command()
@handle_errors
def info(
    slide: Path = typer.Argument(..., help="Slide file (SVS, NDPI, TIFF, OME-TIFF, DICOM), or a folder holding one DICOM series."),
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    show_phi: bool = typer.Option(False, "--show-phi", help="Also print the properties that identify a patient, institution or specimen (DICOM PatientID, ...); hidden by default."),
    backends: bool = typer.Option(False, "--backends", help="Also show the decode backends table (what decodes which compression, and why a backend is unavailable)."),
) -> None:
    """Show levels, tile sizes, compression, MPP, vendor and associated images.

    Identifying properties (patient, institution, specimen: DICOM PS3.15 E.1-1)
    are left out of the output unless --show-phi is given.

    Fits an 80-column terminal; output to a pipe or file is laid out for
    $COLUMNS columns, or 80.
    """

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
                "compression_problem": lv.compression_problem,
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
            "icc_profile": _icc_summary(s.color_profile),
            "painted_tiles": _painted_tiles(s),  # wsitool export with --on-error fill, else None
            "backends": backend_report(),
            "properties": {k: v for k, v in s.properties.items()
                           if show_phi or k not in s.identifying_properties},
        }
        hidden = 0 if show_phi else len(s.identifying_properties)
        phi = {k: s.properties[k] for k in sorted(s.identifying_properties)} if show_phi else {}
        picks = {k.rsplit(".", 1)[1]: v for k, v in s.properties.items()
                 if k.startswith("wsitool.dicom.") and k.rsplit(".", 1)[1] in ("optical-path", "focal-plane")}
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    mpp = f"{data['mpp_x']:.4g} x {data['mpp_y']:.4g} µm/px" if data["mpp_x"] else "unknown"
    obj = f"{data['objective_power']:g}x" if data["objective_power"] else "unknown"
    _info_console().print(f"[bold]{escape(str(slide))}[/]  vendor [cyan]{escape(str(data['vendor']))}[/]  "
                          f"MPP {mpp}  objective {obj}")
    if data["painted_tiles"] is not None:
        _info_console().print(f"{'[yellow]' if data['painted_tiles'] else ''}painted tiles: {data['painted_tiles']} "
                      "undecodable source tile(s) painted with the background by export --on-error fill",
                      highlight=False)
    icc = data["icc_profile"]
    _info_console().print(f"ICC profile: {escape(icc['description'] or '(no description)')} ({icc['bytes']} bytes)"
                          if icc else "ICC profile: none", highlight=False)
    if picks:
        _info_console().print("DICOM: read " + ", ".join(f"{k.replace('-', ' ')} {v}" for k, v in picks.items()),
                              highlight=False)
    if hidden:
        _info_console().print(f"{hidden} identifying propert{'y' if hidden == 1 else 'ies'} (patient, "
                              "institution, specimen) hidden: --show-phi shows them", highlight=False)
    for key, value in phi.items():  # --show-phi: the identifying properties themselves
        _info_console().print(f"{shown(key)} = {shown(value)}", highlight=False)
    _print_info_tables(slide, levels, assoc, data["backends"], backends)


def _info_console() -> Console:
    """The console ``info`` prints to: the terminal's width, else $COLUMNS, else 80."""
    if console.is_terminal:
        return console
    try:
        width = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        width = 0
    return Console(file=sys.stdout, width=width if width > 0 else 80)


def _print_info_tables(slide: Path, levels: list, assoc: dict, backend_rows: list,
                       show_backends: bool) -> None:
    """The human-readable part of ``wsitool info``: levels, associated images, backends."""
    out = _info_console()

    def table(title: str, *headers: str) -> Table:
        t = Table(title=title, title_justify="left", box=None, padding=(0, 1), pad_edge=False,
                  header_style="bold underline", title_style="bold")
        for h in headers:  # headers are never cut: a column is at least as wide as its header
            t.add_column(h, min_width=len(h), overflow="fold")
        return t

    lt = table("Levels (sizes: width x height)", "level", "size", "downsample", "tile",
               "compression", "pixels", "decoder")
    for lv in levels:
        comp = escape(lv["compression"])
        if lv["compression_problem"]:
            comp = f"[bold red]{comp} unsupported[/]"
        lt.add_row(
            str(lv["level"]), f"{lv['width']}x{lv['height']}", f"{lv['downsample']:.4g}",
            f"{lv['tile_width']}x{lv['tile_height']}" + ("" if lv["tiled"] else " strips"),
            comp, f"{lv['photometric']} {lv['samples']}x{lv['dtype']}", lv["decoder"],
        )
    out.print(lt)
    for lv in levels:
        if lv["compression_problem"]:
            err_console.print(f"[yellow]wsitool: warning:[/] {escape(str(slide))}: level {lv['level']}: "
                              f"{escape(lv['compression_problem'])}: its tiles cannot be read "
                              "(reads fail with exit 3, unsupported format)", highlight=False,
                              soft_wrap=True)
    if assoc:
        at = table("Associated images", "name", "width x height")
        for name, size in assoc.items():
            at.add_row(escape(name), f"{size[0]} x {size[1]}" if isinstance(size, list) else escape(size))
        out.print(at)
    if show_backends:
        bt = table("Decode backends", "backend", "available", "decodes", "detail")
        for b in backend_rows:
            bt.add_row(b["name"], "yes" if b["available"] else "no", b["decodes"], b.get("detail", ""))
        out.print(bt)
    else:
        parts = []
        for device in ("cpu", "cuda"):
            rows = [b for b in backend_rows if b.get("device") == device]
            if not rows:
                continue
            n = sum(1 for b in rows if b["available"])
            part = f"{device.upper()} {n}/{len(rows)}"
            why = next((b.get("detail", "") for b in rows if not b["available"]), "")
            if n == 0 and why:
                part += f" ({why.split(':')[0]})"
            parts.append(part)
        out.print(escape(f"Decode backends: {', '.join(parts)}, see --backends"),
                  highlight=False)


def _painted_tiles(slide) -> Optional[int]:
    """The painted-tile count an ``--on-error fill`` export recorded (wsitool.export.painted_tiles)."""

    return painted_tiles(slide)


