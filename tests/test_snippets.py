"""Every fenced block of README.md and docs/*.md runs as written, and so does examples/train_resume.py.

What a block is, by its tag:

- ```python: run as a script of its own (a reader copies one block), in the page's work folder;
- ```sh, ```bash: each command line runs in bash, with the installed ``fastload`` first on PATH;
  ```console: the same for its ``$ ``-prefixed lines (the others are the output shown);
- ```text: not code: file trees, diagrams, output samples. A block with no tag, or a tag not
  listed here, fails ``test_every_block_is_classified``: say what it is, so none is dropped unseen.

A page's blocks run in order in one work folder (a reader following the page: a pack command makes
the dataset the next block opens), prepared with the small data the snippets name: an ImageFolder
at ./images, captions.jsonl, coco.jsonl (boxes) and ./seg (images with PNG masks beside them), plus
the datasets made from them by the pack commands the README's prose gives. The folder stands for
the clone after `make demo`: demo/images and demo/images.fl as the demo leaves them, and .venv
(the running venv) for `. .venv/bin/activate`. ``s3://bucket/...`` runs
against the tests' moto server: the bucket is made and emptied, folders a snippet names as a store
source (``s3://bucket/raw-images/``) hold some of ./images' files, and the client finds the server through
AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, as botocore reads them.

Command lines not run here, each with the reason (NOT_RUN).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO, make_jpeg, many_small_jpegs
from tests.remote.conftest import s3_server  # noqa: F401 - the session's moto server, for s3:// snippets
from tests.remote.s3_server import KEY, REGION, SECRET, S3Server

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN = {"python": "python", "sh": "shell", "bash": "shell", "console": "console"}
NOT_CODE = {"text"}
NOT_RUN = {
    "pip install": "installs from a package index; the tests run in the installed .venv",
    "make ": "builds .venv and installs (minutes, network); tests/test_readme.py checks the Makefile has "
             "each target the README names",
    "fastload bench": "times every loader for tens of seconds by design (15 s here on 256 pictures at its "
                      "shortest settings); tests/remote/test_remote_bench.py runs it on store URLs and "
                      "tests/benchmark/test_cli_bench.py on folders",
}
BIN = Path(sys.executable).parent  # the venv's bin: its `fastload` is the installed CLI
TIMEOUT = 600  # s, each command or block: a guard against a hang (the longest takes ~20 s here, quiet)
STORE_FOLDER_FILES = 16


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    tag: str
    body: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


_FENCE = re.compile(r"^(\s*)```(.*)$")


def fenced_blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, with their tags and (dedented) bodies."""
    blocks, lines = [], page.read_text().splitlines()
    k = 0
    while k < len(lines):
        opening = _FENCE.match(lines[k])
        if opening is None:
            k += 1
            continue
        indent, tag = opening.group(1), opening.group(2).strip()
        end = next((j for j in range(k + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{page.relative_to(REPO)}:{k + 1}: a ``` block that never closes"
        body = "\n".join(line.removeprefix(indent) for line in lines[k + 1:end])
        blocks.append(Block(page, k + 1, tag, body + "\n"))
        k = end + 1
    return blocks


def command_lines(block: Block) -> list[str]:
    """A shell block's commands (backslash continuations joined; comment-only lines left out)."""
    lines = block.body.splitlines()
    if RUN[block.tag] == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    commands, pending = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if command and not command.startswith("#"):
            commands.append(command)
    return commands


def not_run(command: str) -> str | None:
    return next((reason for prefix, reason in NOT_RUN.items() if command.startswith(prefix)), None)


def _to_run(block: Block) -> list[str]:
    return [command for command in command_lines(block) if not_run(command) is None]


# --- the data the snippets name ---------------------------------------------------------------------

def _png_mask(seed: int) -> bytes:
    mask = np.zeros((48, 64), np.uint8)
    mask[8 + seed % 8:30, 4:40 + seed % 16] = 1 + seed % 3  # class ids, 0 the background
    buf = io.BytesIO()
    Image.fromarray(mask).save(buf, format="PNG")
    return buf.getvalue()


def _write_lists(root: Path, count: int) -> None:
    """captions.jsonl and coco.jsonl over pics/, and seg/ (0001.jpg + 0001.png)."""
    (root / "pics").mkdir()
    (root / "seg").mkdir()
    captions, coco = [], []
    for i in range(count):
        (root / f"pics/{i}.jpg").write_bytes(make_jpeg(64, 48, seed=i))
        (root / f"seg/{i:04d}.jpg").write_bytes(make_jpeg(64, 48, seed=i))
        (root / f"seg/{i:04d}.png").write_bytes(_png_mask(i))
        captions.append({"path": f"pics/{i}.jpg", "caption": f"picture {i}", "tags": list(range(1 + i % 3))})
        k = 1 + i % 2
        coco.append({"path": f"pics/{i}.jpg", "boxes": [[4, 4, 30, 20], [10, 8, 60, 40]][:k],
                     "box_labels": [3, 17][:k]})
    (root / "captions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in captions))
    (root / "coco.jsonl").write_text("".join(json.dumps(row) + "\n" for row in coco))


# Datasets the README's Python blocks open but no block makes: each made by the command its prose gives.
PROSE_PACKS = ["fastload pack captions.jsonl -o captions.fl", "fastload pack coco.jsonl -o coco.fl",
               "fastload pack ./seg --sidecars --sidecar-names png=mask"]
DEMO_PACK = "fastload pack demo/images -o demo/images.fl"  # as the Makefile's demo target


def _link_venv(work: Path) -> None:
    """work/.venv: the running venv (its bin/activate puts BIN first on PATH), or where the tests run
    outside a venv, a stand-in whose activate does just that."""
    if (Path(sys.prefix) / "bin" / "activate").is_file():
        (work / ".venv").symlink_to(sys.prefix)
    else:
        (work / ".venv" / "bin").mkdir(parents=True)
        (work / ".venv" / "bin" / "activate").write_text(f'PATH="{BIN}:$PATH"\n')


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("snippet-data")
    many_small_jpegs(root / "images", 256, classes=2)  # one batch of the README's batch_size=256
    shutil.copytree(root / "images", root / "demo" / "images")  # what `make demo` leaves, packed by it
    _write_lists(root, 6)
    for command in [*PROSE_PACKS, DEMO_PACK]:
        _run_shell(command, root, _env(root, None), "test data")
    return root


def _env(work: Path, server: S3Server | None) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "XDG_CACHE_HOME": str(work / ".cache")}  # the default node cache stays in the work folder
    if server is not None:
        env.update(AWS_ENDPOINT_URL=server.endpoint_url, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET,
                   AWS_DEFAULT_REGION=REGION)
    return env


def _fill_store(server: S3Server, blocks: list[Block], images: Path) -> None:
    """Each bucket the blocks name, emptied; each prefix they name as a folder holds STORE_FOLDER_FILES
    of ./images' files (a source to pack: a few are enough)."""
    client = server.client()
    text = "\n".join(block.body if RUN[block.tag] == "python" else "\n".join(_to_run(block)) for block in blocks)
    for bucket in sorted(set(re.findall(r"s3://([\w.-]+)/", text))):
        if bucket not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            server.make_bucket(bucket)
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                client.delete_object(Bucket=bucket, Key=obj["Key"])
        for prefix in sorted(set(re.findall(rf"s3://{re.escape(bucket)}/([\w.-]+)/(?=[\s'\"])", text))):
            for path in sorted(images.rglob("*.jpg"))[:STORE_FOLDER_FILES]:
                client.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(images).as_posix()}",
                                  Body=path.read_bytes())


# --- running a block -------------------------------------------------------------------------------

def _run_shell(command: str, work: Path, env: dict[str, str], where: str) -> None:
    done = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    assert done.returncode == 0, (f"{where}: `{command}` exited with {done.returncode}:\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _run_python(block: Block, work: Path, env: dict[str, str]) -> None:
    script = work / f"snippet_{block.page.stem}_{block.line}.py"
    script.write_text(block.body)
    done = subprocess.run([sys.executable, script.name], cwd=work, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    assert done.returncode == 0, (f"{block.where}: the Python block failed (exit {done.returncode}):\n"
                                  f"{block.body}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _runnable(page: Path) -> list[Block]:
    return [block for block in fenced_blocks(page) if block.tag in RUN]


def test_every_block_is_classified():
    unclassified = [f"{block.where} (```{block.tag})" for page in PAGES for block in fenced_blocks(page)
                    if block.tag not in RUN and block.tag not in NOT_CODE]
    assert not unclassified, (
        f"fenced blocks with no known tag: {unclassified}; tag code ```python, ```sh or ```console (it runs "
        "in tests/test_snippets.py), and file trees, diagrams or output ```text")


def test_the_pages_have_snippets_to_run():
    # The extraction still finds what the pages hold (a changed fence style would find nothing).
    assert {block.tag for page in PAGES for block in _runnable(page)} >= {"python", "sh"}
    assert len(_runnable(REPO / "README.md")) >= 4
    readme = (REPO / "README.md").read_text()
    stale = [command for command in PROSE_PACKS if f"`{command}`" not in readme]
    assert not stale, f"the test data is packed with commands the README no longer gives: {stale}"


@pytest.mark.timeout(1800)  # a page's blocks in turn (the README's ~45 s beside a CPU hog): a hang guard
@pytest.mark.parametrize("page", [p for p in PAGES if _runnable(p)], ids=lambda p: p.name)
def test_the_snippets_of_a_page_run_as_written(page, prepared, tmp_path, request):
    blocks = _runnable(page)
    work = tmp_path / "work"
    shutil.copytree(prepared, work)
    _link_venv(work)
    server = None
    if any("s3://" in block.body for block in blocks):
        server = request.getfixturevalue("s3_server")
        _fill_store(server, blocks, work / "images")
    env = _env(work, server)
    for block in blocks:
        if RUN[block.tag] == "python":
            _run_python(block, work, env)
            continue
        for command in _to_run(block):
            _run_shell(command, work, env, block.where)


def test_the_command_lines_left_out_are_only_the_listed_kinds():
    # Each NOT_RUN entry still matches a line of the pages: a stale one would wait to hide a new
    # line that merely starts the same way.
    left_out = {not_run(command) for page in PAGES for block in _runnable(page) if RUN[block.tag] != "python"
                for command in command_lines(block)} - {None}
    assert left_out == set(NOT_RUN.values())


# --- examples/ -------------------------------------------------------------------------------------

def _trained(output: str, run: str) -> list[int]:
    line = next(line for line in output.splitlines() if line.startswith(f"{run} trained labels:"))
    return [int(word) for word in line.split(":", 1)[1].split()]


def test_the_train_checkpoint_resume_example_finishes_the_epoch_with_exactly_the_unseen_samples(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "examples" / "train_resume.py"), "--work", str(tmp_path),
                           "--samples", "40", "--batch-size", "8", "--stop-after", "2"],
                          capture_output=True, text=True, timeout=TIMEOUT, check=False, cwd=tmp_path)
    assert done.returncode == 0, f"examples/train_resume.py failed:\n{done.stdout}\n{done.stderr}"
    before, after = _trained(done.stdout, "first run"), _trained(done.stdout, "resumed run")
    assert len(before) == 16 and len(after) == 24
    assert sorted(before + after) == list(range(40)), "the two runs together are not the epoch, each sample once"
    assert (tmp_path / "checkpoint.pt").is_file()


def test_the_readme_and_the_loader_page_link_the_example():
    for page in (REPO / "README.md", REPO / "docs" / "loader.md"):
        assert "examples/train_resume.py" in page.read_text(), f"{page.name} does not link the example"
