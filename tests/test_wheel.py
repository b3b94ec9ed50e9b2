"""The distribution as another project gets it (issue 47, item 2): the sdist and the wheel that
``python -m build`` makes, installed into a fresh venv with no clone in sight, pack, bench and
load; and without a C compiler the same sdist still installs, decodes the same pixels with
Pillow, and says that decoder is slower.

The fresh venvs reuse this test venv's installed dependencies (torch is gigabytes, and the tests
use no network) through one ``.pth`` file holding the paths of this venv's site-packages. Python
runs the ``.pth`` files of the site-packages folder it sets up itself (the fresh venv's), never
those of a folder a ``.pth`` line adds: so this venv's editable install of fastload (a ``.pth``
that installs a finder mapping ``fastload`` and ``fastload.converters`` to the clone) does not run
there, and the fresh venv's own site-packages comes first on ``sys.path``. (``--system-site-packages``
would reach the base interpreter's site-packages, not this venv's.) Every run asserts that the
fastload it imported, converters included, is the fresh venv's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import site
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.conftest import REPO, many_small_jpegs

pytestmark = pytest.mark.slow

# A 2-batch loop over the packed images, as a user's training script would start; eval crops,
# so the batches are the same whichever decoder makes them.
LOOP = """\
import hashlib, importlib.metadata, json
import fastload
import fastload.converters
from fastload.decode.crops import jpeg_decoder

ds = fastload.PackedDataset("images.fl", image_size=32, train=False)
digest, batches = hashlib.sha256(), []
for images, labels in fastload.DataLoader(ds, batch_size=8, shuffle=False):
    digest.update(images.numpy().tobytes())
    digest.update(labels.numpy().tobytes())
    batches.append([list(images.shape), str(images.dtype), list(labels.shape)])
    if len(batches) == 2:
        break
dist = importlib.metadata.distribution("fastload-torch")
print(json.dumps({"fastload": fastload.__file__, "converters": fastload.converters.__file__,
                  "metadata": str(dist.locate_file("")), "version": dist.version,
                  "decoder": jpeg_decoder(), "batches": batches, "digest": digest.hexdigest()}))
"""


def _run(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert done.returncode == 0, f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def _build_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **extra}


def _source_copy(dest: Path) -> Path:
    """The clone's files as git sees them (tracked, and new ones not ignored), copied to ``dest``:
    building writes an egg-info folder into its source, which must not land in the clone."""
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO)
    for rel in filter(None, listed.stdout.split("\0")):
        path = REPO / rel
        if path.is_file():  # a tracked file deleted in the work tree is not part of it
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(path.read_bytes())
    return dest


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel) as a release makes them: ``python -m build`` builds the sdist, then the
    wheel from the sdist (so a file the sdist lacks fails the wheel), with no network."""
    for module in ("build", "trove_classifiers"):
        assert importlib.util.find_spec(module) is not None, (
            f"{module} is not installed; it is a dev dependency: pip install -e '.[dev]'")
    tmp = tmp_path_factory.mktemp("dist")
    source = _source_copy(tmp / "source")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp / "dist"), str(source)],
         cwd=tmp, env=_build_env())
    (sdist,), (wheel,) = (tmp / "dist").glob("*.tar.gz"), (tmp / "dist").glob("*.whl")
    return sdist, wheel


def _fresh_venv(root: Path, wheel: Path) -> Path:
    """A new venv at ``root`` holding ``wheel`` and, through a .pth, this venv's dependencies."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=root.parent)
    python = root / "bin" / "python"
    # No .pth yet: pip sees only the fresh venv, so this venv's editable fastload-torch of the same
    # version cannot read as "already installed". No dependencies: they come through the .pth.
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
          "--quiet", str(wheel)], cwd=root.parent)
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   cwd=root.parent).stdout.strip()
    (Path(purelib) / "_test_venv_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return Path(purelib)


def _user_env(venv: Path, home: Path) -> dict[str, str]:
    """A user's shell with the venv activated: its bin first, no PYTHONPATH, nothing of ours."""
    return {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
            "LANG": "C.UTF-8", "TMPDIR": os.environ.get("TMPDIR", "/tmp")}


def _loop(venv: Path, user: Path) -> dict:
    done = _run([str(venv / "bin" / "python"), "loop.py"], cwd=user, env=_user_env(venv, user))
    return json.loads(done.stdout.splitlines()[-1])


def _native_built_here() -> bool:
    """Whether this venv's native decoder was built: then the wheel's build must make it too."""
    from fastload.decode import crops

    return crops.decode_crop_into is not None


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's project folder far from the clone: a few JPEGs and the training loop."""
    folder = tmp_path_factory.mktemp("user_project")
    assert REPO not in folder.parents and folder not in REPO.parents
    many_small_jpegs(folder / "images", 24, classes=2)
    (folder / "loop.py").write_text(LOOP)
    return folder


