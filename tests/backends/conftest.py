"""The backends' shared test data: small packed datasets each contract test reads (built once a session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.loading.helpers import ID_RECORDS, encode, picture, write_id_list


@pytest.fixture(scope="session")
def packed(tmp_path_factory) -> dict[str, Path]:
    """The id datasets (label = record number, 48-159 px, every 5th a PNG) in both storages."""
    from fastload.converters import pack

    base = tmp_path_factory.mktemp("backend-data")
    listing = write_id_list(base / "pictures", ID_RECORDS)
    out = {}
    for storage in ("lmdb", "hdf5"):
        out[storage] = base / f"ids-{storage}.fl"
        pack(listing, out[storage], format=storage, shard_size="64KB", workers=1, progress=False)
    return out


@pytest.fixture(scope="session")
def undecodable(tmp_path_factory) -> tuple[Path, int]:
    """A dataset whose record 7 passes pack's header check but has a broken Huffman table."""
    from fastload.converters import pack

    base = tmp_path_factory.mktemp("backend-bad")
    listing = write_id_list(base / "pictures", 12, sizes=[(64, 48)], png_every=0)
    bad = 7
    good = encode(picture(64, 48, seed=bad))
    table = good.find(b"\xff\xc4")
    broken = bytearray(good)
    broken[table + 5:table + 21] = bytes(16)  # the table's code counts
    (base / "pictures" / f"img{bad:04d}.jpg").write_bytes(bytes(broken))
    out = base / "bad.fl"
    pack(listing, out, format="lmdb", workers=1, progress=False)
    return out, bad


@pytest.fixture(scope="session")
def cut_short(tmp_path_factory) -> tuple[Path, int]:
    """A dataset whose record 7 is a JPEG cut short in its scan, its end marker put back (pack takes
    it, libjpeg decodes what is there); a GPU's hardware engine could do otherwise."""
    from fastload.converters import pack

    base = tmp_path_factory.mktemp("backend-cut")
    listing = write_id_list(base / "pictures", 12, sizes=[(64, 48)], png_every=0)
    bad = 7
    whole = encode(picture(64, 48, seed=bad))
    (base / "pictures" / f"img{bad:04d}.jpg").write_bytes(whole[:len(whole) * 2 // 3] + b"\xff\xd9")
    out = base / "cut.fl"
    pack(listing, out, format="lmdb", workers=1, progress=False)
    return out, bad
