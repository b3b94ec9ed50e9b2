"""How to install the torchvision ``--model`` needs without replacing the torch already installed.

A bare ``pip install torchvision`` installs the newest torchvision, which pins the newest torch:
pip then replaces the venv's torch (a CPU build of 2.13, say) with the newest release and, on
Linux, several GB of CUDA libraries. Each torchvision release is built for one torch release
(:data:`PAIRS`); the command named here asks for that one and pins torch as installed, so pip can
only leave torch alone. A torch from PyTorch's own index (``2.13.0+cpu``, ``+cu128``) gets the
torchvision of the same index: PyPI's Linux torchvision is a CUDA build, whose operators do not
load beside a CPU torch.
"""

from __future__ import annotations

PAIRS = {
    "2.4.0": "0.19.0", "2.4.1": "0.19.1", "2.5.0": "0.20.0", "2.5.1": "0.20.1", "2.6.0": "0.21.0",
    "2.7.0": "0.22.0", "2.7.1": "0.22.1", "2.8.0": "0.23.0", "2.9.0": "0.24.0", "2.9.1": "0.24.1",
    "2.10.0": "0.25.0", "2.11.0": "0.26.0", "2.12.0": "0.27.0", "2.12.1": "0.27.1", "2.13.0": "0.28.0",
    "2.14.0": "0.29.0", "2.14.1": "0.29.1",
}
"""torch release → the torchvision release built for it (from each torchvision's own pin on torch)."""

PYTORCH_INDEX = "https://download.pytorch.org/whl/"


def torchvision_install(torch_version: str) -> str:
    """The pip command that installs the torchvision made for ``torch_version`` and leaves torch as it is.

    >>> torchvision_install("2.13.0+cpu")
    'pip install torchvision==0.28.0 torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu'
    """
    release, _, build = torch_version.partition("+")
    vision = PAIRS.get(release)
    command = f"pip install torchvision{'==' + vision if vision else ''} torch=={torch_version}"
    return command + (f" --index-url {PYTORCH_INDEX}{build}" if build else "")


def torchvision_hint(torch_version: str) -> str:
    """What to install, and why not a bare ``pip install torchvision``."""
    release = torch_version.partition("+")[0]
    which = (f"torchvision {PAIRS[release]}, the release made for torch {release}" if release in PAIRS
             else f"the torchvision release made for torch {release} (pip finds it with torch pinned)")
    return (f"{torchvision_install(torch_version)} ({which}; torch stays {torch_version}: a bare "
            "`pip install torchvision` would replace it with the newest torch, and on Linux its CUDA libraries)")