@pytest.fixture(scope="module")
def installed(dists: tuple[Path, Path], user: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(venv, its site-packages) with the built wheel installed, and images.fl packed in ``user``
    by that venv's ``fastload pack``."""
    venv = tmp_path_factory.mktemp("wheel_venv") / "venv"
    purelib = _fresh_venv(venv, dists[1])
    _run(["fastload", "pack", "images", "-o", "images.fl", "-q"], cwd=user, env=_user_env(venv, user))
    return venv, purelib


def test_the_sdist_carries_the_sources_headers_and_papers_and_no_build_output(dists):
    from fastload import __version__

    with tarfile.open(dists[0]) as sdist:
        top = f"fastload_torch-{__version__}/"
        names = {name.removeprefix(top) for name in sdist.getnames()}
    tracked = _run(["git", "ls-files", "fastload", "converters"], cwd=REPO).stdout.split()
    wanted = {*tracked, "LICENSE", "README.md", "CHANGELOG.md", "setup.py", "setup.cfg", "pyproject.toml"}
    assert not wanted - names, f"the sdist lacks {sorted(wanted - names)}"
    assert "fastload/py.typed" in names and any(n.endswith("jpeg_region.h") for n in names)
    assert not [n for n in names if n.endswith((".so", ".pyc")) or n.startswith(("tests/", "bench/"))]


def test_the_wheel_holds_the_package_under_one_name_with_publishable_metadata(dists):
    from trove_classifiers import classifiers as known

    from fastload import __version__

    with zipfile.ZipFile(dists[1]) as wheel:
        names = set(wheel.namelist())
        meta = Parser().parsestr(wheel.read(f"fastload_torch-{__version__}.dist-info/METADATA").decode())
    assert {"fastload/py.typed", "fastload/converters/packing/loop.py", "fastload/cli/__main__.py"} <= names
    assert {n.split("/")[0] for n in names} == {"fastload", f"fastload_torch-{__version__}.dist-info"}
    assert not [n for n in names if n.endswith((".c", ".h"))]  # the sources are the sdist's
    if _native_built_here():
        assert [n for n in names if n.startswith("fastload/decode/_jpeg_region.")], \
            "the native decoder built here but not in the wheel: see the build's log (optional=True)"
    assert (meta["Name"], meta["Version"], meta["License-Expression"]) == ("fastload-torch", __version__, "Apache-2.0")
    unknown = [c for c in meta.get_all("Classifier") if c not in known]
    assert not unknown, f"PyPI refuses an upload with classifiers it does not know: {unknown}"
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().startswith("# fastload\n")  # the README is the long description


def test_the_wheel_in_a_fresh_venv_packs_benches_and_loads_outside_the_clone(installed, user):
    from fastload import __version__

    venv, purelib = installed
    assert (user / "images.fl" / "manifest.json").is_file()  # `fastload pack`, the venv's own
    assert Path(_run(["which", "fastload"], cwd=user, env=_user_env(venv, user)).stdout.strip()) \
        == venv / "bin" / "fastload"

    _run(["fastload", "bench", "images", "--packed", "images.fl", "--batch-size", "8", "--image-size", "32",
          "--samples", "16", "--repeats", "1", "--no-dali", "--torch-workers", "1", "--quiet",
          "--json", "bench.json"], cwd=user, env=_user_env(venv, user))
    report = json.loads((user / "bench.json").read_text())
    assert report["machine"]["fastload"] == __version__
    ran = {run["name"]: run["samples"] for run in report["runs"]}
    assert ran.get("fastload lmdb", 0) > 0, ran

    seen = _loop(venv, user)
    assert [Path(seen[k]).is_relative_to(purelib) for k in ("fastload", "converters", "metadata")] == [True] * 3, seen
    assert seen["batches"] == [[[8, 3, 32, 32], "torch.uint8", [8]]] * 2
    assert seen["decoder"].startswith("region decode" if _native_built_here() else "Pillow")


def test_without_a_compiler_the_sdist_installs_and_decodes_the_same_pixels_slower(dists, installed, user,
                                                                                   tmp_path_factory):
    wheels = tmp_path_factory.mktemp("no_compiler")
    # CC=/bin/false: every compile fails, as with no compiler or no libjpeg headers; the
    # extension is optional=True (setup.py), so the build goes on without it.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "--wheel-dir", str(wheels), str(dists[0])], cwd=wheels, env=_build_env(CC="/bin/false"))
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert not [n for n in archive.namelist() if n.startswith("fastload/decode/_jpeg_region.")]
    venv = wheels / "venv"
    purelib = _fresh_venv(venv, wheel)

    seen = _loop(venv, user)
    assert Path(seen["fastload"]).is_relative_to(purelib), seen
    # the word a user reads in `fastload bench` and `fastload doctor`'s header
    assert seen["decoder"].startswith("Pillow, whole images: slower"), seen["decoder"]
    assert "libjpeg-dev" in seen["decoder"] and "fastload-torch" in seen["decoder"]
    assert seen["digest"] == _loop(installed[0], user)["digest"]  # the same batches, to the bit
