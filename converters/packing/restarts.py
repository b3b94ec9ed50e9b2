"""Optional lossless rewrite at pack time: JPEGs get restart markers that tile their rows.

With them the loader decodes a random crop from the restart intervals under it alone, instead of
entropy-decoding every row above it (``fastload/decode/jpeg_splice.c``). The DCT coefficients are kept
exactly, so every decoder gives the same pixels as from the source file.
"""

from __future__ import annotations

from fastload.converters.packing.headers import JPEG_SOI

try:
    from fastload.decode._jpeg_region import RegionDecodeError, add_restart_markers
except ImportError:  # built without a compiler or libjpeg's headers: see setup.py
    add_restart_markers = None  # type: ignore[assignment]


def check_available() -> None:
    """Refuse ``restart_markers=True`` up front when the native JPEG module was not built."""
    if add_restart_markers is None:
        raise ValueError("restart_markers=True needs fastload's native JPEG module "
                         "(fastload.decode._jpeg_region), which was not built: install libjpeg-dev and a C "
                         "compiler, then reinstall fastload, or pack without --restart-markers")


def with_restart_markers(data: bytes) -> tuple[bytes, str | None]:
    """``(rewritten JPEG, None)``; or ``(data, why)`` when it is kept as it is.

    Bytes that are not a JPEG are returned unchanged with no reason. A JPEG that libjpeg cannot
    rewrite without a warning (corrupt scan data, a 12-bit file) is kept byte for byte: it still
    loads, through the slower whole-scan path, and the pack reports it.
    """
    if not data.startswith(JPEG_SOI):  # the start the pack's checks call a JPEG
        return data, None
    try:
        rewritten, _ = add_restart_markers(data)
    except RegionDecodeError as exc:
        return data, str(exc)
    return rewritten, None
