"""A remote TIFF's tile tables are read when their level is first used (wsitool.formats.tiff.tables).

The pyramid of every shared TIFF sample, parsed as a remote slide is (a local file whose
source says ``remote``, so no server is needed here; tests/remote reads them over HTTP
and S3), equals the local parse: tile tables, associated images, properties with
``openslide.quickhash-1``.  Crafted files pin the walk: BigTIFF, big-endian, SubIFDs,
a cyclic IFD chain, tables past the end of the file, NDPI.
"""

from __future__ import annotations

import dataclasses
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import tifffile

from wsitool.errors import CorruptFileError
from wsitool.formats.tiff import open_pyramid
from wsitool.formats.tiff.tables import EAGER, DeferredTables, Table, scan
from wsitool.storage import ByteSource, LocalFile, SourceFile

from helpers import present, repo_samples, tiff_samples


class RemoteLike(LocalFile):
    """A local file read as a remote source is: its metadata deferred, parsed through the
    source's own reads (not a file of its own), and every read logged."""

    defer_metadata = True

    def open_file(self, blank=()):
        return ByteSource.open_file(self, blank)  # (a view of the source, as a remote one gives)

    def __init__(self, path):
        super().__init__(path)
        self.log: list[tuple[int, int]] = []

    def read(self, offset, count):
        self.log.append((offset, count))
        return super().read(offset, count)

    def readinto(self, offset, buffer):
        n = super().readinto(offset, buffer)
        self.log.append((offset, n))
        return n


def _pages(path: Path) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tif = tifffile.TiffFile(path)
        pages = []
        for page in tif.pages:
            pages.append(page)
            if getattr(page, "subifds", None):
                pages.extend(tifffile.TiffPages(page))
    return tif, [p for p in pages if isinstance(p, tifffile.TiffPage)]


def _overlaps(log, start, nbytes):
    return any(o < start + nbytes and start < o + n for o, n in log)


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in tiff_samples() + repo_samples()
                                  if p.suffix != ".ndpi"])
def test_deferred_tables_equal_what_tifffile_reads(path):
    if not present([path]):
        pytest.skip(f"{path.name} is absent")
    source = LocalFile(path)
    try:
        tables = scan(source)  # never raises for a broken file: tifffile's parse says why
        try:
            tif, pages = _pages(path)
        except tifffile.TiffFileError:
            return
        with tif:
            for page in pages:
                for code in (324, 325):
                    tag = page.tags.get(code)
                    if tables.table(tag) is not None:
                        assert np.array_equal(tables.values(tag), np.asarray(tag.value, np.uint64).ravel())
    finally:
        source.close()


def _same(image):
    """An associated image without tifffile's page object (each parse has its own)."""
    return repr(dataclasses.replace(image, encoding=dataclasses.replace(image.encoding, page=None)))


def _pyramids(path):
    local, remote = LocalFile(path), RemoteLike(path)
    eager, lazy = open_pyramid(local), open_pyramid(remote)
    return local, remote, eager, lazy


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in tiff_samples() + repo_samples()])
def test_a_remote_parse_equals_the_local_one(path):
    if not present([path]):
        pytest.skip(f"{path.name} is absent")
    try:
        local, remote, eager, lazy = _pyramids(path)
    except Exception as exc:  # a broken sample: the same error both ways
        with pytest.raises(type(exc)):
            open_pyramid(RemoteLike(path))
        return
    try:
        assert len(eager.levels) == len(lazy.levels)
        assert dict(lazy.properties) == dict(eager.properties)  # quickhash from the real tables
        for name, image in eager.associated.items():
            assert _same(lazy.associated[name]) == _same(image)
        opened = list(remote.log)
        # openslide.quickhash-1 hashes the smallest level among the top-level IFDs (not
        # SubIFDs): which tiles, and whether at most 5 MiB, is decided at open from its tables
        with tifffile.TiffFile(path) as tif:
            top_ifds = {page.offset for page in tif.pages}
        top = [a.width for a in eager.levels if a.encoding.page is not None and a.encoding.page.offset in top_ifds]
        hashed = min(top, default=-1)
        for a, b in zip(eager.levels, lazy.levels, strict=True):
            tag = a.encoding.page.tags.get(324) if a.encoding.page is not None else None
            if a.width != hashed and tag is not None and int(tag.count) > 2:  # (else in its IFD entry)
                # nothing else of a deferred table is read at open
                assert not _overlaps(opened, int(tag.valueoffset), int(tag.count) * 4), a.index
            assert np.array_equal(b.tiles.offsets, a.tiles.offsets)
            assert np.array_equal(b.tiles.bytecounts, a.tiles.bytecounts)
            assert b.tiles.loaded
    finally:
        for p in (eager, lazy):
            if p.release:
                p.release()
        local.close()
        remote.close()


