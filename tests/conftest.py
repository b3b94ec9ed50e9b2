"""Shared test data: small photo-like JPEG/PNG files, ImageFolder trees, packed datasets, CLI runners.

The test folders are packages (empty ``__init__.py``), so test modules import these helpers as
``from tests.conftest import ...`` whatever their folder.
"""

from __future__ import annotations

import ast
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from PIL import Image, ImageDraw

REPO = Path(__file__).resolve().parent.parent

# Property tests judge results, never speed: no per-example deadline, and no failure when a busy
# machine makes drawing examples slow (a test's own @settings still sets what it names).
settings.register_profile("fastload", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fastload")
NOBODY = 65534

# A suite started in the background by a script (`make test &`, nohup) inherits Ctrl-C ignored,
# and so would every process it starts: the Ctrl-C tests need Python's own handler, as a terminal gives.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# --- images: smooth gradients and a few shapes (decode like photos, unlike noise) ----------------

def make_image(width: int = 64, height: int = 48, seed: int = 0) -> Image.Image:
    """A deterministic RGB picture: a two-way colour gradient with an ellipse and a bar on it."""
    img = Image.new("RGB", (width, height))
    draw = ImageDraw.Draw(img)
    r0, g0, b0 = (seed * 37) % 200, (seed * 71) % 200, (seed * 113) % 200
    for y in range(height):
        t = y / max(1, height - 1)
        draw.line([(0, y), (width - 1, y)], fill=(int(r0 + 55 * t), int(g0 + 40 * (1 - t)), int(b0 + 50 * t)))
    cx, cy = (seed * 13) % width, (seed * 7) % height
    draw.ellipse([cx - width // 4, cy - height // 4, cx + width // 4, cy + height // 4],
                 fill=(240, (seed * 29) % 256, 40))
    draw.rectangle([width // 8, height // 2, width // 8 + width // 6, height - 2], fill=(30, 60, (seed * 53) % 256))
    return img


def make_jpeg(width: int = 64, height: int = 48, seed: int = 0, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    make_image(width, height, seed).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def make_png(width: int = 64, height: int = 48, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    make_image(width, height, seed).save(buf, format="PNG")
    return buf.getvalue()


def with_comment(jpeg: bytes, text: str) -> bytes:
    """The same JPEG with a COM segment after SOI: a distinct, still valid file, made without encoding."""
    body = text.encode()
    return jpeg[:2] + b"\xff\xfe" + (len(body) + 2).to_bytes(2, "big") + body + jpeg[2:]


def many_small_jpegs(src: Path, count: int, classes: int = 10) -> dict[str, bytes]:
    """``count`` distinct ~2 KB JPEGs in class folders, made fast: a dozen encoded pictures, each
    copy made unique by a comment segment."""
    bases = [make_jpeg(96, 72, seed=k, quality=95) for k in range(12)]
    files = {f"class_{i % classes:02d}/img_{i:05d}.jpg": with_comment(bases[i % len(bases)], f"image {i}")
             for i in range(count)}
    return write_tree(src, files)


def write_tree(root: Path, files: dict[str, bytes]) -> dict[str, bytes]:
    """Write ``{relative path: bytes}`` under ``root``; returns ``files``."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def imagefolder_files(classes: dict[str, int], *, size: tuple[int, int] = (64, 48),
                      png_every: int = 3) -> dict[str, bytes]:
    """``{"cat/000.jpg": bytes, ...}``: every ``png_every``-th image of a class is a PNG."""
    files, seed = {}, 0
    for name, count in classes.items():
        for i in range(count):
            if png_every and i % png_every == png_every - 1:
                files[f"{name}/{i:03d}.png"] = make_png(*size, seed=seed)
            else:
                files[f"{name}/{i:03d}.jpg"] = make_jpeg(*size, seed=seed)
            seed += 1
    return files


SMALL_CLASSES = {"cat": 4, "dog": 3, "emu": 2}


@pytest.fixture(scope="session")
def native():
    """The native JPEG module (tests that use it skip where it cannot be built)."""
    from fastload.decode import _jpeg_region

    return _jpeg_region


@pytest.fixture
def imagefolder(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A small ImageFolder tree (JPEG and PNG, 3 classes) and its files' bytes."""
    src = tmp_path / "images"
    return src, write_tree(src, imagefolder_files(SMALL_CLASSES))


@pytest.fixture(scope="session")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, dict[str, bytes]]]:
    """``packed(storage)`` → a finished dataset of a small ImageFolder tree (several shards) and its source.

    Session-scoped and read-only: tests that damage a dataset copy it first (``copy_dataset``).
    """
    from fastload.converters import pack

    made: dict[str, tuple[Path, dict[str, bytes]]] = {}
    base = tmp_path_factory.mktemp("packed")
    src = base / "images"
    files = write_tree(src, imagefolder_files({"cat": 6, "dog": 5, "emu": 4}, size=(40, 32)))

    def get(storage: str) -> tuple[Path, dict[str, bytes]]:
        if storage not in made:
            out = base / f"images-{storage}.fl"
            pack(src, out, format=storage, shard_size="4KB", workers=2, progress=False)
            made[storage] = (out, files)
        return made[storage]

    return get


def copy_dataset(dataset: Path, dest: Path) -> Path:
    shutil.copytree(dataset, dest)
    return dest


def flip_payload_byte(dataset: Path, record: int) -> str:
    """Flip one byte in the middle of record ``record``'s payload, inside its shard file; returns the shard name.

    The payload is found by its bytes (LMDB stores values contiguously, HDF5 in one dataset), so this
    works for every storage kind without knowing the page layout.
    """
    from fastload.format import RecordIndex, read_manifest
    from fastload.readers import READERS

    manifest = read_manifest(dataset)
    index = RecordIndex(dataset, manifest)
    reader = READERS[manifest.storage](dataset, manifest, index)
    payload = reader.read(record)
    reader.close()
    shard = manifest.shards[int(index.shard[record])].file
    path = dataset / shard
    blob = bytearray(path.read_bytes())
    at = blob.find(payload)
    assert at >= 0 and blob.find(payload, at + 1) < 0, "payload not found exactly once in its shard"
    blob[at + len(payload) // 2] ^= 0x5A
    path.write_bytes(bytes(blob))
    return shard


def load_manifest_json(dataset: Path) -> dict:
    return json.loads((dataset / "manifest.json").read_text())


def save_manifest_json(dataset: Path, raw: dict) -> None:
    (dataset / "manifest.json").write_text(json.dumps(raw))


# --- reading our own source ----------------------------------------------------------------------

def parse_python(path: Path, tries: int = 5) -> ast.Module:
    """``ast.parse`` of a source file, tried again when CPython 3.11 raises its spurious "AST
    constructor recursion depth mismatch": the converter's depth counter is shared by the whole
    interpreter, so a parse in another thread at the same moment (a traceback being formatted
    parses its line) corrupts it (python/cpython#106905). Seen once on a machine at load 14-20."""
    source = path.read_text()
    for attempt in range(tries):
        try:
            return ast.parse(source, filename=str(path))
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc) or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


# --- running the CLI ----------------------------------------------------------------------------

@dataclass
class CliResult:
    rc: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """``cli("pack", src, "-o", out)``: ``fastload.cli.main`` in this process, with its exit status and output."""
    from fastload.cli import main

    def run(*argv: object) -> CliResult:
        capsys.readouterr()
        rc = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return CliResult(rc, out, err)

    return run


def fastload_command(*argv: object) -> list[str]:
    """The argv of a real ``fastload`` process (the console script's module, this interpreter)."""
    return [sys.executable, "-m", "fastload.cli", *[str(a) for a in argv]]


def run_fastload(*argv: object, timeout: float = 120, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(fastload_command(*argv), capture_output=True, text=True, timeout=timeout,
                          cwd=kwargs.pop("cwd", REPO), **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def world_tmp() -> Iterator[Path]:
    """A temp folder every user may enter and write (pytest's own tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="fastload-test-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        for dirpath, dirnames, filenames in os.walk(path):  # we may have made parts unreadable
            for name in dirnames + filenames:
                full = os.path.join(dirpath, name)
                if not os.path.islink(full):
                    os.chmod(full, 0o777)
        shutil.rmtree(path, ignore_errors=True)


def run_unprivileged(argv: list[object]) -> CliResult:
    """``fastload.cli.main(argv)`` in a forked child that runs as an ordinary user.

    Tests run as root (here and in CI), and root reads any file whatever its mode: the child drops
    to uid/gid 65534 (nobody) first, so a chmod 000 file really is unreadable to it. Forking after
    the imports means the child needs no access to the checkout or the virtual environment.
    """
    import fastload.converters.packing.loop  # noqa: F401  (everything the child runs is imported before the fork)
    import fastload.cli

    Image.init()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        rc = 99
        try:
            os.close(read_end)
            os.dup2(write_end, 1)
            os.dup2(write_end, 2)
            sys.stdout = sys.stderr = io.TextIOWrapper(os.fdopen(write_end, "wb", closefd=False),
                                                       write_through=True)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            rc = fastload.cli.main([str(a) for a in argv])
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
            finally:
                os._exit(rc)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as f:
        while chunk := f.read(65536):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode(errors="replace")
    return CliResult(os.waitstatus_to_exitcode(status), text, text)
