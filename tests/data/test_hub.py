"""Hub streaming through ``datasets`` against a loopback HTTP server (no network): records, retries
that resume where they failed, one clear error when the network stays down, unknown datasets."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest

from tests.data.helpers import make_loader, random_docs, take, write_parquet
from titan_delta.data import DataConfig, DataConfigError, DataSourceError
from titan_delta.data.sources import parse_source

pytest.importorskip("datasets")


class _Server(http.server.ThreadingHTTPServer):
    root: Path
    fail_next = 0  # answer this many requests with 503 first
    fail_always = False


class _Handler(http.server.BaseHTTPRequestHandler):
    """Static files with Range support (parquet is read with range requests) and injectable failures."""

    def log_message(self, *args) -> None:
        pass

    def _fail(self) -> bool:
        server = self.server
        if server.fail_always or server.fail_next > 0:
            server.fail_next = max(0, server.fail_next - 1)
            self.send_error(503, "injected failure")
            return True
        return False

    def _body(self) -> tuple[bytes, int, int] | None:
        path = self.server.root / self.path.lstrip("/").split("?")[0]
        if not path.is_file():
            self.send_error(404)
            return None
        data = path.read_bytes()
        start, end = 0, len(data) - 1
        if "Range" in self.headers:
            lo, _, hi = self.headers["Range"].removeprefix("bytes=").partition("-")
            start, end = int(lo or 0), min(int(hi) if hi else len(data) - 1, len(data) - 1)
        return data, start, end

    def do_HEAD(self) -> None:
        if self._fail():
            return
        body = self._body()
        if body:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body[0])))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()

    def do_GET(self) -> None:
        if self._fail():
            return
        body = self._body()
        if body:
            data, start, end = body
            partial = "Range" in self.headers
            self.send_response(206 if partial else 200)
            if partial:
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            self.wfile.write(data[start : end + 1])


@pytest.fixture
def server(tmp_path):
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.root = tmp_path
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()


def hub_spec(server, names: list[str]) -> str:
    urls = "|".join(f"http://127.0.0.1:{server.server_address[1]}/{n}" for n in names)
    return f"hf:parquet?data_files={urls}"


def test_hub_stream_matches_local_files(tmp_path, server):
    docs = random_docs(40)
    write_parquet(tmp_path / "a.parquet", docs[:25], row_group_size=8)
    write_parquet(tmp_path / "b.parquet", docs[25:], row_group_size=8)
    spec = hub_spec(server, ["a.parquet", "b.parquet"])
    assert [r() for r in parse_source(spec, "text").iterate(0, infinite=False)] == docs
    assert [r() for r in parse_source(spec, "text").iterate(31, infinite=False)] == docs[31:]
    it = parse_source(spec, "text").iterate(38, infinite=True)
    assert [next(it)() for _ in range(4)] == docs[38:] + docs[:2]


def test_hub_source_in_the_loader(tmp_path, server, tokenizer):
    docs = random_docs(30)
    write_parquet(tmp_path / "a.parquet", docs)
    hub = DataConfig(sources=[hub_spec(server, ["a.parquet"])], lanes=1, num_workers=0)
    local = DataConfig(sources=[f"parquet:{tmp_path}/a.parquet"], lanes=1, num_workers=0)
    got = take(make_loader(hub, 16, 2, infinite=False, tokenizer=tokenizer), None)
    want = take(make_loader(local, 16, 2, infinite=False, tokenizer=tokenizer), None)
    assert len(got) == len(want) > 3
    assert all((a[0]["input"] == b[0]["input"]).all() for a, b in zip(got, want, strict=True))


def test_network_failures_are_retried_then_reported(tmp_path, server):
    docs = random_docs(30)
    write_parquet(tmp_path / "a.parquet", docs[:15])
    write_parquet(tmp_path / "b.parquet", docs[15:])
    source = parse_source(hub_spec(server, ["a.parquet", "b.parquet"]), "text", retries=3, backoff_s=0.01)
    records = source.iterate(0, infinite=False)
    got = [next(records)() for _ in range(15)]
    server.fail_next = 2  # the second file's first requests fail, then the network comes back
    got += [r() for r in records]
    assert got == docs
    source = parse_source(hub_spec(server, ["a.parquet", "b.parquet"]), "text", retries=2, backoff_s=0.01)
    records = source.iterate(0, infinite=False)
    assert [next(records)() for _ in range(15)] == docs[:15]
    server.fail_always = True
    with pytest.raises(DataSourceError, match="after 2 retries; stopped at record index 15"):
        list(records)


def test_unknown_dataset_or_option_fails_clearly(server):
    with pytest.raises(DataConfigError, match="not found"):
        next(parse_source(hub_spec(server, ["missing.parquet"]), "text").iterate(0, infinite=False))
    with pytest.raises(DataConfigError, match="unknown options"):
        parse_source("hf:HuggingFaceFW/fineweb-edu?subset=x", "text")
