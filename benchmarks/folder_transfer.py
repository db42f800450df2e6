"""Storage folders: a file's upload and download through the API, and a big folder's
listing.

A real hub (the shipped config) with the real queue service behind its proxy. One user uploads a
file of `--size` MiB into a folder in the Storage page's way, 8 MiB chunks one after another
(`PUT api/folders/{id}/files/{path}?offset=N`), then downloads it (`GET`), both through the hub's
proxy as a browser would; then a folder of `--files` files is listed (`GET .../files/`), p50 of
`--rounds` listings.

Baseline, in the same run: `cp` of the same file on the same disk (what the upload at best could
be), and `ls -l` of the same directory (a listing with each file's size and time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import requests

from queue_service.handlers.folders import CHUNK_BYTES
from tests.harness import running_hub

MIB = 1024 * 1024


def make_file(path: Path, size: int) -> None:
    block = os.urandom(MIB)
    with open(path, "wb") as f:
        for _ in range(size // MIB):
            f.write(block)


def upload(http: requests.Session, url: str, path: Path) -> float:
    """Seconds to send the file in chunks, one request per chunk."""
    start = time.perf_counter()
    offset = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            answer = http.put(
                f"{url}?offset={offset}",
                data=chunk,
                headers={"Content-Type": "application/octet-stream"},
                timeout=120,
            )
            assert answer.status_code in (200, 201), answer.text
            offset += len(chunk)
    return time.perf_counter() - start


def download(http: requests.Session, url: str, size: int) -> float:
    start = time.perf_counter()
    received = 0
    with http.get(url, stream=True, timeout=120) as answer:
        assert answer.status_code == 200, answer.text
        for chunk in answer.iter_content(MIB):
            received += len(chunk)
    assert received == size, (received, size)
    return time.perf_counter() - start


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="MiB to upload and download")
    parser.add_argument("--files", type=int, default=10_000, help="files in the listed folder")
    parser.add_argument("--rounds", type=int, default=5, help="listings to time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_hub(Path(tmp) / "hub") as hub:
        hub.create_user("bench")
        http = requests.Session()
        http.headers["Authorization"] = f"token {hub.user_token('bench')}"
        api = f"{hub.url}/services/queue/api/folders"
        folder = http.post(api, json={"name": "data"}, timeout=60).json()
        source = Path(tmp) / "source.bin"
        make_file(source, args.size * MIB)
        size = source.stat().st_size
        url = f"{api}/{folder['id']}/files/big.bin"
        up, down = upload(http, url, source), download(http, url, size)
        copy = timed(["cp", str(source), str(Path(tmp) / "copy.bin")])
        many = http.post(api, json={"name": "many"}, timeout=60).json()
        directory = hub.workdir / "fgpu-folders" / many["id"]
        for n in range(args.files):
            (directory / f"file-{n:05d}.txt").write_text("x")
        listings, ls = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            answer = http.get(f"{api}/{many['id']}/files/", timeout=120)
            listings.append(time.perf_counter() - start)
            assert len(answer.json()["entries"]) == args.files
            ls.append(timed(["ls", "-l", str(directory)]))
    mb = size / MIB
    print(f"upload   {mb:.0f} MiB in {up:.2f} s: {mb / up:.0f} MiB/s (cp: {mb / copy:.0f} MiB/s)")
    print(f"download {mb:.0f} MiB in {down:.2f} s: {mb / down:.0f} MiB/s")
    print(f"ratio to cp: upload {copy / up:.2f}, download {copy / down:.2f}")
    p50, ls50 = statistics.median(listings), statistics.median(ls)
    print(f"listing {args.files} files: p50 {p50 * 1000:.0f} ms (ls -l: {ls50 * 1000:.0f} ms)")
    print(f"ratio to ls -l: {p50 / ls50:.1f}")


if __name__ == "__main__":
    main()
