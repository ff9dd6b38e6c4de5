"""DICOM WSI export: a slide as one VL Whole Slide Microscopy Image series, one file per instance (floor 6).

Entry point: :func:`~wsitool.export.export_pyramid` with ``format="dicom"`` (CLI:
``wsitool export-pyramid SLIDE OUTDIR --format dicom``), which calls
:func:`export_dicom`.  The pieces, one concept each:

* :mod:`.series`: which instances, in which order, into a folder made atomically;
* :mod:`.frames`: the frames' transfer syntax and photometric interpretation,
  passed through (``compression="copy"``) or re-encoded;
* :mod:`.modules`: the attributes of an instance, module by module;
* :mod:`.metadata`: the user's patient / study / series / specimen / equipment
  attributes (a DICOM JSON file, ``KEYWORD=VALUE`` pairs, documented defaults);
* :mod:`.writer`: one instance file, with the Basic or Extended Offset Table;
* :mod:`.framestream`: its frames as items, streamed in batched writes.
"""

from .frames import FrameCoding, passthrough_coding, reencode_coding
from .metadata import EQUIPMENT_DEFAULTS
from .series import export_dicom
from .writer import offset_table

__all__ = ["export_dicom", "FrameCoding", "passthrough_coding", "reencode_coding", "offset_table",
           "EQUIPMENT_DEFAULTS"]
