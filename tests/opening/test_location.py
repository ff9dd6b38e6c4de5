"""Slide locations (:mod:`wsitool.opening.location`): sorted once, carrying their storage options,
picklable, never showing a secret; a file's siblings."""

from __future__ import annotations

import pickle

import pytest

import wsitool
from wsitool.errors import InvalidOptionError, WsiError
from wsitool.opening import (
    BucketPrefix,
    DicomWebSeries,
    LocalFile,
    LocalFolder,
    LocationOptions,
    ObjectUrl,
    location_from_wire,
    parse_location,
)

from helpers import shared_sample

SECRET_URL = "https://user:PASSWORD@example.org/slides/a.svs?X-Amz-Signature=SIGNATURE"
SECRET_OPTIONS = {"key": "KEYVALUE", "secret": "SECRETVALUE", "headers": {"Authorization": "Bearer TOKENVALUE"}}


@pytest.mark.parametrize("given,kind", [
    ("https://example.org/a.svs", ObjectUrl), ("s3://bucket/a.svs", ObjectUrl), ("gcs://bucket/a.svs", ObjectUrl),
    ("az://container/a/b.tiff", ObjectUrl), ("s3://bucket/series/", BucketPrefix), ("abfs://c/series/", BucketPrefix),
    ("https://example.org/web/studies/1.2.3/series/4.5.6", DicomWebSeries),
    ("dicomweb+https://example.org/web/studies/1.2/series/3.4", DicomWebSeries),
    ("https://example.org/folder/", ObjectUrl),  # (HTTP has no listing: one object, refused when read)
])
def test_urls_are_sorted_once_into_their_kind(given, kind):
    loc = parse_location(given)
    assert type(loc) is kind and loc.target == given and loc.remote and loc.options is None
    assert parse_location(loc) is loc  # a location is taken as it is


def test_local_paths_are_files_or_folders(tmp_path):
    (tmp_path / "a.svs").write_bytes(b"x")
    assert parse_location(tmp_path / "a.svs") == LocalFile(str(tmp_path / "a.svs"))
    assert parse_location(str(tmp_path)) == LocalFolder(str(tmp_path))
    missing = parse_location("no/such/slide.svs")  # opening it raises, not parsing it
    assert missing == LocalFile("no/such/slide.svs") and not missing.remote
    assert missing.resolved().target.endswith("/no/such/slide.svs") and missing.resolved().target.startswith("/")


def test_storage_options_are_for_urls_and_given_once(tmp_path):
    with pytest.raises(InvalidOptionError, match="storage options apply to URLs only"):
        parse_location(tmp_path, {"anon": True})
    assert parse_location(tmp_path, {}) == LocalFolder(str(tmp_path))  # (none given)
    loc = parse_location("s3://b/a.svs", {"anon": True})
    assert loc.options == LocationOptions({"anon": True}) and loc.options_dict() == {"anon": True}
    assert parse_location(loc, {"anon": True}) is loc
    with pytest.raises(InvalidOptionError, match="carries its own storage options"):
        parse_location(loc, {"anon": False})
    with pytest.raises(InvalidOptionError, match="must be a mapping"):
        parse_location("s3://b/a.svs", [("anon", True)])


def test_a_location_never_shows_a_secret_and_pickles_whole():
    loc = parse_location(SECRET_URL, SECRET_OPTIONS)
    shown = f"{loc} {loc!r} {loc.shown} {loc.options!r}"
    for secret in ("PASSWORD", "SIGNATURE", "KEYVALUE", "SECRETVALUE", "TOKENVALUE"):
        assert secret not in shown
    assert str(loc) == "https://***@example.org/slides/a.svs?<redacted>"
    assert "headers" in repr(loc) and "secret" in repr(loc)  # the names of the options, not their values
    back = pickle.loads(pickle.dumps(loc))
    assert back == loc and hash(back) == hash(loc) and back.target == SECRET_URL
    assert back.options_dict() == SECRET_OPTIONS
    assert location_from_wire(loc.wire()) == loc
    with pytest.raises(InvalidOptionError):
        location_from_wire({"kind": "Nowhere", "target": "x"})


