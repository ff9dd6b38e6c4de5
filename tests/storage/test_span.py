"""Several files read as one byte source (a DICOM concatenation)."""

from __future__ import annotations

import pytest

from wsitool.storage import LocalFile
from wsitool.storage.span import Span


def test_reads_stay_inside_one_part_and_refuse_bad_ranges(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(bytes(range(10)))  # distinct bytes: a wrong offset inside a part shows
    b.write_bytes(bytes(range(100, 106)))
    with Span([LocalFile(a), LocalFile(b)]) as span:
        assert span.size == 16
        assert span.read(8, 2) == bytes([8, 9]) and span.read(10, 3) == bytes([100, 101, 102])
        assert span.read(12, 2) == bytes([102, 103])  # an offset inside the second part
        assert span.read(14, 10) == bytes([104, 105])  # a short read at the end, as a file gives
        with pytest.raises(OSError, match="crosses the end of part 0"):
            span.read(8, 4)  # a frame never spans two files
        with pytest.raises(OSError, match="negative offset"):
            span.read(-1, 2)
        buf = bytearray(3)
        assert span.readinto(11, memoryview(buf)) == 3 and bytes(buf) == bytes([101, 102, 103])
        assert span.readinto(3, memoryview(buf)) == 3 and bytes(buf) == bytes([3, 4, 5])
        with pytest.raises(OSError, match="crosses the end of part 0"):
            span.readinto(9, memoryview(buf))  # readinto keeps the same rule
