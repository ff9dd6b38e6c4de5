"""Export a slide, or a region of it, as a new tiled pyramid: Aperio-style TIFF/SVS, OME-TIFF, Deep Zoom (floor 6).

Entry point: :func:`export_pyramid` (CLI: ``wsitool export-pyramid``, ``wsitool export-many``), its
options checked once in :class:`ExportOptions` (:mod:`.options`).  The
package streams, never holding a whole level: :mod:`.source` reads level-0
strips from the slide, :mod:`.downsample` halves them into the lower levels
with a box filter, :mod:`.encode` encodes tiles on a thread pool, and one writer
per format (:mod:`.tiff`, :mod:`.dzi`) writes them in order through
:mod:`wsitool.ground.outputs`; :mod:`.plan` holds the level plan and the memory bound,
:mod:`.associated` the thumbnail, label and macro carried along, :mod:`.image`
the single-image writer used by ``read-region``.
"""

from .associated import PAINTED_KEY, painted_tiles
from .image import IMAGE_EXTENSIONS, check_image_extension, write_image
from .options import ExportOptions
from .plan import COMPRESSIONS, FORMATS, ON_ERROR, ExportResult, memory_bound, pyramid_dimensions, strip_rows
from .pyramid import export_pyramid

__all__ = ["ExportResult", "ExportOptions", "export_pyramid", "pyramid_dimensions", "memory_bound", "strip_rows",
           "write_image", "check_image_extension", "IMAGE_EXTENSIONS",
           "FORMATS", "COMPRESSIONS", "ON_ERROR", "painted_tiles", "PAINTED_KEY"]
