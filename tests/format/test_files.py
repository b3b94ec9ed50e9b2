"""fastload.format.files: regular files only, bounded reads, and no write through a link."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastload.format.files import create_new, ensure_dir, read_fd, read_regular, write_new


def test_read_regular_reads_a_regular_file_up_to_its_limit(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 100)
    assert read_regular(tmp_path / "f", 100) == b"x" * 100
    with pytest.raises(OSError, match="100 bytes, over the limit of 99 bytes"):
        read_regular(tmp_path / "f", 99)


def test_read_fd_judges_the_size_at_read_time_not_at_open_time(tmp_path):
    path = tmp_path / "growing"
    path.write_bytes(b"a" * 10)
    fd = os.open(path, os.O_RDONLY)
    try:
        with open(path, "ab") as more:  # grew after it was opened (and checked) as a 10-byte file
            more.write(b"b" * 5000)
        with pytest.raises(OSError, match="over the limit of 1000 bytes"):
            read_fd(fd, 1000)
    finally:
        os.close(fd)


@pytest.mark.timeout(20)
def test_read_regular_refuses_a_fifo_without_blocking_and_a_link_to_a_device(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    os.symlink("/dev/zero", tmp_path / "zero")
    with pytest.raises(OSError, match=r"not a regular file \(a FIFO\)"):
        read_regular(tmp_path / "fifo", 1 << 20)
    with pytest.raises(OSError, match=r"not a regular file \(a character device\)"):
        read_regular(tmp_path / "zero", 1 << 20)


def test_a_refused_huge_sparse_file_costs_no_memory(tmp_path):
    path = tmp_path / "sparse"
    with open(path, "wb") as f:
        f.truncate(3 * 2**30)
    code = ("import sys; from fastload.format.files import read_regular\n"
            "try: read_regular(sys.argv[1], 2**20)\nexcept OSError as e: print(e.strerror)\n"
            # VmHWM: this process's own peak; ru_maxrss would carry pytest's across the exec
            "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[0] == f"{3 * 2**30} bytes, over the limit of {2**20} bytes"
    assert int(out[1]) < 1024 * 1024  # KiB: the interpreter and its imports, not 3 GB


def test_create_new_replaces_a_planted_link_and_never_writes_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, tmp_path / "out.tmp")
    write_new(tmp_path / "out.tmp", b"ours")
    assert victim.read_bytes() == b"precious"
    assert not (tmp_path / "out.tmp").is_symlink() and (tmp_path / "out.tmp").read_bytes() == b"ours"
    (tmp_path / "adir").mkdir()
    with pytest.raises(IsADirectoryError):
        create_new(tmp_path / "adir")


def test_ensure_dir_refuses_a_link_to_a_folder(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "index")
    with pytest.raises(NotADirectoryError, match="is a symbolic link, not a folder"):
        ensure_dir(tmp_path / "index")
    ensure_dir(tmp_path / "real")
    ensure_dir(tmp_path / "real")  # an existing real folder is fine
    assert (tmp_path / "real").is_dir()
