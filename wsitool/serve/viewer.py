"""The HTML pages: ``/`` (the slide list) and ``/view/{id}`` (OpenSeadragon on the IIIF service).

OpenSeadragon is not part of wsitool: the page loads it from ``script_url``
(the pinned jsDelivr release by default, or ``/viewer.js`` when the server was
given a local file).  When the script cannot be loaded (an offline network
cannot reach the CDN) the viewer pane shows a message saying so and naming
``--viewer-js`` (element ``#viewer-missing``) instead of staying blank.  The
viewer page exposes ``window.viewer`` (the OpenSeadragon viewer) and
``window.wsitoolTiles`` (tiles loaded so far) for scripted checks.
"""

from __future__ import annotations

import html
import json
from urllib.parse import quote

from .config import OPENSEADRAGON_VERSION

__all__ = ["index_page", "view_page", "slide_facts"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 0; }
main { padding: 1em 2em; }
table { border-collapse: collapse; }
td, th { padding: 0.2em 0.8em; text-align: left; border-bottom: 1px solid #ddd; font-size: 90%; }
#layout { display: flex; height: 100vh; }
#viewer { flex: 1; background: #222; }
#side { width: 22em; overflow: auto; padding: 0.5em 1em; font-size: 90%; }
#viewer-missing { color: #eee; padding: 2em; max-width: 40em; line-height: 1.4; }
#viewer-missing code { color: #fc6; }
"""

_MAIN_PROPERTIES = ("openslide.vendor", "openslide.objective-power", "openslide.mpp-x",
                    "openslide.mpp-y", "openslide.comment", "aperio.AppMag", "aperio.Date",
                    "aperio.ScanScope ID", "tiff.Make", "tiff.Model", "tiff.Software",
                    "tiff.DateTime", "ome.PhysicalSizeX", "ome.PhysicalSizeY")


def slide_facts(slide) -> list[tuple[str, str]]:
    """``(label, value)`` rows shown beside a slide: size, levels, MPP, objective, main properties."""
    w, h = slide.dimensions
    mpp = slide.mpp
    rows = [("Size", f"{w} x {h} px"),
            ("Levels", ", ".join(f"{a}x{b}" for a, b in slide.level_dimensions)),
            ("MPP", f"{mpp[0]:.4g} x {mpp[1]:.4g} \u00b5m/px" if mpp else "unknown"),
            ("Objective", f"{slide.objective_power:g}x" if slide.objective_power else "unknown"),
            ("Vendor", str(slide.vendor))]
    props = slide.properties
    for key in _MAIN_PROPERTIES:
        if key in props and key not in ("openslide.vendor",):
            value = str(props[key])
            rows.append((key, value if len(value) <= 200 else value[:200] + "\u2026"))
    return rows


def index_page(entries) -> str:
    """The slide list: one row per slide with links to its viewer, info.json and .dzi.

    Listing opens no slide: size and levels are shown for the slides opened so far
    (:attr:`~.registry.SlideEntry.facts`), else left blank.
    """
    rows = []
    for e in entries:
        q = quote(e.id, safe="")
        size, levels = (f"{e.facts[0]} x {e.facts[1]}", str(e.facts[2])) if e.facts else ("", "")
        rows.append(f"<tr><td><a href=\"/view/{q}\">{html.escape(e.id)}</a></td><td>{size}</td>"
                    f"<td>{levels}</td><td><a href=\"/iiif/3/{q}/info.json\">info.json</a>"
                    f"</td><td><a href=\"/dz/{q}.dzi\">dzi</a></td></tr>")
    body = "\n".join(rows) or "<tr><td colspan=5>no slides</td></tr>"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>wsitool serve</title>
<style>{_STYLE}</style></head>
<body><main><h1>Slides</h1>
<table><tr><th>Slide</th><th>Size</th><th>Levels</th><th>IIIF</th><th>Deep Zoom</th></tr>
{body}
</table><p><a href="/status">status</a></p></main></body></html>
"""


def view_page(entry, slide, script_url: str, images_url: str | None) -> str:
    """The viewer page of one slide (``entry``, its open ``slide``): OpenSeadragon on
    ``/iiif/3/{id}/info.json`` and the slide's facts."""
    q = quote(entry.id, safe="")
    facts = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                      for k, v in slide_facts(slide))
    options = {"id": "viewer", "tileSources": f"/iiif/3/{q}/info.json", "showNavigator": True,
               "crossOriginPolicy": "Anonymous"}
    if images_url:
        options["prefixUrl"] = images_url
    else:
        options["showNavigationControl"] = False
    missing = (f"<div id=\"viewer-missing\" hidden><p><strong>The viewer could not be loaded.</strong> "
               f"This page needs OpenSeadragon from <code>{html.escape(script_url)}</code>, which the "
               f"browser could not fetch (an offline network cannot reach the CDN).</p><p>Start the "
               f"server with <code>--viewer-js PATH</code> naming a local copy of "
               f"<code>openseadragon.min.js</code> (<code>npm install openseadragon@{OPENSEADRAGON_VERSION}"
               f"</code>, then <code>node_modules/openseadragon/build/openseadragon/"
               f"openseadragon.min.js</code>) and the server serves it itself.</p><p>The IIIF and Deep "
               f"Zoom routes work without it: <a href=\"/iiif/3/{q}/info.json\">info.json</a>.</p></div>")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>{html.escape(entry.id)} - wsitool serve</title>
<style>{_STYLE}</style></head>
<body><div id="layout"><div id="viewer">{missing}</div>
<div id="side"><p><a href="/">all slides</a></p><h2>{html.escape(entry.id)}</h2>
<table>{facts}</table></div></div>
<script src="{html.escape(script_url)}"></script>
<script>
window.wsitoolTiles = 0;
if (typeof OpenSeadragon === "undefined") {{
  document.getElementById("viewer-missing").hidden = false;
}} else {{
  window.viewer = OpenSeadragon({json.dumps(options)});
  window.viewer.addHandler("tile-loaded", function () {{ window.wsitoolTiles += 1; }});
}}
</script></body></html>
"""
