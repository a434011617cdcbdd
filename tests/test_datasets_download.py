"""Downloads against a local HTTP server on 127.0.0.1: success, checksum, resume, restart, offline."""
import gzip
import hashlib
import io
import socket
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from recbench.datasets import ChecksumError, DownloadError, MissingDataError, load_dataset, registry
from recbench.datasets.download import download

FIXTURES = Path(__file__).parent / "fixtures" / "datasets"
PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


class Server:
    """Serves ``files`` (path -> bytes). ``ranges`` makes it honour ``Range`` requests; a path in
    ``truncate`` is answered with the full Content-Length but only half the body, once."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.ranges = True
        self.truncate: set[str] = set()
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Range")))
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                requested = self.headers.get("Range")
                if requested and server.ranges:
                    start = int(requested.removeprefix("bytes=").rstrip("-"))
                    if start >= len(body):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if self.path in server.truncate:
                    server.truncate.discard(self.path)
                    self.wfile.write(body[start:start + (len(body) - start) // 2])
                    return  # HTTP/1.0: the connection closes, short of Content-Length
                self.wfile.write(body[start:])

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"


@pytest.fixture
def server():
    served = Server()
    served.thread.start()
    yield served
    served.httpd.shutdown()
    served.httpd.server_close()
    served.thread.join(timeout=5)


@pytest.fixture
def urls(monkeypatch):
    """A private copy of the registry's URL table, so tests can point datasets at the local server; and no data
    folder from $RECBENCH_DATA_DIR (set for the real-data tests), whose files would be read instead of a download."""
    table = dict(registry.URLS)
    monkeypatch.setattr(registry, "URLS", table)
    monkeypatch.delenv("RECBENCH_DATA_DIR", raising=False)
    return table


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_download_success_is_atomic(server, tmp_path):
    server.files["/f.bin"] = PAYLOAD
    dest = download(server.url("/f.bin"), tmp_path / "f.bin", sha256=sha256(PAYLOAD), progress=False, timeout=10)
    assert dest.read_bytes() == PAYLOAD
    assert not (tmp_path / "f.bin.part").exists()
    download(server.url("/f.bin"), dest, sha256=sha256(PAYLOAD), progress=False, timeout=10)
    assert len(server.requests) == 1  # an existing file is not fetched again


def test_checksum_mismatch_removes_the_file(server, tmp_path):
    server.files["/f.bin"] = PAYLOAD
    with pytest.raises(ChecksumError, match="does not match the published"):
        download(server.url("/f.bin"), tmp_path / "f.bin", sha256="0" * 64, progress=False, timeout=10)
    assert list(tmp_path.iterdir()) == []


def test_interrupted_download_resumes_with_range(server, tmp_path):
    server.files["/f.bin"] = PAYLOAD
    server.truncate.add("/f.bin")
    with pytest.raises(DownloadError, match="resumes"):
        download(server.url("/f.bin"), tmp_path / "f.bin", sha256=sha256(PAYLOAD), progress=False, timeout=10)
    part = tmp_path / "f.bin.part"
    assert part.stat().st_size == len(PAYLOAD) // 2
    dest = download(server.url("/f.bin"), tmp_path / "f.bin", sha256=sha256(PAYLOAD), progress=False, timeout=10)
    assert dest.read_bytes() == PAYLOAD
    assert server.requests[-1] == ("/f.bin", f"bytes={len(PAYLOAD) // 2}-")


def test_server_without_ranges_restarts_from_scratch(server, tmp_path):
    server.files["/f.bin"] = PAYLOAD
    server.ranges = False
    (tmp_path / "f.bin.part").write_bytes(b"stale partial content")
    dest = download(server.url("/f.bin"), tmp_path / "f.bin", sha256=sha256(PAYLOAD), progress=False, timeout=10)
    assert dest.read_bytes() == PAYLOAD


def test_partial_file_longer_than_the_remote_one_restarts(server, tmp_path):
    server.files["/f.bin"] = PAYLOAD[:1000]
    (tmp_path / "f.bin.part").write_bytes(b"x" * 5000)  # the server answers 416 to its range
    dest = download(server.url("/f.bin"), tmp_path / "f.bin", progress=False, timeout=10)
    assert dest.read_bytes() == PAYLOAD[:1000]


def test_http_error_is_a_download_error(server, tmp_path):
    with pytest.raises(DownloadError, match="HTTP 404"):
        download(server.url("/missing"), tmp_path / "f.bin", progress=False, timeout=10)


def test_load_dataset_downloads_into_the_cache(server, urls, tmp_path):
    server.files["/steam.txt"] = (FIXTURES / "steam.txt").read_bytes()
    urls["steam/authors"] = server.url("/steam.txt")
    data = load_dataset("steam", cache_dir=tmp_path, progress=False)
    assert data.n_actions == 33
    assert (tmp_path / "downloads" / "steam-authors" / "steam.txt").is_file()
    assert data.provenance["upstream_url"] == urls["steam/authors"]
    load_dataset("steam", cache_dir=tmp_path, progress=False)
    assert len(server.requests) == 1


def test_load_dataset_falls_back_to_the_raw_file_and_reads_a_zip(server, urls, tmp_path):
    """ml-latest-small's only source is a GroupLens zip; steam's authors' file is missing upstream here."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.write(FIXTURES / "ratings.csv", "ml-latest-small/ratings.csv")
    server.files["/ml-latest-small.zip"] = buffer.getvalue()
    urls["ml-latest-small/raw"] = server.url("/ml-latest-small.zip")
    assert load_dataset("ml-latest-small", cache_dir=tmp_path, progress=False).n_users == 4

    server.files["/steam_reviews.json.gz"] = gzip.compress((FIXTURES / "steam_reviews.json").read_bytes())
    urls["steam/authors"] = server.url("/nothing-here.txt")
    urls["steam/raw"] = server.url("/steam_reviews.json.gz")
    data = load_dataset("steam", cache_dir=tmp_path, progress=False)
    assert data.provenance["source"] == "raw" and data.n_users == 5


