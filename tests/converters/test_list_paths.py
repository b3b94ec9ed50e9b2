"""Where a pack reads (issue 24, item 9): a file list's paths and file columns stay inside the list's
folder (or ``--root``), symlinks resolved; absolute or escaping paths need ``--allow-outside-root``;
/proc, /sys and /dev are never read, whatever the options, from a list, a link, or a folder."""

from __future__ import annotations

import json
import os

import pytest

from fastload.converters import pack
from fastload.errors import SourceError
from tests.conftest import make_jpeg, write_tree
from tests.converters.test_file_fields import mask_png

SECRET = b"AWS_SECRET_ACCESS_KEY=not-for-any-dataset"
ENVIRON_MARK = "FASTLOAD_TEST_ENVIRON_MARK"


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """``data/`` holding the list's folder ``lists/`` (images, a mask, links pointing out of it) and
    a folder beside it; ``secret/`` outside data/ holding a credential and an image."""
    top = tmp_path_factory.mktemp("paths")
    write_tree(top, {"data/lists/0.jpg": make_jpeg(40, 30, seed=0), "data/lists/0.png": mask_png(40, 30, 0),
                     "data/img/1.jpg": make_jpeg(40, 30, seed=1), "secret/key.jpg": SECRET,
                     "secret/2.jpg": make_jpeg(40, 30, seed=2)})
    lists = top / "data" / "lists"
    (lists / "inside-link.jpg").symlink_to(top / "secret" / "key.jpg")  # a link inside pointing out
    (lists / "environ-link.jpg").symlink_to("/proc/self/environ")
    (lists / "proc-link").symlink_to("/proc/self")
    return top


def write_list(folder, rows: list[dict]) -> object:
    path = folder / f"list-{abs(hash(json.dumps(rows))) % 10**8}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def shard_bytes(out) -> bytes:
    return b"".join(p.read_bytes() for p in out.iterdir() if p.name.startswith("shard-"))


@pytest.mark.parametrize("raw", ["../img/1.jpg", "SECRET/2.jpg", "inside-link.jpg", "../../secret/key.jpg",
                                 "/etc/passwd"], ids=["dotdot", "absolute", "link-out", "dotdot-secret", "etc"])
def test_a_list_path_outside_its_folder_is_refused_or_skipped(tree, tmp_path, raw):
    raw = raw.replace("SECRET", str(tree / "secret"))
    listed = write_list(tree / "data" / "lists", [{"path": "0.jpg"}, {"path": raw}])
    with pytest.raises(SourceError, match=rf":2: path {raw!r}: resolves to .*, outside .*lists, where the list's "
                                          "paths must stay; .*--allow-outside-root, or pass --on-error skip"):
        pack(listed, tmp_path / "a.fl", progress=False)
    report = pack(listed, tmp_path / "b.fl", on_error="skip", progress=False)
    assert report.num_records == 1 and [s.rel for s in report.skipped_files] == [os.path.normpath(raw)]
    assert SECRET not in shard_bytes(tmp_path / "b.fl")


def test_root_widens_the_folder_and_allow_outside_root_lifts_it(tree, tmp_path):
    listed = write_list(tree / "data" / "lists", [{"path": "0.jpg"}, {"path": "../img/1.jpg"}])
    assert pack(listed, tmp_path / "a.fl", root=tree / "data", progress=False).num_records == 2
    outside = write_list(tree / "data" / "lists", [{"path": "0.jpg"}, {"path": str(tree / "secret" / "2.jpg")}])
    with pytest.raises(SourceError, match="outside"):
        pack(outside, tmp_path / "b.fl", root=tree / "data", progress=False)
    assert pack(outside, tmp_path / "c.fl", allow_outside_root=True, progress=False).num_records == 2


@pytest.mark.parametrize("raw", ["/proc/self/environ", "environ-link.jpg", "proc-link/environ",
                                 "/sys/kernel/mm/transparent_hugepage/enabled"],
                         ids=["proc", "link-to-proc", "folder-link-to-proc", "sys"])
