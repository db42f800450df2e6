"""Storage folders: a file's upload and download through the API, and a big folder's
listing.

A real hub (the shipped config) with the real queue service behind its proxy. One user uploads a
file of `--size` MiB into a folder in the Storage page's way (storage.js): 8 MiB chunks, the first
starting a parallel upload (`PUT api/folders/{id}/files/{path}?offset=0&size=S`), the others
`--parallel` at once (`?offset=N&upload=ID`); then the same file one chunk after another
(`?offset=N`, the page's way before); then downloads it (`GET`), all through the hub's proxy as a
browser would; then a folder of `--files` files is listed (`GET .../files/`), p50 of `--rounds`
listings.

Baseline, in the same run: `cp` of the same file on the same disk (what the upload at best could
be), and `ls -l` of the same directory (a listing with each file's size and time).

Where the time goes: the CPU seconds the queue service, the hub's proxy
(configurable-http-proxy) and the hub spent on each transfer, read from /proc. On a shared
machine the wall-clock figures follow the neighbours' load; these do not, and say what a
dedicated core would reach (MiB per CPU second).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
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


def put(http: requests.Session, url: str, chunk: bytes) -> dict:
    answer = http.put(
        url, data=chunk, headers={"Content-Type": "application/octet-stream"}, timeout=120
    )
    assert answer.status_code in (200, 201), answer.text
    return answer.json()


def cpu_seconds(queue_port: str) -> dict[str, float]:
    """CPU seconds (user + system) so far of the hub, its proxy and its queue service: the
    processes that know the service's port (the hub and the proxy from their environment, the
    service from its own URL)."""
    found = dict.fromkeys(("service", "proxy", "hub"), 0.0)
    tick = os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            environment = Path(f"/proc/{pid}/environ").read_bytes()
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if f"FGPU_QUEUE_PORT={queue_port}".encode() not in environment and (
            f":{queue_port}".encode() not in environment
        ):
            continue
        kind = next(
            (
                k
                for k, name in (
                    ("proxy", b"configurable-http-proxy"),
                    ("service", b"queue_service"),
                    ("hub", b"bin/jupyterhub"),
                )
                if name in command
            ),
            None,
        )
        if kind is not None:
            found[kind] += (int(fields[11]) + int(fields[12])) / tick
    return found


def measured(queue_port: str, transfer) -> tuple[float, dict[str, float]]:
    """Seconds `transfer()` took, and the CPU seconds each process spent meanwhile."""
    before = cpu_seconds(queue_port)
    seconds = transfer()
    after = cpu_seconds(queue_port)
    return seconds, {k: after[k] - before[k] for k in after}


def upload_parallel(http: requests.Session, url: str, path: Path, lanes: int) -> float:
    """Seconds to send the file as the Storage page does: the first chunk, then the others
    `lanes` at once (one connection each)."""
    size = path.stat().st_size
    sessions = [requests.Session() for _ in range(lanes)]
    for session in sessions:
        session.headers.update(http.headers)

    def send(lane: int, offsets: list[int], upload: str) -> bool:
        complete = False
        with open(path, "rb") as f:
            for offset in offsets:
                f.seek(offset)
                chunk = f.read(CHUNK_BYTES)
                answer = put(sessions[lane], f"{url}?offset={offset}&upload={upload}", chunk)
                complete = complete or answer["complete"]
        return complete

    start = time.perf_counter()
    with open(path, "rb") as f:
        first = put(http, f"{url}?offset=0&size={size}", f.read(CHUNK_BYTES))
    if "upload" not in first:  # a service without parallel uploads (to compare with one)
        return math.nan
    offsets = list(range(CHUNK_BYTES, size, CHUNK_BYTES))
    with ThreadPoolExecutor(max_workers=lanes) as pool:
        done = pool.map(
            lambda lane: send(lane, offsets[lane::lanes], first["upload"]), range(lanes)
        )
        assert first["complete"] or any(list(done))
    return time.perf_counter() - start


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


def list_all(http: requests.Session, url: str) -> int:
    """Entries of a directory, read a page of at most 5,000 at a time as the API gives them."""
    count, after = 0, ""
    while True:
        answer = http.get(url, params={"limit": 5000, "after": after}, timeout=120).json()
        count += len(answer["entries"])
        if not answer["next"]:
            return count
        after = answer["next"]


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="MiB to upload and download")
    parser.add_argument("--files", type=int, default=10_000, help="files in the listed folder")
    parser.add_argument("--rounds", type=int, default=5, help="listings to time")
    parser.add_argument("--parallel", type=int, default=4, help="chunks sent at once")
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
        port = hub.env["FGPU_QUEUE_PORT"]
        up, up_cpu = measured(port, lambda: upload_parallel(http, url, source, args.parallel))
        one_by_one, one_cpu = measured(port, lambda: upload(http, url, source))
        down, down_cpu = measured(port, lambda: download(http, url, size))
        # The fastest of three: one `cp` swings several times with the neighbours' load.
        copy = min(timed(["cp", str(source), str(Path(tmp) / f"copy{n}.bin")]) for n in range(3))
        many = http.post(api, json={"name": "many"}, timeout=60).json()
        directory = hub.workdir / "fgpu-folders" / many["id"]
        for n in range(args.files):
            (directory / f"file-{n:05d}.txt").write_text("x")
        listings, ls = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            listed = list_all(http, f"{api}/{many['id']}/files/")
            listings.append(time.perf_counter() - start)
            assert listed == args.files, listed
            ls.append(timed(["ls", "-l", str(directory)]))
    mb = size / MIB
    print(f"upload   {mb:.0f} MiB in {up:.2f} s: {mb / up:.0f} MiB/s (cp: {mb / copy:.0f} MiB/s)")
    print(f"  chunk after chunk: {one_by_one:.2f} s: {mb / one_by_one:.0f} MiB/s")
    print(f"download {mb:.0f} MiB in {down:.2f} s: {mb / down:.0f} MiB/s")
    print(
        f"ratio to cp: upload {copy / up:.2f} (chunk after chunk {copy / one_by_one:.2f}), "
        f"download {copy / down:.2f}"
    )
    for what, spent in (
        ("parallel upload", up_cpu),
        ("chunk after chunk", one_cpu),
        ("download", down_cpu),
    ):
        figures = ", ".join(
            f"{kind} {seconds:.2f} s ({mb / seconds if seconds else math.inf:.0f} MiB per CPU s)"
            for kind, seconds in spent.items()
        )
        print(f"CPU, {what}: {figures}")
    p50, ls50 = statistics.median(listings), statistics.median(ls)
    print(f"listing {args.files} files: p50 {p50 * 1000:.0f} ms (ls -l: {ls50 * 1000:.0f} ms)")
    print(f"ratio to ls -l: {p50 / ls50:.1f}")


if __name__ == "__main__":
    main()