def test_options_are_frozen_copies():
    given = {"headers": {"A": "1"}}
    loc = parse_location("https://h/a.svs", given)
    given["headers"]["A"] = "2"  # the caller's dict changes later
    loc.options_dict()["headers"]["A"] = "3"  # and so does a storage function's copy
    assert loc.options_dict() == {"headers": {"A": "1"}}
    assert parse_location("https://h/a.svs", {"a": 1, "b": 2}) == parse_location("https://h/a.svs", {"b": 2, "a": 1})
    assert parse_location("https://h/a.svs", {"a": 1}) != parse_location("https://h/a.svs", {"a": 2})


def test_a_malformed_url_is_one_invalid_option_error():
    with pytest.raises(InvalidOptionError, match="not a valid URL") as info:
        parse_location("http://[::1/a.svs?sig=SIGNATURE")
    assert "SIGNATURE" not in str(info.value)
    with pytest.raises(WsiError, match="not a DICOMweb series URL"):
        parse_location("dicomweb+https://example.org/not/a/series")


def test_a_local_file_opens_a_named_sibling(tmp_path):
    """MIRAX keeps Slidedat.ini, Index.dat and Data*.dat in a folder beside its .mrxs."""
    (tmp_path / "slide.mrxs").write_bytes(b"index")
    (tmp_path / "slide").mkdir()
    (tmp_path / "slide" / "Index.dat").write_bytes(b"0123456789")
    loc = parse_location(tmp_path / "slide.mrxs")
    assert loc.sibling("slide/Index.dat") == LocalFile(str(tmp_path / "slide" / "Index.dat"))
    with loc.open_sibling("slide/Index.dat") as src:
        assert src.size == 10 and src.read(2, 3) == b"234"
    with pytest.raises(FileNotFoundError):
        loc.open_sibling("slide/Data0000.dat")


@pytest.mark.parametrize("name", ["../secret.txt", "slide/../../x", "/etc/passwd", "", "a//b", "./a", "a\\b",
                                  "a\0b"])
def test_a_sibling_never_leaves_the_folder(name):
    for loc in (LocalFile("/data/slide.mrxs"), ObjectUrl("https://h/data/slide.mrxs?sig=SIGNATURE")):
        with pytest.raises(InvalidOptionError, match="not the relative name of a file beside the slide") as info:
            loc.sibling(name)
        assert "SIGNATURE" not in str(info.value)


def test_an_object_url_names_its_siblings_with_its_options():
    loc = parse_location("https://h/data/slide.mrxs?token=T", {"timeout": 5})
    sib = loc.sibling("slide/Data 0001.dat")
    assert isinstance(sib, ObjectUrl) and sib.options == loc.options
    assert sib.target == "https://h/data/slide/Data%200001.dat?token=T"
    assert parse_location("s3://b/slide.mrxs").sibling("slide/Index.dat").target == "s3://b/slide/Index.dat"


def test_the_slide_carries_its_location_and_identity():
    path = shared_sample("aperio-openslide-small-16px.svs")
    with wsitool.open_slide(path) as s:
        assert s.location == LocalFile(str(path)) and s.path == str(path)
        st = path.stat()
        assert s.identity == (st.st_mtime_ns, st.st_size)
    with wsitool.open_slide(LocalFile(str(path))) as s:
        assert s.path == str(path) and s.vendor == "aperio"
    folder = shared_sample("dicom-openslide-boxes")
    with wsitool.open_slide(folder) as s:
        assert isinstance(s.location, LocalFolder) and s.identity[1] == folder.stat().st_size


def test_storage_options_for_a_folder_are_a_usage_error_as_for_a_file(tmp_path):
    """A folder with storage options raised a bare WsiError (exit 1), a file InvalidOptionError (exit 2)."""
    from wsitool.cli import exit_code_for

    (tmp_path / "a.svs").write_bytes(b"x")
    for where in (tmp_path, tmp_path / "a.svs"):
        with pytest.raises(InvalidOptionError, match="storage options apply to URLs only") as info:
            wsitool.open_slide(where, storage_options={"anon": True})
        assert exit_code_for(info.value) == 2


@pytest.mark.parametrize(("given", "stem"), [
    ("/data/a.svs", "a"), ("x.ome.tiff", "x"), ("x.OME.TIF", "x"), ("/data/a.b.tif", "a.b"), (".svs", ".svs"),
    ("s3://bucket/p/slide%20one.svs?X-Amz-Signature=s", "slide one"), ("s3://bucket/series/", "series"),
    ("https://host/a%2F..%2Fb.svs", "b"),  # a decoded "/" splits the name: never a path of its own
])
def test_a_location_stem_is_the_name_outputs_are_made_from(given, stem):
    assert parse_location(given).stem == stem
