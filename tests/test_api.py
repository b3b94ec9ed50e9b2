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
