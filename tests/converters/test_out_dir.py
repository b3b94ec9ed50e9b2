"""What a pack may delete, replace and write in OUT: only fastload's own files, a finished dataset
replaced only once its successor is complete, and nothing ever written through a link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fastload.converters import pack
from fastload.converters.destination.out_dir import prepare_out
from fastload import PackedDataset
from fastload.errors import PackError, SourceError
from fastload.format import read_manifest
from fastload.verifier import verify
from tests.conftest import imagefolder_files, make_jpeg, run_unprivileged, write_tree


@pytest.fixture
def src(tmp_path: Path) -> Path:
    write_tree(tmp_path / "src", imagefolder_files({"a": 4, "b": 3}))
    return tmp_path / "src"


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (links as their target text), for before/after comparisons."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            found[rel] = b"-> " + os.readlink(path).encode()
        elif path.is_file():
            found[rel] = path.read_bytes()
    return found


# --- 1. --overwrite deletes only what a fastload manifest lists -------------------------------------

def test_overwrite_refuses_a_folder_whose_manifest_is_not_fastloads(tmp_path, src):
    webapp = tmp_path / "webapp"
    write_tree(webapp, {"manifest.json": b'{"name": "my web app", "start_url": "/"}',
                        "index/app.js": b"console.log(1)", "shard-00000.lmdb": b"user data",
                        "shard-logo.png": b"png"})
    before = tree(webapp)
    with pytest.raises(PackError) as err:
        pack(src, webapp, overwrite=True, progress=False)
    assert "is not a readable fastload manifest" in str(err.value)
    assert "--overwrite" not in str(err.value).split(";")[-1]  # the advice does not invite it
    assert tree(webapp) == before


def test_a_folder_without_manifest_but_with_shard_like_names_is_not_taken_for_an_unfinished_pack(tmp_path, src):
    mine = tmp_path / "mine"
    write_tree(mine, {"shard-notes.txt": b"mine", "index/readme.md": b"mine"})
    before = tree(mine)
    with pytest.raises(PackError, match="holds other files"):
        pack(src, mine, progress=False)
    assert tree(mine) == before


@pytest.mark.parametrize("files", [{"index/labels.npy": b"\x93NUMPY mine"}, {"shard-00000.lmdb": b"mine"},
                                   {".pack/notes.txt": b"mine"}, {".pack/shard-00000.json": b"{}"}])
def test_a_folder_fastload_did_not_make_is_never_resumed_into(tmp_path, src, files):
    """Names fastload uses, with no owner file of fastload's pack (.pack/owner.json), are the user's."""
    mine = tmp_path / "mine"
    write_tree(mine, files)
    before = tree(mine)
    with pytest.raises(PackError, match="not taken for an unfinished pack|holds other files"):
        pack(src, mine, progress=False)
    assert tree(mine) == before


@pytest.mark.parametrize("files", [{".pack/": None}, {".pack/owner.json": b""}, {".pack/owner.json": b'{"made_by'},
                                   {".pack/owner.json.tmp": b'{"made'}])
def test_a_pack_killed_before_its_owner_file_was_whole_packs_there_again(tmp_path, src, files):
    """Killed between making .pack and writing its owner file (a node lost under a Ray task's part
    did it): nothing but that is in OUT, so a new pack takes the folder instead of refusing it."""
    out = tmp_path / "out"
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            (out / name).mkdir()
        else:
            (out / name).write_bytes(data)
    pack(src, out, progress=False)
    assert verify(out).ok and len(PackedDataset(out)) == 7


def test_a_pack_folder_holding_a_file_of_the_users_in_its_journal_is_refused(tmp_path, src):
    out = tmp_path / "out"
    prepare_out(out)
    write_tree(out, {".pack/notes.txt": b"mine"})
    with pytest.raises(PackError, match="holds other files"):
        pack(src, out, progress=False)
    assert (out / ".pack" / "notes.txt").read_bytes() == b"mine"


def test_overwrite_refuses_a_dataset_folder_that_also_holds_other_files(tmp_path, src):
    out = tmp_path / "out"
    pack(src, out, progress=False)
    write_tree(out, {"notes.txt": b"keep me", "index/extra.npy": b"keep me too"})
    write_tree(src, {"a/new.jpg": make_jpeg(seed=9)})
    with pytest.raises(PackError) as err:
        pack(src, out, overwrite=True, progress=False)
    assert "notes.txt" in str(err.value) and "index/extra.npy" in str(err.value)
    assert (out / "notes.txt").read_bytes() == b"keep me"
    assert verify(out).ok


def test_overwrite_deletes_exactly_the_old_datasets_files(tmp_path, src):
    out = tmp_path / "out"
    pack(src, out, shard_size="2KB", progress=False)
    old_shards = {s.file for s in read_manifest(out).shards}
    (src / "b" / "001.jpg").unlink()
    report = pack(src, out, shard_size="50KB", overwrite=True, progress=False)
    assert report.num_records == 6 and not report.already_packed
    manifest = read_manifest(out)
    assert sorted(os.listdir(out)) == sorted(["manifest.json", "index", *[s.file for s in manifest.shards]])
    assert len(old_shards) > len(manifest.shards)
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]  # no staging or old folder left beside it
    assert verify(out).ok


# --- 2. the old dataset stays readable until the new one is complete ---------------------------------

def test_a_replacement_that_fails_leaves_the_old_dataset_whole(tmp_path, src):
    out = tmp_path / "out"
    pack(src, out, progress=False)
    before = tree(out)
    write_tree(src, {"b/zz-broken.jpg": make_jpeg(seed=3)[:200]})
    with pytest.raises(SourceError, match="zz-broken.jpg"):
        pack(src, out, overwrite=True, progress=False)
    assert tree(out) == before
    assert verify(out).ok and len(PackedDataset(out)) == 7
    (src / "b" / "zz-broken.jpg").unlink()
    write_tree(src, {"b/zz-fixed.jpg": make_jpeg(seed=4)})
    assert pack(src, out, overwrite=True, progress=False).num_records == 8  # then it is replaced
    assert len(PackedDataset(out)) == 8 and sorted(os.listdir(tmp_path)) == ["out", "src"]


def test_a_reader_opened_before_the_swap_keeps_reading_the_old_dataset(tmp_path, src):
    out = tmp_path / "out"
    pack(src, out, progress=False)
    old = PackedDataset(out)
    old_first = old.record(0)["data"]
    (src / "a" / "000.jpg").write_bytes(make_jpeg(seed=77))
    pack(src, out, overwrite=True, progress=False)
    assert old.record(0)["data"] == old_first  # its open shard files went with the old folder
    assert PackedDataset(out).record(0)["data"] == make_jpeg(seed=77)


# --- an identical re-run says "already packed" -------------------------------------------------------

def test_rerunning_the_same_pack_is_already_packed(tmp_path, src, cli):
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out).rc == 0
    before = tree(out)
    result = cli("pack", src, "-o", out)
    assert result.rc == 0 and "already packed" in result.out + result.err
    assert tree(out) == before
    write_tree(src, {"a/new.jpg": make_jpeg(seed=5)})
    result = cli("pack", src, "-o", out)
    assert result.rc == 2 and "already holds a finished dataset" in result.err and "--overwrite" in result.err


def test_a_finished_dataset_keeps_no_lock_file(tmp_path, src):
    out = tmp_path / "out"
    pack(src, out, progress=False)
    assert not (out / ".pack.lock").exists() and not (out / ".pack").exists()


# --- 3. nothing is written through a link planted in OUT ------------------------------------------

@pytest.mark.parametrize("name", [".pack.lock", ".pack.write-test", "manifest.json.tmp", "skipped.jsonl.tmp"])
def test_a_link_planted_at_a_working_file_is_never_written_through(tmp_path, src, name):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / name)
    try:
        pack(src, out, progress=False)
    except PackError as exc:
        assert "symbolic link" in str(exc) and name in str(exc)
    else:
        assert verify(out).ok
    assert victim.read_bytes() == b"precious"


@pytest.mark.parametrize("name", ["index", ".pack"])
def test_a_linked_folder_planted_in_out_is_never_written_into(tmp_path, src, name):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(elsewhere, out / name)
    with pytest.raises(PackError, match="symbolic link"):
        pack(src, out, progress=False)
    assert os.listdir(elsewhere) == []


def test_links_planted_at_shard_and_index_names_are_replaced_not_followed(tmp_path, src):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    out = tmp_path / "out"
    prepare_out(out)  # a folder fastload's pack made (.pack/owner.json), then links planted in it
    (out / "index").mkdir(parents=True)
    for name in ["shard-00000.lmdb", "index/label.npy", ".pack/shard-00000.lmdb.tmp",
                 ".pack/shard-00000.json", "index/label.npy.tmp"]:
        os.symlink(victim, out / name)
    pack(src, out, progress=False)
    assert victim.read_bytes() == b"precious"
    assert verify(out).ok and not any(p.is_symlink() for p in out.rglob("*"))


def test_an_identical_rerun_onto_read_only_media_is_already_packed(world_tmp):
    """Said before any lock is taken: a lock file cannot be made on read-only media."""
    src, out = world_tmp / "src", world_tmp / "out"
    write_tree(src, imagefolder_files({"a": 3}))
    pack(src, out, progress=False)
    for path in [out, *out.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    before = tree(out)
    result = run_unprivileged(["pack", src, "-o", out])
    assert result.rc == 0 and "already packed" in result.out + result.err, result.out + result.err
    assert tree(out) == before


def test_overwrites_summary_names_the_skipped_report_where_it_now_is(tmp_path, src, cli):
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out).rc == 0
    write_tree(src, {"b/zz-broken.jpg": b"not a jpeg"})
    result = cli("pack", src, "-o", out, "--overwrite", "--on-error", "skip")
    assert result.rc == 0, result.err
    assert f"skipped files listed in {out / 'skipped.jsonl'}" in result.out + result.err
    assert (out / "skipped.jsonl").is_file() and "fastload-new" not in result.out + result.err
