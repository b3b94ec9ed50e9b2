"""AWS's connector as a contender: the store options it is given, and no row without the package."""

from __future__ import annotations

import os
import sys

import pytest

from fastload.benchmark.connector import NOT_INSTALLED, ConnectorTarget, connector_rows, installed


def test_s3fs_options_become_the_connectors_endpoint_region_path_style_and_credentials():
    target = ConnectorTarget.from_options(
        "s3://bucket/photos", {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9000",
                               "client_kwargs": {"region_name": "eu-west-1"}})
    assert target.uri == "s3://bucket/photos/"  # not s3://bucket/photos.fl/...
    assert (target.region, target.endpoint, target.force_path_style) == ("eu-west-1", "http://127.0.0.1:9000", True)
    assert target.credentials == {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": None}
    aws = ConnectorTarget.from_options("s3://bucket/", {"anon": True, "profile": "p"})
    assert (aws.endpoint, aws.force_path_style, aws.unsigned, aws.profile, aws.credentials) == (None, False, True, "p", {})
    with pytest.raises(ValueError, match="gs://b/x: s3torchconnector reads s3:// URLs only"):
        ConnectorTarget.from_options("gs://b/x", None)


def test_credentials_go_to_the_environment_but_never_over_others(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "recorded")  # so that what the test sets is undone after it
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "other")
    target = ConnectorTarget.from_options("s3://b/x", {"key": "k", "secret": "s"})
    with pytest.raises(ValueError, match="AWS_ACCESS_KEY_ID is set in the environment to another value"):
        target.export_credentials()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    target.export_credentials()
    assert (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]) == ("k", "s")
    assert "AWS_SESSION_TOKEN" not in os.environ


def test_without_the_package_there_is_no_row_and_a_note_says_how_to_add_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "s3torchconnector", None)  # what an absent package looks like to import
    assert not installed()
    assert connector_rows(None, ["s3://bucket/photos.fl"], None, batch_size=8) == ([], [NOT_INSTALLED])
    assert "pip install s3torchconnector" in NOT_INSTALLED
    assert connector_rows(None, ["/data/photos.fl"], None, batch_size=8) == ([], [])  # not a store: nothing to say
