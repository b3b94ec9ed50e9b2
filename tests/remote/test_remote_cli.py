"""The command line with store URLs: pack to a store, info and verify it, with --storage-option."""

from __future__ import annotations

import json

from tests.conftest import make_jpeg, run_fastload


def _options(server) -> list[str]:
    args = []
    for key, value in server.storage_options().items():
        args += ["--storage-option", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
    return args


def test_pack_info_verify_a_dataset_in_the_store(tmp_path, s3_server, s3_bucket):
    src = tmp_path / "flat"
    src.mkdir()
    for i in range(12):
        (src / f"{i:02d}.jpg").write_bytes(make_jpeg(40, 30, seed=i))
    (src / "05.jpg").write_bytes(b"not a jpeg")
    url = f"s3://{s3_bucket}/flat.fl"
    opts = _options(s3_server)
    done = run_fastload("pack", src, "-o", url, "--on-error", "skip", "--staging", tmp_path / "stage", *opts)
    assert done.returncode == 0, done.stderr
    assert "packed 11 records" in done.stdout and url in done.stdout and "skipped 1" in done.stdout
    text = run_fastload("info", url, *opts)
    assert text.returncode == 0 and "in the store)" in text.stdout, text.stderr
    info = run_fastload("info", url, "--json", *opts)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["records"] == 11 and json.loads(info.stdout)["packed"]["skipped"] == 1
    verify = run_fastload("verify", url, "--decode", *opts)
    assert verify.returncode == 0 and "OK: 11 of 11 records checked and decoded" in verify.stdout
    missing = run_fastload("info", f"s3://{s3_bucket}/none.fl", *opts)
    assert missing.returncode == 2 and "no manifest.json there" in missing.stderr
    bad = run_fastload("info", url, "--storage-option", "anon")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
