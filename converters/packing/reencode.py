"""Optional re-encode at pack time: shrink the longer side and re-save as JPEG (lossy, recorded)."""

from __future__ import annotations

import io

from PIL import Image

from fastload.converters.packing.checks import InvalidFile


def reencode_jpeg(data: bytes, *, max_side: int | None, quality: int) -> tuple[bytes, int, int]:
    """JPEG bytes of the image with its longer side at most ``max_side``; returns (bytes, w, h)."""
    try:
        img = Image.open(io.BytesIO(data))
        if max_side is not None and max(img.size) > max_side:
            scale = max_side / max(img.size)
            target = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
            img.draft("RGB", target)  # libjpeg's reduced decode when the file is a JPEG
            img = img.convert("RGB").resize(target, Image.LANCZOS, reducing_gap=3.0)
        else:
            img = img.convert("RGB")
    except Exception as exc:
        raise InvalidFile(f"image does not decode for re-encoding ({exc})") from None
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality, optimize=False)
    return out.getvalue(), img.width, img.height
