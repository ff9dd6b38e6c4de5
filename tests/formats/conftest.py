"""Fixtures shared by the vendor-layout tests (tests/formats/test_philips.py, test_ventana.py, test_mirax.py,
test_czi.py)."""

from __future__ import annotations

import pytest

from helpers import script_module, shared_sample


@pytest.fixture(scope="session")
def made(tmp_path_factory):
    """Every vendor-layout fixture of ``scripts/make_vendor_samples.py`` (its ``MAKERS``), written
    once from the shared CMU SVS into a temporary folder: maker name -> path."""
    src = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    gen = script_module("make_vendor_samples")
    out = tmp_path_factory.mktemp("vendor")
    return {make.__name__: make(out, src) for make in gen.MAKERS}


@pytest.fixture(scope="session")
def made_czi(tmp_path_factory):
    """Every CZI fixture of ``scripts/make_czi_samples.py`` (its ``MAKERS``), written once from the
    shared CMU SVS into a temporary folder: file name -> path."""
    src = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    gen = script_module("make_czi_samples")
    out = tmp_path_factory.mktemp("czi")
    return {path.name: path for path in (make(out, src) for make in gen.MAKERS)}


@pytest.fixture(scope="session")
def mirax_made(tmp_path_factory):
    """Every MIRAX fixture of ``scripts/make_mirax_samples.py`` (its ``MAKERS``), written once from
    the shared CMU SVS: maker name -> ``.mrxs`` path."""
    src = shared_sample("aperio-cmu1-small-region-jpeg.svs")
    gen = script_module("make_mirax_samples")
    out = tmp_path_factory.mktemp("mirax")
    return {make.__name__: make(out, src) for make in gen.MAKERS}
