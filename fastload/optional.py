"""Optional dependencies, imported lazily through one helper that names the package to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from fastload.errors import MissingDependencyError

# module imported → (pip package, extra that brings it)
PACKAGES: dict[str, tuple[str, str]] = {
    "nvidia.dali": ("nvidia-dali-cuda120", "dali"),
    "nvidia.dali.fn": ("nvidia-dali-cuda120", "dali"),
    "nvidia.dali.types": ("nvidia-dali-cuda120", "dali"),
    "matplotlib": ("matplotlib", "plot"),
    "matplotlib.pyplot": ("matplotlib", "plot"),
    "pyarrow": ("pyarrow", "parquet"),
    "pyarrow.compute": ("pyarrow", "parquet"),
    "pyarrow.ipc": ("pyarrow", "parquet"),
    "pyarrow.parquet": ("pyarrow", "parquet"),
    "datasets": ("datasets", "hf"),
    "ray": ("ray[data]", "ray"),
    "ray.data": ("ray[data]", "ray"),
    "obstore": ("obstore", "remote"),
}


DISTRIBUTION = "fastload-torch"
"""fastload's distribution name (setup.cfg). Not ``fastload``: that name on PyPI is an unrelated
file downloader, which ``pip install fastload`` would install."""


def extra_hint(extra: str) -> str:
    """How to install one of fastload's extras: from the clone fastload was installed from."""
    return f"pip install -e '.[{extra}]' in fastload's clone (the {DISTRIBUTION} distribution)"


def require(module: str, purpose: str, install: str | None = None) -> ModuleType:
    """Import ``module`` or raise MissingDependencyError saying what to ``pip install`` for ``purpose``
    (``install``: the command to give instead of ``pip install PACKAGE``)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package, extra = PACKAGES.get(module, (module.split(".")[0], ""))
        hint = install or f"pip install {package}" + (f" (or {extra_hint(extra)})" if extra else "")
        raise MissingDependencyError(f"{purpose} needs the {package} package, which is not importable "
                                     f"here ({exc}); install it: {hint}") from exc
