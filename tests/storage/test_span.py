"""Several files read as one byte source (a DICOM concatenation)."""

from __future__ import annotations

import pytest

from wsitool.storage import LocalFile
from wsitool.storage.span import Span


def test_reads_stay_inside_one_part_and_refuse_bad_ranges(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"A" * 10)
    b.write_bytes(b"B" * 6)
    with Span([LocalFile(a), LocalFile(b)]) as span:
        assert span.size == 16
        assert span.read(8, 2) == b"AA" and span.read(10, 3) == b"BBB"
        assert span.read(14, 10) == b"BB"  # a short read at the end, as a file gives
        with pytest.raises(OSError, match="crosses the end of part 0"):
            span.read(8, 4)  # a frame never spans two files
        with pytest.raises(OSError, match="negative offset"):
            span.read(-1, 2)
        buf = bytearray(3)
        assert span.readinto(11, memoryview(buf)) == 3 and bytes(buf) == b"BBB"
