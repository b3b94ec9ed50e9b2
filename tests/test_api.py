"""The public surface: every error and warning fastload raises is ``fastload.X`` and named on the
API page, so a user can catch it without knowing the module it lives in."""

from __future__ import annotations

import inspect

import fastload
import fastload.errors
from tests.conftest import REPO


def test_every_error_and_warning_is_exported_and_documented():
    classes = [name for name, obj in inspect.getmembers(fastload.errors, inspect.isclass)
               if obj.__module__ == "fastload.errors"]
    assert {"RemoteReadError", "RemoteNotFound", "RemoteAccessDenied", "CacheWarning"} <= set(classes)
    page = (REPO / "docs" / "python-api.md").read_text()
    for name in classes:
        assert getattr(fastload, name) is getattr(fastload.errors, name) and name in fastload.__all__, name
        assert f"`{name}`" in page or name == "FastloadError" and "`FastloadError`" in page, name


def test_the_signatures_the_api_page_writes_out_are_the_codes():
    """A call written out on docs/python-api.md names only real parameters, with their real defaults."""
    import ast
    import re

    from fastload.converters import pack

    objects = {"fastload.converters.packing.loop": pack, "fastload.pack": pack, "fastload.PackedDataset": fastload.PackedDataset,
               "fastload.verify": fastload.verify, "fastload.tune": fastload.tune,
               "fastload.describe": fastload.describe, "fastload.DataLoader": fastload.DataLoader,
               "fastload.Writer": fastload.Writer, "fastload.MixedDataset": fastload.MixedDataset}
    # the calls written by hand: the reference blocks are docs/gen_api.py's, from the code itself
    page = re.sub(r"<!-- api .*?<!-- /api -->", "", (REPO / "docs" / "python-api.md").read_text(), flags=re.DOTALL)
    calls = re.findall(r"`((?:fastload|converters)\.\w+)\(([^`]*?)\)(?: -> \w+)?`", page.replace("\n  ", " "))
    assert len(calls) >= 4
    for name, arguments in calls:
        parameters = inspect.signature(objects[name]).parameters
        for argument in (a.strip() for a in arguments.split(",")):
            if argument in ("", "*", "...", "**options") or argument.startswith("batch_size=…"):
                continue
            key, _, default = argument.partition("=")
            assert key in parameters, f"{name}: no parameter {key!r}"
            if default:
                assert ast.literal_eval(default) == parameters[key].default, f"{name}: {key}={default}"


def test_pack_is_fastload_pack():
    from fastload.converters.packing.loop import pack
    from fastload.converters.packing.report import PackReport

    assert fastload.pack is pack and fastload.PackReport is PackReport
    assert {"pack", "PackReport"} <= set(fastload.__all__)



def test_dir_lists_the_public_api_and_nothing_else():
    names = dir(fastload)
    assert names == sorted(fastload.__all__)
    assert not {"Any", "annotations", "importlib", "errors", "_LAZY"} & set(names)
    for name in names:  # each one it lists is there, the lazy ones loaded on first use
        assert getattr(fastload, name) is not None, name
