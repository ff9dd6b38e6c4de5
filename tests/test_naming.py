"""The one way a slide's name joins an error raised below the facade (wsitool.ground.naming)."""

from __future__ import annotations

import errno
import pickle

import pytest

from wsitool.errors import CorruptFileError, InvalidRegionError, OutputExistsError, TileDecodeError
from wsitool.ground.naming import about, attach


def test_an_unnamed_error_gets_the_name_and_keeps_it_through_pickling():
    with pytest.raises(CorruptFileError) as info, about("a.svs"):
        raise CorruptFileError("IFD 3: tile offsets past the end")
    assert str(info.value) == "a.svs: IFD 3: tile offsets past the end"
    assert info.value.subject == "a.svs"
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == str(info.value) and again.subject == "a.svs"


def test_the_innermost_name_wins_and_a_named_message_is_not_named_twice():
    with pytest.raises(CorruptFileError) as info, about("folder"), about("folder/b.dcm"):
        raise CorruptFileError("malformed DICOM attributes")
    assert str(info.value) == "folder/b.dcm: malformed DICOM attributes"
    err = InvalidRegionError("a.svs: level 9 out of range")
    attach(err, "a.svs")
    assert str(err) == "a.svs: level 9 out of range"
    tile = TileDecodeError("a.svs", 0, 1, 2, "truncated")
    attach(tile, "a.svs")
    assert str(tile).count("a.svs") == 1


def test_os_errors_get_a_filename_only_where_they_have_an_errno_and_none():
    with pytest.raises(OSError) as info, about("a.svs"):
        raise OSError(errno.EMFILE, "Too many open files")
    assert info.value.filename == "a.svs" and "a.svs" in str(info.value)
    plain = OSError("no errno")
    attach(plain, "a.svs")
    assert plain.filename is None and str(plain) == "no errno"
    exists = OutputExistsError("out.png")
    attach(exists, "a.svs")
    assert str(exists).startswith("out.png: ")


def test_other_errors_and_success_pass_through_unchanged():
    with pytest.raises(KeyError) as info, about("a.svs"):
        raise KeyError("x")
    assert "a.svs" not in str(info.value)
    with about("a.svs"):
        value = 1
    assert value == 1