def test_load_dataset_checksum_mismatch_is_an_error(server, urls, tmp_path):
    server.files["/beauty.txt"] = (FIXTURES / "steam.txt").read_bytes()  # not the published beauty.txt
    urls["beauty/authors"] = server.url("/beauty.txt")
    with pytest.raises(ChecksumError, match="f480b7a7"):
        load_dataset("beauty", cache_dir=tmp_path, progress=False)
    assert not [path for path in (tmp_path / "downloads").rglob("*") if path.is_file()]


def test_offline_lists_the_files_and_the_failures(urls, tmp_path):
    with socket.socket() as closed:  # a port nobody listens on: connection refused, at once
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    urls["steam/authors"] = f"{dead}/steam.txt"
    urls["steam/raw"] = f"{dead}/steam_reviews.json.gz"
    with pytest.raises(MissingDataError) as info:
        load_dataset("steam", data_dir=tmp_path / "data", cache_dir=tmp_path, progress=False)
    message = str(info.value)
    assert "downloading failed" in message and message.count("Download error") == 2
    assert "steam.txt (or steam.txt.gz)" in message and "--data-dir" in message and "RECBENCH_DATA_DIR" in message
    assert "does not exist" in message
    # Issue 29: it said a .part file "keeps what arrived" when nothing had arrived and there was no such file.
    assert message.count("nothing arrived (offline, or the server is down)") == 2 and ".part" not in message
    assert not list(tmp_path.rglob("*.part"))


def test_download_false_never_touches_the_network(server, urls, tmp_path):
    server.files["/steam.txt"] = (FIXTURES / "steam.txt").read_bytes()
    urls["steam/authors"] = server.url("/steam.txt")
    with pytest.raises(MissingDataError, match="downloading is off"):
        load_dataset("steam", cache_dir=tmp_path, download=False)
    assert server.requests == []


def test_a_download_shows_its_bytes_through_the_suites_bar(server, tmp_path, monkeypatch):
    """The download's bar is the suite's: in a log file whole lines with the bytes fetched (no ``\\r`` redraws)."""
    import sys

    from recbench.datasets import progress

    monkeypatch.setattr(progress, "PROGRESS_DELAY_S", 0.0)
    server.files["/f.bin"] = PAYLOAD
    with open(tmp_path / "run.log", "w") as log:
        monkeypatch.setattr(sys, "stderr", log)
        download(server.url("/f.bin"), tmp_path / "f.bin", sha256=sha256(PAYLOAD), progress=True, timeout=10)
    text = (tmp_path / "run.log").read_text()
    assert "\r" not in text and "downloading" in text and "1.00M/1.00M" in text.splitlines()[-1]
