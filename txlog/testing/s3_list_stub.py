"""A loopback HTTP server that answers S3 ListObjectsV2 requests for one bucket from a
fixed set of keys, paging them as a faulty server might: correctly, with a truncated page
that names no next token (``"no-token"``), or with a next token that repeats
(``"repeat-token"``).  Real clients (obstore, s3fs) list through it, so a test sees what
each does with such pages.  It answers listings only; nothing else is stored.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

FAULTS = ("none", "no-token", "repeat-token")
#: Keys per page when a request names no max-keys (S3's default, and SeaweedFS's).
DEFAULT_PAGE = 1000


def _page_xml(bucket: str, prefix: str, keys: Sequence[str], prefixes: Sequence[str], *,
              truncated: bool, token: str | None) -> bytes:
    items = "".join(
        f"<Contents><Key>{escape(k)}</Key><Size>3</Size>"
        "<LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>\"e\"</ETag>"
        "<StorageClass>STANDARD</StorageClass></Contents>" for k in keys)
    common = "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>"
                     for p in prefixes)
    nxt = f"<NextContinuationToken>{token}</NextContinuationToken>" if token else ""
    body = ('<?xml version="1.0" encoding="UTF-8"?>'
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<KeyCount>{len(keys) + len(prefixes)}</KeyCount><MaxKeys>{DEFAULT_PAGE}</MaxKeys>"
            f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"
            f"{items}{common}{nxt}</ListBucketResult>")
    return body.encode()


class ListStub:
    """The server; ``requests`` counts the listings it answered.  Stop it with stop()."""

    def __init__(self, bucket: str, keys: Sequence[str], *, fault: str = "none") -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, not {fault!r}")
        self.bucket = bucket
        self.keys = sorted(keys)
        self.fault = fault
        self.requests = 0
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = stub._answer(self.path)
                self.send_response(200 if body is not None else 404)
                data = body or b""
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def storage_options(self) -> dict[str, Any]:
        return {"key": "stub", "secret": "stub-secret",
                "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"}}

    def _answer(self, path: str) -> bytes | None:
        url = urlsplit(path)
        if url.path.strip("/") != self.bucket:
            return None
        q = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        with self._lock:
            self.requests += 1
        prefix = q.get("prefix", "")
        delimiter = q.get("delimiter", "")
        size = int(q.get("max-keys", DEFAULT_PAGE))
        after = q.get("start-after", "")
        # A token names the last key or common prefix of its page (StartAfter applies to
        # the first page only, as in S3).
        token_in = q.get("continuation-token")
        if token_in is not None:
            after = token_in
        names: list[str] = []
        for k in self.keys:
            if not k.startswith(prefix) or k <= after:
                continue
            if delimiter and delimiter in k[len(prefix):]:
                common = prefix + k[len(prefix):].split(delimiter, 1)[0] + delimiter
                if not names or names[-1] != common:
                    names.append(common)
            else:
                names.append(k)
        if token_in is not None and names and names[0] == token_in:
            names = names[1:]  # a common prefix sorts before the keys it covers
        page = names[:size]
        truncated = len(names) > size
        token: str | None = page[-1] if truncated else None
        if truncated and self.fault == "no-token":
            token = None
        elif truncated and self.fault == "repeat-token" and token_in is not None:
            token = token_in  # every page after the first names the second page again
        keys = [n for n in page if not (delimiter and n.endswith(delimiter))]
        prefixes = [n for n in page if delimiter and n.endswith(delimiter)]
        return _page_xml(self.bucket, prefix, keys, prefixes, truncated=truncated,
                         token=token)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
