"""Joining a Ray cluster, or a clear error within the documented time (docs/ray.md: 5 s): Ray
missing; an address where nothing listens; an address where something listens that is not Ray
(a real TCP server that accepts and says nothing, or answers as a web server does), for
``DataLoader(mode="ray", ray_address=...)`` and ``fastload pack --ray --ray-address`` alike
(issue 44, item 9); the package cluster's own head passes the same check; a script whose loader
is alive at its end ends quietly."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, many_small_jpegs
from tests.loading.helpers import write_id_list

ray = pytest.importorskip("ray", reason="the Ray tests need ray[data]: pip install -e '.[ray]'")

from fastload.converters import pack

from fastload.errors import ClusterUnreachableError
from fastload.loading.ray_connect import probe

BOUND_S = 60  # what a refusal may take here at most, on a busy machine (the code allows itself 5 s)


class Listener:
    """A TCP server on 127.0.0.1 that is not Ray: it accepts, then says ``answer`` (or nothing)."""

    def __init__(self, answer: bytes) -> None:
        self.answer, self.held = answer, []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            self.held.append(conn)  # kept open, as a server that never answers keeps it
            if self.answer:
                conn.sendall(self.answer)

    def close(self) -> None:
        self.server.close()
        for conn in self.held:
            conn.close()


@pytest.fixture(scope="module")
def listeners() -> Iterator[dict[str, Listener]]:
    made = {"silent": Listener(b""), "web": Listener(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")}
    yield made
    for listener in made.values():
        listener.close()


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("ray-connect")
    pack(write_id_list(base / "pictures", 8), base / "ids.fl", workers=1, progress=False)
    many_small_jpegs(base / "images", 4, classes=2)
    return base / "ids.fl"


def _run(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_the_clusters_own_head_passes_the_check(cluster: Any) -> None:
    probe(cluster.address, subject="ray_address", how="")  # a Ray GCS: accepted, nothing raised


def test_a_web_server_is_refused_naming_the_address(listeners: dict[str, Listener]) -> None:
    address = listeners["web"].address  # the silent one: in a script below, beside the others
    refused = (rf"ray_address='{address}': something listens there but it is not a Ray cluster's head \(it "
               r"began with b'HTTP/1.1 ', not the HTTP/2 SETTINGS frame Ray's GCS \(a gRPC server\) begins with\)")
    with pytest.raises(ClusterUnreachableError, match=refused):
        probe(address, subject="ray_address", how="")


def test_ray_missing_or_no_cluster_is_a_clear_error_and_a_script_ends_quietly(cluster: Any, packed: Path,
                                                                             listeners: dict[str, Listener]) -> None:
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    not_ray = listeners["silent"].address
    missing = _run(f"""
        import sys
        sys.modules["ray"] = None
        import fastload
        ds = fastload.PackedDataset({str(packed)!r}, image_size=32, train=True)
        try:
            fastload.DataLoader(ds, batch_size=4, mode="ray", num_workers=1)
        except ImportError as exc:
            print(type(exc).__name__, exc)
        """)
    unreachable = _run(f"""
        import fastload
        from fastload.cli import main
        ds = fastload.PackedDataset({str(packed)!r}, image_size=32, train=True)
        for address in ("127.0.0.1:{port}", {not_ray!r}):
            try:
                fastload.DataLoader(ds, batch_size=4, mode="ray", num_workers=1, ray_address=address)
            except ConnectionError as exc:
                print(type(exc).__name__, exc)
            print("pack exit status", main(["pack", {str(packed.parent / "images")!r}, "-o",
                                            {str(packed.parent / "out.fl")!r}, "--ray", "--ray-address", address]))
        """)
    ending = _run(f"""
        import fastload
        ds = fastload.PackedDataset({str(packed)!r}, image_size=32, train=True)
        loader = fastload.DataLoader(ds, batch_size=4, mode="ray", num_workers=1, ray_address={cluster.address!r})
        print(len(next(iter(loader))[1]), "samples")
        """)  # and the script ends with its loader (and actor) alive
    said = [p.communicate(timeout=240 if p is ending else BOUND_S)[0] for p in (missing, unreachable, ending)]
    assert ending.returncode == 0 and said[2].strip().splitlines()[-1] == "4 samples", said[2]
    assert "Traceback" not in said[2] and "Exception ignored" not in said[2], said[2]
    assert said[0].startswith("MissingDependencyError DataLoader(mode='ray') (decoding on a Ray cluster) "
                              "needs the ray[data] package"), said[0]
    assert "pip install ray[data]" in said[0]
    lines = said[1].splitlines()
    assert lines[0].startswith(f"ClusterUnreachableError ray_address='127.0.0.1:{port}': no Ray cluster is "
                               "reachable there"), said[1]
    assert "ray start --head" in lines[0]
    assert f"Ray address='127.0.0.1:{port}': no Ray cluster is reachable there" in said[1]
    assert lines[3].startswith(f"ClusterUnreachableError ray_address='{not_ray}': something listens there but "
                               "it is not a Ray cluster's head (it sent nothing within 5 s"), said[1]
    assert f"Ray address='{not_ray}': something listens there but it is not a Ray cluster's head" in said[1]
    assert [line for line in lines if line.startswith("pack exit status")] == ["pack exit status 2"] * 2, said[1]