def test_level_tables_load_on_first_use_only(tmp_path):
    path = tmp_path / "p.tif"
    data = np.random.default_rng(1).integers(0, 255, (2048, 2048), np.uint8)
    with tifffile.TiffWriter(path) as tw:
        tw.write(data, tile=(64, 64), subfiletype=0)
        tw.write(data[::2, ::2], tile=(64, 64), subfiletype=1)
    source = RemoteLike(path)
    pyramid = open_pyramid(source)
    try:
        levels = pyramid.levels
        assert [lv.tiles.loaded for lv in levels] == [False, False]
        table = scan(source).table(levels[0].encoding.page.tags[324])
        assert table is not None and table.count == 32 * 32
        assert not _overlaps(source.log, table.offset, table.nbytes)  # level 0's offsets: never read
        before = len(source.log)
        assert int(levels[0].tiles.bytecounts[5]) > 0
        assert levels[0].tiles.loaded and not levels[1].tiles.loaded
        assert _overlaps(source.log[before:], table.offset, table.nbytes)
        assert np.array_equal(levels[0].tiles.offsets, tifffile.TiffFile(path).pages[0].dataoffsets)
    finally:
        pyramid.release()
        source.close()


@pytest.mark.parametrize("bigtiff", [False, True])
@pytest.mark.parametrize("order", ["<", ">"])
def test_subifds_bigtiff_and_byte_orders(tmp_path, bigtiff, order):
    path = tmp_path / "s.tif"
    data = np.arange(512 * 512 * 3, dtype=np.uint8).reshape(512, 512, 3)
    with tifffile.TiffWriter(path, bigtiff=bigtiff, byteorder=order) as tw:
        tw.write(data, tile=(32, 32), subifds=2, photometric="rgb")
        tw.write(data[::2, ::2], tile=(32, 32), subfiletype=1, photometric="rgb")
        tw.write(data[::4, ::4], tile=(32, 32), subfiletype=1, photometric="rgb")
    source = LocalFile(path)
    try:
        tables = scan(source)
        tif, pages = _pages(path)
        with tif:
            assert len(pages) == 3
            for page in pages:  # the top IFD and both SubIFDs: each table deferred, equal
                for code in (324, 325):
                    tag = page.tags[code]
                    assert tables.table(tag) is not None, (page.index, code)
                    assert np.array_equal(tables.values(tag), np.asarray(tag.value, np.uint64))
    finally:
        source.close()


def _chain_to_itself(path: Path) -> None:
    """Point the first IFD's next-IFD offset back at itself (classic little-endian TIFF)."""
    raw = bytearray(path.read_bytes())
    first = struct.unpack("<I", raw[4:8])[0]
    n = struct.unpack("<H", raw[first:first + 2])[0]
    raw[first + 2 + 12 * n:first + 6 + 12 * n] = struct.pack("<I", first)
    path.write_bytes(bytes(raw))


def test_a_cyclic_chain_ends_the_walk(tmp_path):
    path = tmp_path / "c.tif"
    tifffile.imwrite(path, np.zeros((256, 256), np.uint8), tile=(16, 16))
    _chain_to_itself(path)
    source = LocalFile(path)
    try:
        tables = scan(source)
        assert len(tables) == 2  # offsets and byte counts of the one IFD, once
    finally:
        source.close()


def test_tables_past_the_end_and_ndpi_stay_eager(tmp_path):
    path = tmp_path / "t.tif"
    tifffile.imwrite(path, np.zeros((256, 256), np.uint8), tile=(16, 16))
    raw = path.read_bytes()
    cut = tmp_path / "cut.tif"
    tables = scan(LocalFile(path))
    first = min(t.offset for t in tables._tables.values())
    cut.write_bytes(raw[:first + 8])  # both tables now run past the end of the file
    assert scan(LocalFile(cut)) is EAGER
    ndpi = tmp_path / "n.tif"
    tifffile.imwrite(ndpi, np.zeros((256, 256), np.uint8), tile=(16, 16), extratags=[(65420, 4, 1, 1, True)])
    assert scan(LocalFile(ndpi)) is EAGER
    assert scan(LocalFile(tmp_path / "t.tif")) is not EAGER