def test_kernel_files_are_never_packed_even_when_outside_is_allowed(tree, tmp_path, monkeypatch, raw):
    monkeypatch.setenv(ENVIRON_MARK, "1")  # in /proc/self/environ, were it read
    if not os.path.isfile(os.path.realpath(tree / "data" / "lists" / raw)):
        pytest.skip(f"{raw} does not exist on this machine")
    listed = write_list(tree / "data" / "lists", [{"path": "0.jpg"}, {"path": raw}])
    with pytest.raises(SourceError, match=rf":2: path {raw!r}: resolves to /(proc|sys)/.*: a kernel file system, "
                                          "never packed whatever the options"):
        pack(listed, tmp_path / "a.fl", allow_outside_root=True, progress=False)
    report = pack(listed, tmp_path / "b.fl", allow_outside_root=True, on_error="skip", progress=False)
    assert report.num_records == 1 and ENVIRON_MARK.encode() not in shard_bytes(tmp_path / "b.fl")


@pytest.mark.parametrize("raw, allow, reason", [
    ("../../secret/key.jpg", False, "outside"),
    ("inside-link.jpg", False, "outside"),
    ("/proc/self/environ", True, "a kernel file system, never packed"),
    ("environ-link.jpg", True, "a kernel file system, never packed"),
], ids=["dotdot", "link-out", "proc", "link-to-proc"])
def test_file_columns_are_confined_like_paths(tree, tmp_path, monkeypatch, raw, allow, reason):
    monkeypatch.setenv(ENVIRON_MARK, "1")
    listed = write_list(tree / "data" / "lists", [{"path": "0.jpg", "mask": "0.png"},
                                                  {"path": "0.jpg", "mask": raw}])
    with pytest.raises(SourceError, match=rf"0\.jpg: its 'mask' file {raw!r} resolves to .*{reason}"):
        pack(listed, tmp_path / "a.fl", file_columns=("mask",), allow_outside_root=allow, progress=False)
    report = pack(listed, tmp_path / "b.fl", file_columns=("mask",), allow_outside_root=allow, on_error="skip",
                  progress=False)
    assert report.num_records == 1 and len(report.skipped_files) == 1
    assert SECRET not in shard_bytes(tmp_path / "b.fl")
    assert ENVIRON_MARK.encode() not in shard_bytes(tmp_path / "b.fl")


def test_a_folder_never_packs_kernel_files_through_its_links(tree, tmp_path, monkeypatch):
    """A folder follows its links (documented), but never into /proc: not a linked file, not a linked
    folder (/proc/self/root is all of /), not a sidecar."""
    monkeypatch.setenv(ENVIRON_MARK, "1")
    src = tmp_path / "src"
    write_tree(src, {"a.txt": b"a text", "0.jpg": make_jpeg(40, 30)})
    (src / "env.txt").symlink_to("/proc/self/environ")
    (src / "sub").mkdir()
    (src / "sub" / "proc").symlink_to("/proc/self")
    report = pack(src, tmp_path / "a.fl", extensions=[".txt"], layout="flat", on_error="skip", progress=False)
    assert report.num_records == 1
    assert sorted((s.rel, s.reason.split(" (")[0]) for s in report.skipped_files) == [
        ("env.txt", "lies in a kernel file system"), ("sub/proc", "lies in a kernel file system")]
    assert ENVIRON_MARK.encode() not in shard_bytes(tmp_path / "a.fl")
    for name in ("a.txt", "env.txt", "sub/proc"):
        (src / name).unlink()
    (src / "0.txt").symlink_to("/proc/self/environ")  # a sidecar of 0.jpg: its text would be a field
    with pytest.raises(SourceError, match=r"0\.txt: cannot be read \(lies in a kernel file system"):
        pack(src, tmp_path / "b.fl", sidecars=True, layout="flat", progress=False)


def test_the_cli_takes_root_and_allow_outside_root(tree, tmp_path, cli):
    listed = write_list(tree / "data" / "lists", [{"path": "0.jpg"}, {"path": "../img/1.jpg"}])
    refused = cli("pack", listed, "-o", tmp_path / "a.fl", "--quiet")
    assert refused.rc == 2 and "outside" in refused.err and "--allow-outside-root" in refused.err
    assert cli("pack", listed, "-o", tmp_path / "b.fl", "--quiet", "--root", tree / "data").rc == 0
    assert cli("pack", listed, "-o", tmp_path / "c.fl", "--quiet", "--allow-outside-root").rc == 0
    folder = cli("pack", tree / "data" / "img", "-o", tmp_path / "d.fl", "--quiet", "--root", tree)
    assert folder.rc == 2 and "--root and --allow-outside-root are for" in folder.err
