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
}


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise MissingDependencyError saying what to ``pip install`` for ``purpose``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package, extra = PACKAGES.get(module, (module.split(".")[0], ""))
        hint = f"pip install {package}" + (f" (or pip install 'fastload[{extra}]')" if extra else "")
        raise MissingDependencyError(f"{purpose} needs the {package} package, which is not importable "
                                     f"here ({exc}); install it: {hint}") from exc
