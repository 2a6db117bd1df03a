"""A stricter GCS in front of gcp-storage-emulator, for the features the emulator lacks.

The emulator ignores ``startOffset``, ``maxResults`` and ``ifGenerationMatch`` and sends no
``x-goog-generation`` header; real GCS honours them all, and the GCS store relies on them
(listing from a key, pages, conditional writes of the tailer's state, tagged reads).
:class:`StrictGcs` is an HTTP reverse proxy (aiohttp, on its own event loop in a thread, at
a free 127.0.0.1 port) that forwards every request to the emulator, but:

* answers object listings itself from the emulator's full listing, with ``startOffset``
  (inclusive) applied and pages of ``maxResults`` (``pageToken`` continues);
* checks ``ifGenerationMatch`` of uploads against the object's current generation (0: it
  must not exist) and answers ``412`` as GCS does when it does not hold;
* adds ``x-goog-generation`` to media downloads.

It also serves the XML API that Rust's ``object_store`` (so delta-rs) speaks, of which the
emulator has only plain object GETs and PUTs: object listings (``list-type=2``, with
``start-after`` and ``continuation-token``), ``HEAD`` and ``GET`` with ``ETag``,
``Last-Modified`` and ``x-goog-generation`` (any ``Range``, suffixes too), ``PUT`` with
``x-goog-if-generation-match`` checked, and ``DELETE``; names are percent-decoded, as the
emulator does not.

It counts what it served in :attr:`StrictGcs.requests` (``LIST``, ``GET``, ``HEAD``, ``PUT``,
``DELETE``, and ``412`` refusals), so that tests can assert requests per operation.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
from collections import Counter
from datetime import datetime
from email.utils import format_datetime
from typing import Any
from urllib.parse import quote, unquote
from xml.sax.saxutils import escape

import aiohttp
from aiohttp import web
from emulators import free_port


class StrictGcs:
    def __init__(self, upstream: str, page_size_cap: int | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        #: Pages hold at most this many entries whatever maxResults asks (None: no cap).
        self.page_size_cap = page_size_cap
        self.requests: Counter[str] = Counter()
        self.list_params: list[dict[str, str]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def __enter__(self) -> StrictGcs:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *_: Any) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _upstream(
        self, method: str, path_qs: str, body: bytes | None = None, headers: Any = None
    ) -> tuple[int, dict[str, str], bytes]:
        assert self._session is not None
        async with self._session.request(
            method, self.upstream + path_qs, data=body, headers=headers
        ) as resp:
            return resp.status, dict(resp.headers), await resp.read()

    async def _metadata(self, bucket: str, name: str) -> dict[str, Any] | None:
        status, _, body = await self._upstream(
            "GET", f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}"
        )
        return json.loads(body) if status == 200 else None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.raw_path.split("?", 1)[0]  # still encoded: names hold "/" as %2F
        parts = path.split("/")
        query = dict(request.query)
        if parts[1] not in ("storage", "upload", "download", "batch"):
            return await self._xml(request, path, query)
        # /storage/v1/b/{bucket}/o: a listing
        listing = len(parts) == 6 and parts[1:4] == ["storage", "v1", "b"] and parts[5] == "o"
        if request.method == "GET" and listing:
            return await self._list(parts[4], query)
        if request.method == "POST" and path.startswith("/upload/storage/v1/b/"):
            self.requests["PUT"] += 1
            bucket = parts[5]
            if "ifGenerationMatch" in query:
                body = await request.read()
                name = json.loads(body.split(b"\r\n\r\n", 1)[1].split(b"\r\n--", 1)[0])["name"]
                meta = await self._metadata(bucket, name)
                current = str(meta["generation"]) if meta else "0"
                if current != query["ifGenerationMatch"]:
                    self.requests["412"] += 1
                    error = {"error": {"code": 412, "message": "Precondition Failed"}}
                    return web.json_response(error, status=412)
        elif request.method == "GET" and query.get("alt") == "media":
            self.requests["GET"] += 1
        elif request.method == "GET":
            self.requests["HEAD"] += 1
        else:
            self.requests[request.method] += 1
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host",)}
        status, resp_headers, resp_body = await self._upstream(
            request.method, request.raw_path, body or None, headers
        )
        out = {
            k: v
            for k, v in resp_headers.items()
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "server")
        }
        if status < 300 and query.get("alt") == "media" and len(parts) >= 7:
            name = unquote(path.split("/o/", 1)[1])
            meta = await self._metadata(parts[4], name)
            if meta is not None:
                out["x-goog-generation"] = str(meta["generation"])
        return web.Response(status=status, body=resp_body, headers=out)

    async def _entries(
        self, bucket: str, query: dict[str, str]
    ) -> tuple[int, bytes, list[tuple[str, str, Any]]]:
        """The emulator's whole listing under ``query``'s prefix and delimiter, in name
        order: ``("item", name, resource)`` and ``("prefix", prefix, prefix)`` entries."""
        upstream = {k: v for k, v in query.items() if k in ("prefix", "delimiter")}
        qs = "&".join(f"{k}={quote(v, safe='')}" for k, v in upstream.items())
        status, _, body = await self._upstream("GET", f"/storage/v1/b/{bucket}/o?{qs}")
        if status != 200:
            return status, body, []
        listing = json.loads(body or b"{}")
        entries = [("item", i["name"], i) for i in listing.get("items", [])]
        entries += [("prefix", p, p) for p in listing.get("prefixes", [])]
        entries.sort(key=lambda e: e[1].encode())
        return status, body, entries

    async def _list(self, bucket: str, query: dict[str, str]) -> web.Response:
        self.requests["LIST"] += 1
        self.list_params.append(dict(query))
        status, body, entries = await self._entries(bucket, query)
        if status != 200:
            return web.Response(status=status, body=body)
        start = query.get("startOffset")
        if start is not None:
            entries = [e for e in entries if e[1] >= start]
        token = query.get("pageToken")
        if token is not None:
            after = base64.urlsafe_b64decode(token).decode()
            entries = [e for e in entries if e[1] > after]
        size = int(query.get("maxResults", "1000"))
        if self.page_size_cap is not None:
            size = min(size, self.page_size_cap)
        page, rest = entries[:size], entries[size:]
        out: dict[str, Any] = {"kind": "storage#objects"}
        items = [e[2] for e in page if e[0] == "item"]
        prefixes = [e[2] for e in page if e[0] == "prefix"]
        if items:
            out["items"] = items
        if prefixes:
            out["prefixes"] = prefixes
        if rest:
            out["nextPageToken"] = base64.urlsafe_b64encode(page[-1][1].encode()).decode()
        return web.json_response(out)

    # --- the XML API --------------------------------------------------------------------

    async def _xml(self, request: web.Request, path: str, query: dict[str, str]) -> web.Response:
        bucket, _, encoded = path[1:].partition("/")
        bucket, name = unquote(bucket), unquote(encoded)
        method = request.method
        if not name:
            if method == "GET" and query.get("list-type") == "2":
                return await self._xml_list(bucket, query)
            return web.Response(status=501)
        self.requests[method] += 1
        if method in ("GET", "HEAD"):
            meta = await self._metadata(bucket, name)
            if meta is None:
                return _xml_error(404, "NoSuchKey")
            headers = _object_headers(meta)
            if method == "HEAD":
                return web.Response(status=200, headers=headers)
            status, _, data = await self._upstream(
                "GET", f"/download/storage/v1/b/{bucket}/o/{quote(name, safe='')}?alt=media"
            )
            if status != 200:
                return web.Response(status=status, body=data)
            del headers["Content-Length"]  # the body's, set by aiohttp
            wanted = _byte_range(request.headers.get("Range"), len(data))
            if wanted is None:
                return web.Response(status=200, body=data, headers=headers)
            start, end = wanted
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
            return web.Response(status=206, body=data[start:end], headers=headers)
        if method == "PUT" and "x-goog-copy-source" not in request.headers:
            body = await request.read()
            match = request.headers.get("x-goog-if-generation-match")
            if match is not None:
                meta = await self._metadata(bucket, name)
                if (str(meta["generation"]) if meta else "0") != match:
                    self.requests["412"] += 1
                    return _xml_error(412, "PreconditionFailed")
            status, _, resp = await self._upstream(
                "POST",
                f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(name, safe='')}",
                body,
                {"Content-Type": "application/octet-stream"},
            )
            if status != 200:
                return web.Response(status=status, body=resp)
            return web.Response(status=200, headers=_object_headers(json.loads(resp)))
        if method == "DELETE":
            status, _, resp = await self._upstream(
                "DELETE", f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}"
            )
            return web.Response(status=204) if status < 300 else _xml_error(404, "NoSuchKey")
        return web.Response(status=501)

    async def _xml_list(self, bucket: str, query: dict[str, str]) -> web.Response:
        self.requests["LIST"] += 1
        self.list_params.append(dict(query))
        status, body, entries = await self._entries(bucket, query)
        if status != 200:
            return web.Response(status=status, body=body)
        after = query.get("start-after")
        token = query.get("continuation-token")
        if token is not None:
            after = base64.urlsafe_b64decode(token).decode()
        if after is not None:
            entries = [e for e in entries if e[1] > after]
        size = int(query.get("max-keys", "1000"))
        if self.page_size_cap is not None:
            size = min(size, self.page_size_cap)
        page, rest = entries[:size], entries[size:]
        out = [
            '<?xml version="1.0" encoding="UTF-8"?>',
            '<ListBucketResult xmlns="http://doc.s3.amazonaws.com/2006-03-01">',
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(query.get('prefix', ''))}</Prefix>",
            f"<KeyCount>{len(page)}</KeyCount><IsTruncated>{str(bool(rest)).lower()}</IsTruncated>",
        ]
        for kind, key, value in page:
            if kind == "item":
                out.append(
                    f"<Contents><Key>{escape(key)}</Key>"
                    f"<Generation>{value['generation']}</Generation>"
                    f"<LastModified>{value['updated']}</LastModified>"
                    f"<ETag>{escape(_etag(value))}</ETag><Size>{value['size']}</Size></Contents>"
                )
            else:
                out.append(f"<CommonPrefixes><Prefix>{escape(key)}</Prefix></CommonPrefixes>")
        if rest:
            next_token = base64.urlsafe_b64encode(page[-1][1].encode()).decode()
            out.append(f"<NextContinuationToken>{next_token}</NextContinuationToken>")
        out.append("</ListBucketResult>")
        return web.Response(body="".join(out).encode(), content_type="application/xml")


def _etag(meta: dict[str, Any]) -> str:
    return f'"{meta.get("etag") or meta.get("md5Hash") or meta["generation"]}"'


def _object_headers(meta: dict[str, Any]) -> dict[str, str]:
    updated = datetime.fromisoformat(meta["updated"].replace("Z", "+00:00"))
    return {
        "ETag": _etag(meta),
        "Last-Modified": format_datetime(updated, usegmt=True),
        "Content-Length": str(meta["size"]),
        "x-goog-generation": str(meta["generation"]),
        "Content-Type": meta.get("contentType") or "application/octet-stream",
    }


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``[start, end)`` of a ``Range: bytes=…`` header (``a-b``, ``a-`` or ``-n``)."""
    match = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", header or "")
    if match is None or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if not first:
        return max(0, size - int(last)), size
    return int(first), min(size, int(last) + 1) if last else size


def _xml_error(status: int, code: str) -> web.Response:
    body = f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code></Error>'
    return web.Response(status=status, body=body.encode(), content_type="application/xml")
