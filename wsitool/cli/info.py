"""``wsitool info``: levels, metadata, associated images and decode backends of a slide (floor 9)."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import errors
from ..codec import jpegloop, openjpeg
from ..codec.backends import backend_report
from ..export import painted_tiles
from ..read.icc import profile_description
from ..slide import Slide, open_slide, pyramid_levels
from .console import SCENE_HELP, STORAGE_OPTION_HELP, err_console, fitted_console, handle_errors, storage_options
from .group import app


def _icc_summary(profile: bytes | None) -> dict | None:
    """``{"bytes": n, "description": str | None}`` of an embedded ICC profile, or None."""
    return None if profile is None else {"bytes": len(profile), "description": profile_description(profile)}


@app.command()
@handle_errors
def info(
    slide: str = typer.Argument(
        ...,
        help=("Slide file (SVS, NDPI, TIFF, OME-TIFF, DICOM, CZI), a folder holding one DICOM series, or a slide URL "
              "(http(s)://, s3://, gs://, az://)."),
    ),
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    show_phi: bool = typer.Option(
        False, "--show-phi",
        help=("Also print the properties that identify a patient, institution or specimen (DICOM PatientID, ...); "
              "hidden by default."),
    ),
    backends: bool = typer.Option(
        False, "--backends",
        help="Also show the decode backends table (what decodes which compression, and why a backend is unavailable).",
    ),
    storage_option: list[str] | None = typer.Option(
        None, "--storage-option", metavar="KEY=VALUE",
        help=STORAGE_OPTION_HELP,
    ),
    scene: int | None = typer.Option(None, "--scene", min=0, metavar="N", help=SCENE_HELP),
) -> None:
    """Show levels, tile sizes, compression, MPP, vendor, associated images (and a CZI's scenes).

    Identifying properties (patient, institution, specimen: DICOM PS3.15 E.1-1)
    are left out of the output unless --show-phi is given.

    Fits an 80-column terminal; output to a pipe or file is laid out for
    $COLUMNS columns, or 80.
    """

    with open_slide(slide, storage_options=storage_options(storage_option), scene=scene) as s:
        data = _info_data(s, show_phi)
        hidden = 0 if show_phi else len(s.identifying_properties)
        phi = {k: s.properties[k] for k in sorted(s.identifying_properties)} if show_phi else {}
        picks = {k.rsplit(".", 1)[1]: v for k, v in s.properties.items()
                 if k.startswith("wsitool.dicom.") and k.rsplit(".", 1)[1] in ("optical-path", "focal-plane")}
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    _print_info(data, hidden, phi, picks, backends)


def _level_summary(lv: Any) -> dict[str, Any]:
    """The JSON of one level in ``info --json`` (``lv``: one of :func:`~wsitool.slide.pyramid_levels`)."""
    return {
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
        "decoder": _decoder_name(lv),
        "compression_problem": lv.compression_problem,
    }


def _decoder_name(lv) -> str:
    """Who really decodes ``lv``'s tiles on a read: ``libjpeg-turbo`` (its API in the compiled
    extension: JPEG levels, and NDPI's scaled levels in place of Pillow), ``openjpeg``, or the
    level's library (:attr:`wsitool.model.TileEncoding.decoder`)."""
    if jpegloop.libjpeg_decoder(lv) is not None or (lv.decoder == "pillow" and jpegloop.libjpeg_decode()):
        return "libjpeg-turbo"
    return openjpeg.decoder_name(lv)


def _associated_sizes(s: Slide) -> dict[str, list[int] | str]:
    """``[width, height]`` of each associated image, or ``"unreadable: <why>"``."""
    assoc: dict[str, list[int] | str] = {}
    for name in s.associated_images:
        try:
            h, w = s.associated_images[name].shape[:2]
            assoc[name] = [w, h]
        except errors.WsiError as exc:
            assoc[name] = f"unreadable: {exc}"
    return assoc


def _info_data(s: Slide, show_phi: bool) -> dict[str, Any]:
    """What ``info --json`` prints of the open slide ``s`` (identifying properties only with ``show_phi``)."""
    levels = [_level_summary(lv) for lv in pyramid_levels(s)]
    assoc = _associated_sizes(s)  # (read before the remote's figures, as always)
    return {
        "path": str(s.path),  # a URL without its credentials and query
        "remote": s.remote,  # where a URL is read from, and what its open took; None for a file
        "vendor": s.vendor,
        "dimensions": list(s.dimensions),
        "level_count": s.level_count,
        "mpp_x": s.mpp_x,
        "mpp_y": s.mpp_y,
        "objective_power": s.objective_power,
        "levels": levels,
        "associated_images": assoc,
        "channels": [_channel_summary(c) for c in s.channels],  # multi-channel slides, else []
        "scenes": _scenes(s.properties),  # a CZI's scenes, else []
        "scene": _scene_read(s.properties),  # the one read (--scene), else None
        "icc_profile": _icc_summary(s.color_profile),
        "painted_tiles": _painted_tiles(s),  # wsitool export with --on-error fill, else None
        "backends": backend_report(),
        "properties": {k: v for k, v in s.properties.items()
                       if show_phi or k not in s.identifying_properties},
    }


def _print_info(data: dict[str, Any], hidden: int, phi: dict[str, str], picks: dict[str, str],
                show_backends: bool) -> None:
    """The human-readable ``wsitool info``: the header lines, then :func:`_print_info_tables`.

    ``hidden``: identifying properties left out; ``phi``: those shown (``--show-phi``);
    ``picks``: the DICOM optical path and focal plane read."""
    mpp = f"{data['mpp_x']:.4g} x {data['mpp_y']:.4g} µm/px" if data["mpp_x"] else "unknown"
    obj = f"{data['objective_power']:g}x" if data["objective_power"] else "unknown"
    out = _info_console()
    # fields are never split across lines: a line breaks between them (issue 26)
    for line in _fields([data["path"], f"vendor {data['vendor']}", f"MPP {mpp}", f"objective {obj}"],
                        out.width):
        _line(out, line)
    if data["remote"]:
        rem = data["remote"]
        _prose(out, f"read from {rem['protocol']} ({rem['size']} bytes, ETag {rem['etag'] or '-'}): "
                    f"open took {rem['open_requests']} request(s), {rem['open_bytes']} bytes")
    if data["painted_tiles"] is not None:
        _prose(out, f"painted tiles: {data['painted_tiles']} undecodable source tile(s) painted "
                    "with the background by export --on-error fill")
    icc = data["icc_profile"]
    _prose(out, f"ICC profile: {icc['description'] or '(no description)'} ({icc['bytes']} bytes)"
           if icc else "ICC profile: none")
    if picks:
        _prose(out, "DICOM: read " + ", ".join(f"{k.replace('-', ' ')} {v}" for k, v in picks.items()))
    if hidden:
        _prose(out, f"{hidden} identifying propert{'y' if hidden == 1 else 'ies'} (patient, "
                    "institution, specimen) hidden: --show-phi shows them")
    for key, value in phi.items():  # --show-phi: the identifying properties themselves
        _line(out, f"{errors.printable(key)} = {errors.printable(value)}")
    if data["scenes"]:
        listed = ", ".join(f"{c['scene']}" + (f" ({c['width']}x{c['height']} at {c['x']},{c['y']})"
                                               if "width" in c else "") for c in data["scenes"])
        which = f"reading scene {data['scene']}" if data["scene"] is not None else "reading all (--scene N: one)"
        _prose(out, f"scenes: {listed}; {which}")
    if data["channels"]:
        _table(out, "Channels (composite: each through its colour, added)",
               ["channel", "name", "colour", "from", "excitation", "emission"],
               [[str(k), errors.printable(c["name"]), "#{:02x}{:02x}{:02x}".format(*c["color"]), c["color_source"],
                 f"{c['excitation_nm']:g} nm" if c["excitation_nm"] else "-",
                 f"{c['emission_nm']:g} nm" if c["emission_nm"] else "-"]
                for k, c in enumerate(data["channels"])])
    _print_info_tables(data["path"], data["levels"], data["associated_images"], data["backends"], show_backends)


def _scenes(props: Any) -> list[dict[str, int]]:
    """A CZI's scenes (``wsitool.czi.scenes``), each with its level-0 bounds on the canvas read
    (``openslide.region[N].*``: ``x``, ``y``, ``width``, ``height``; a scene not read: its
    number only), else []."""
    out = []
    for text in filter(None, props.get("wsitool.czi.scenes", "").split(",")):
        k = int(text)
        entry = {"scene": k}
        for key in ("x", "y", "width", "height"):
            value = props.get(f"openslide.region[{k}].{key}")
            if value is not None:
                entry[key] = int(value)
        out.append(entry)
    return out


def _scene_read(props: Any) -> int | None:
    """The scene read alone (``--scene``), or None."""
    value = props.get("wsitool.czi.scene")
    return None if value is None else int(value)


def _channel_summary(channel) -> dict:
    """The JSON of one :class:`~wsitool.model.Channel` (its lookup table left out)."""
    return {"name": channel.name, "description": channel.description,
            "excitation_nm": channel.excitation_nm, "emission_nm": channel.emission_nm,
            "color": list(channel.color), "color_source": channel.color_source}


def _info_console() -> Console:
    """The console ``info`` prints to (:func:`.console.fitted_console`)."""
    return fitted_console()


def _line(out: Console, text: str, style: str = "") -> None:
    """One output line, as is: rich neither wraps it nor pads it (a value longer
    than the terminal is left whole, for the terminal to fold)."""
    text = escape(errors.printable(text.rstrip()))
    out.print(f"[{style}]{text}[/]" if style and text else text, highlight=False, soft_wrap=True)


def _prose(out: Console, text: str) -> None:
    """A sentence, wrapped between words to the console's width."""
    for line in textwrap.wrap(text, width=max(out.width, 20), break_long_words=False,
                              break_on_hyphens=False) or [""]:
        _line(out, line)


def _fields(fields: list[str], width: int, sep: str = "  ") -> list[str]:
    """``fields`` joined by ``sep`` into lines of at most ``width`` columns, broken
    between fields only (a field wider than ``width`` gets a line of its own)."""
    lines: list[str] = []
    cur = ""
    for f in fields:
        if cur and len(cur) + len(sep) + len(f) > width:
            lines.append(cur)
            cur = f
        else:
            cur = f"{cur}{sep}{f}" if cur else f
    if cur:
        lines.append(cur)
    return lines


def _table(out: Console, title: str, headers: list[str], rows: list[list[str]]) -> None:
    """A plain-text table that fits ``out.width`` without breaking a value: columns
    two spaces apart (one where two do not fit), no trailing spaces; where even
    that is too wide, each row becomes ``header value`` fields wrapped between
    fields."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    _line(out, title, "bold")
    for gap in (2, 1):
        if sum(widths) + gap * (len(widths) - 1) <= out.width:
            pad = " " * gap
            _line(out, pad.join(h.ljust(w) for h, w in zip(headers, widths, strict=True)), "bold")
            for r in rows:
                _line(out, pad.join(v.ljust(w) for v, w in zip(r, widths, strict=False)))
            return
    for r in rows:
        for i, line in enumerate(_fields([f"{h} {v}" for h, v in zip(headers, r, strict=False)], out.width - 2)):
            _line(out, ("  " if i else "") + line)


def _print_stripped(out: Console, renderable) -> None:
    """A rich renderable (wrapping prose cells) printed without trailing spaces."""
    with out.capture() as cap:
        out.print(renderable)
    text = re.sub(r"[ \t]+((?:\x1b\[[0-9;]*m)*)$", r"\1", cap.get(), flags=re.M)
    out.file.write(text)
    out.file.flush()


def _print_info_tables(slide: str, levels: list[dict[str, Any]], assoc: dict[str, list[int] | str],
                       backend_rows: list[dict[str, Any]], show_backends: bool) -> None:
    """The human-readable part of ``wsitool info``: levels, associated images, backends.

    Every line fits the console's width (80 columns in a pipe without $COLUMNS)
    and no value is broken across lines (:func:`_table`)."""
    out = _info_console()
    rows = []
    for lv in levels:
        comp = lv["compression"] + (" unsupported" if lv["compression_problem"] else "")
        rows.append([
            str(lv["level"]), f"{lv['width']}x{lv['height']}", f"{lv['downsample']:.4g}",
            f"{lv['tile_width']}x{lv['tile_height']}" + ("" if lv["tiled"] else " strips"),
            comp, f"{lv['photometric']} {lv['samples']}x{lv['dtype']}", lv["decoder"],
        ])
    _table(out, "Levels (sizes: width x height)",
           ["level", "size", "downsample", "tile", "compression", "pixels", "decoder"], rows)
    for lv in levels:
        if lv["compression_problem"]:
            err_console.print(f"[yellow]wsitool: warning:[/] {escape(str(slide))}: level {lv['level']}: "
                              f"{escape(lv['compression_problem'])}: its tiles cannot be read "
                              "(reads fail with exit 3, unsupported format)", highlight=False,
                              soft_wrap=True)
    if assoc:
        _table(out, "Associated images", ["name", "width x height"],
               [[name, f"{size[0]} x {size[1]}" if isinstance(size, list) else str(size)]
                for name, size in assoc.items()])
    if show_backends:
        bt = Table(title="Decode backends", title_justify="left", box=None, padding=(0, 1),
                   pad_edge=False, header_style="bold underline", title_style="bold")
        for h in ("backend", "available", "decodes", "detail"):
            bt.add_column(h, min_width=len(h), overflow="fold")
        for b in backend_rows:
            bt.add_row(b["name"], "yes" if b["available"] else "no", b["decodes"], b.get("detail", ""))
        _print_stripped(out, bt)
    else:
        parts = []
        for device in ("cpu", "cuda"):
            on_device = [b for b in backend_rows if b.get("device") == device]
            if not on_device:
                continue
            n = sum(1 for b in on_device if b["available"])
            part = f"{device.upper()} {n}/{len(on_device)}"
            why = next((b.get("detail", "") for b in on_device if not b["available"]), "")
            if n == 0 and why:
                part += f" ({why.split(':')[0]})"
            parts.append(part)
        _prose(out, f"Decode backends: {', '.join(parts)}, see --backends")


def _painted_tiles(slide) -> int | None:
    """The painted-tile count an ``--on-error fill`` export recorded (wsitool.export.painted_tiles)."""

    return painted_tiles(slide)