def test_a_table_cut_short_is_a_corrupt_file_error(tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(bytes(100))
    tables = DeferredTables(LocalFile(path), {96: Table(96, "<u4", 4)})

    class Tag:
        code, valueoffset, count, dtype = 324, 96, 4, 4

    with pytest.raises(CorruptFileError, match=r"^tile table at byte 96") as raised:
        tables.values(Tag())
    assert str(path) not in str(raised.value)  # (the facade that reads names the slide)


def test_the_view_blanks_exactly_the_ranges_it_is_told(tmp_path):
    path = tmp_path / "v.bin"
    path.write_bytes(bytes(range(256)))
    source = RemoteLike(path)
    view = SourceFile(source, blank=[(16, 8)])
    view.seek(16)
    assert view.read(8) == bytes(8) and source.log == []  # nothing fetched
    buf = bytearray(8)
    view.seek(16)
    assert view.readinto(buf) == 8 and buf == bytes(8) and source.log == []
    view.seek(16)
    assert view.read(9) == bytes(range(16, 25))  # another range over the same bytes reads them
    view.seek(12)
    assert view.read(8) == bytes(range(12, 20))


def _classic_tiff(path: Path, ifds: list[list[tuple[int, int, int, int]]], blobs: dict[int, bytes], size: int) -> None:
    """Write a little-endian classic TIFF of ``size`` bytes: the IFDs one after another from
    byte 8 (entries ``(code, type, count, value or offset)``, chained), ``blobs`` at their offsets."""
    raw = bytearray(size)
    raw[:8] = b"II*\x00" + struct.pack("<I", 8)
    at = 8
    for k, entries in enumerate(ifds):
        nxt = 0 if k == len(ifds) - 1 else at + 2 + 12 * len(entries) + 4
        raw[at:at + 2] = struct.pack("<H", len(entries))
        for i, (code, dtype, count, value) in enumerate(sorted(entries)):
            raw[at + 2 + 12 * i:at + 14 + 12 * i] = struct.pack("<HHII", code, dtype, count, value)
        raw[at + 2 + 12 * len(entries):at + 6 + 12 * len(entries)] = struct.pack("<I", nxt)
        at = nxt
    for offset, data in blobs.items():
        raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))


def _tiled(offsets_at: int, counts_at: int, n: int = 4, dtype: int = 4, extra=()):
    return [(256, 4, 1, 32), (257, 4, 1, 32), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1), (277, 3, 1, 1),
            (322, 3, 1, 16), (323, 3, 1, 16), (324, dtype, n, offsets_at), (325, 4, n, counts_at), *extra]


def test_a_table_another_value_or_reading_shares_is_not_deferred(tmp_path):
    """Blanking a range that something else reads would give that something zeros: a table
    overlapping another tag's value, or read as two field types, is read at parse as before."""
    ok, clash, mixed = tmp_path / "ok.tif", tmp_path / "clash.tif", tmp_path / "mixed.tif"
    _classic_tiff(ok, [_tiled(1000, 1100)], {}, 4096)
    _classic_tiff(clash, [_tiled(1000, 1100, extra=[(270, 2, 16, 1000)])], {1000: b"a description\x00\x00\x00"}, 4096)
    _classic_tiff(mixed, [_tiled(1000, 1100), _tiled(1000, 1200, n=8, dtype=3)], {}, 4096)
    assert {t.offset for t in scan(LocalFile(ok))._tables.values()} == {1000, 1100}
    assert {t.offset for t in scan(LocalFile(clash))._tables.values()} == {1100}
    assert {t.offset for t in scan(LocalFile(mixed))._tables.values()} == {1100, 1200}


def test_many_subifd_lists_are_walked_in_bounded_memory(tmp_path):
    """An IFD of 4,000 SubIFDs entries each listing the same 4,000 offsets (16 million in all)
    is walked at a cost bounded by MAX_IFDS, not by what the lists add up to."""
    import time

    from wsitool.formats.tiff import tables as tables_mod
    n = 4000
    entries = _tiled(20000, 20100) + [(330, 4, n, 40000)] * n
    path = tmp_path / "bomb.tif"
    _classic_tiff(path, [entries], {40000: struct.pack(f"<{n}I", *([8] * (n - 1) + [60000]))}, 80000)
    t = time.perf_counter()
    scan(LocalFile(path))
    assert time.perf_counter() - t < 5
    walk = tables_mod._Walk(LocalFile(path), tables_mod._layout(path.read_bytes()[:16]))
    walk.run()
    assert walk.entries <= tables_mod.MAX_ENTRIES_WALKED


def test_a_tiled_associated_image_decodes_from_its_real_tables(tmp_path):
    """An OME-TIFF label stored tiled: read as a remote slide is, its pixels are those of the
    local parse (tifffile decodes it from the page's tables, which the parse had blanked)."""
    from wsitool.codec.associated import decode_associated
    path = tmp_path / "l.ome.tif"
    rng = np.random.default_rng(3)
    image = rng.integers(0, 255, (512, 512, 3), np.uint8)
    label = rng.integers(0, 255, (96, 160, 3), np.uint8)
    with tifffile.TiffWriter(path, ome=True) as tw:
        tw.write(image, tile=(64, 64), photometric="rgb", subifds=1, metadata={"Name": "image"})
        tw.write(image[::2, ::2], tile=(64, 64), photometric="rgb", subfiletype=1)
        tw.write(label, tile=(32, 32), photometric="rgb", metadata={"Name": "label"})
    local, remote, eager, lazy = _pyramids(path)
    try:
        assert "label" in eager.associated and "label" in lazy.associated
        import threading
        got = decode_associated(lazy.associated["label"], remote, threading.Lock())
        np.testing.assert_array_equal(np.asarray(got).reshape(label.shape), label)
        np.testing.assert_array_equal(got, decode_associated(eager.associated["label"], local,
                                                             threading.Lock()))
    finally:
        for p in (eager, lazy):
            p.release()
        local.close()
        remote.close()
