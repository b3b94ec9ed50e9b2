"""The torchvision hint names the release made for the installed torch and pins torch as installed
(issue 47 item 3: a bare `pip install torchvision` replaced a CPU torch 2.13 with torch 2.14.1 and
the CUDA 13 libraries)."""

from __future__ import annotations

import pytest

from fastload.benchmark.torchvision_install import torchvision_hint, torchvision_install


@pytest.mark.parametrize(("torch_version", "command"), [
    ("2.13.0+cpu", "pip install torchvision==0.28.0 torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu"),
    ("2.13.0", "pip install torchvision==0.28.0 torch==2.13.0"),  # PyPI's build: PyPI's torchvision
    ("2.12.1+cu126", ("pip install torchvision==0.27.1 torch==2.12.1+cu126 "
                      "--index-url https://download.pytorch.org/whl/cu126")),
    ("2.99.0", "pip install torchvision torch==2.99.0"),  # a release not in the table: pip finds its pair
])
def test_the_command_pins_torch_as_installed(torch_version, command):
    assert torchvision_install(torch_version) == command


def test_the_hint_says_which_release_and_why_not_a_bare_install():
    hint = torchvision_hint("2.13.0+cpu")
    assert "torchvision 0.28.0, the release made for torch 2.13.0; torch stays 2.13.0+cpu" in hint
    assert "a bare `pip install torchvision` would replace it with the newest torch" in hint
    assert "the torchvision release made for torch 2.99.0" in torchvision_hint("2.99.0")
