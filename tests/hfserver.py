"""A small fake of the Hugging Face Hub on 127.0.0.1, for the real huggingface_hub client.

It serves exactly the endpoints huggingface_hub 2.4's snapshot_download / hf_hub_download use
(read from its source: hf_api.py model_info / _iter_repo_tree_pages, file_download.py
get_hf_file_metadata / http_get, utils/_http.py hf_raise_for_status):

  GET  /api/models/{repo}[/revision/{rev}]      repo info: id, sha, siblings
  GET  /api/models/{repo}/tree/{rev}[?recursive] file list: type, path, size, oid, lfs {oid, size}
  HEAD /{repo}/resolve/{rev}/{path}              ETag, X-Repo-Commit, Content-Length
  GET  /{repo}/resolve/{rev}/{path}              the bytes; honours `Range: bytes=N-` (206)

Errors carry the hub's X-Error-Code header (RepoNotFound, RevisionNotFound, EntryNotFound), which
the client turns into its typed exceptions; a private repo answers 401 without the right bearer token.
Fault injection for tests: `drop_after[path] = n` cuts the connection after n bytes of the first
full GET of that file; `hidden` paths answer 404 EntryNotFound although the tree lists them;
`cut_every[path] = n` cuts every GET of that file (resumed ones too) after n bytes, a connection that always breaks
and always makes a little progress; `status_all = 500` answers every request with that status, `status_files`
every request for a file; `info_body` (bytes) replaces the repository info's JSON, a hostile answer, and
`info_endless` makes it a chunked answer that never ends; `tree_body` replaces the file list's JSON;
`xet` marks every file as stored in Xet (HEAD answers carry X-Xet-Hash and a refresh route, which answers
404: no CAS server here).
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


@dataclass
class Repo:
    files: dict[str, bytes]
    sha: str = ""
    private_token: str | None = None   # set: the repo is private and needs this bearer token
    refs: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if not self.sha:
            h = hashlib.sha1()
            for p in sorted(self.files):
                h.update(p.encode() + b"\0" + hashlib.sha256(self.files[p]).digest())
            self.sha = h.hexdigest()
        self.refs.setdefault("main", self.sha)


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.log: list[tuple[str, str, str | None]] = []   # (method, path, Range header)
        self.drop_after: dict[str, int] = {}
        self.cut_every: dict[str, int] = {}
        self.status_all: int | None = None
        self.status_files: int | None = None
        self.info_body: bytes | None = None
        self.info_endless = False
        self.tree_body: bytes | None = None
        self.hidden: set[str] = set()
        self.xet = False
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_HEAD(self):
                hub._handle(self, head=True)

            def do_GET(self):
                hub._handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add(self, repo_id: str, files: dict[str, bytes], **kw) -> Repo:
        r = Repo(dict(files), **kw)
        self.repos[repo_id] = r
        return r

    def requests(self, method: str, suffix: str = "") -> list[tuple[str, str, str | None]]:
        return [e for e in self.log if e[0] == method and e[1].endswith(suffix)]

    # -- request handling --------------------------------------------------------
    def _send(self, h: BaseHTTPRequestHandler, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              head: bool = False) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head and body:
            h.wfile.write(body)

    def _error(self, h, status: int, code: str | None, msg: str, head: bool, extra: dict[str, str] | None = None):
        headers = {"Content-Type": "application/json", **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        headers["X-Error-Message"] = msg
        self._send(h, status, json.dumps({"error": msg}).encode(), headers, head)

    def _auth(self, h, repo: Repo, head: bool) -> bool:
        if repo.private_token is None:
            return True
        got = h.headers.get("Authorization")
        if got == f"Bearer {repo.private_token}":
            return True
        if got:
            self._error(h, 401, None, "Invalid credentials in Authorization header", head)
        else:  # what the hub says for a private repo without a token
            self._error(h, 401, "RepoNotFound", "Repository not found", head)
        return False

    def _repo(self, h, repo_id: str, head: bool) -> Repo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 404, "RepoNotFound", "Repository not found", head)
            return None
        return repo if self._auth(h, repo, head) else None

    def _commit(self, h, repo: Repo, rev: str, head: bool) -> str | None:
        rev = unquote(rev)
        if rev in repo.refs:
            return repo.refs[rev]
        if rev == repo.sha:
            return rev
        self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
        return None

    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        url = urlsplit(h.path)
        path = unquote(url.path)
        with self._lock:
            self.log.append(("HEAD" if head else "GET", path, h.headers.get("Range")))
        status = self.status_all or (self.status_files if "/resolve/" in path else None)
        if status is not None:
            self._error(h, status, None, "the server is failing", head)
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            repo = self._repo(h, m.group(1), head)
            if repo and (sha := self._commit(h, repo, m.group(2) or "main", head)):
                info = {"id": m.group(1), "sha": sha, "private": repo.private_token is not None,
                        "siblings": [{"rfilename": p} for p in sorted(repo.files)]}
                body = self.info_body if self.info_body is not None else json.dumps(info).encode()
                if self.info_endless and not head:   # a chunked answer that never ends
                    h.send_response(200)
                    h.send_header("Content-Type", "application/json")
                    h.send_header("Transfer-Encoding", "chunked")
                    h.end_headers()
                    chunk = b"[" * 65536
                    try:
                        while True:
                            h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    except OSError:
                        h.close_connection = True
                    return
                self._send(h, 200, body, {"Content-Type": "application/json"}, head)
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path)
        if m:
            repo = self._repo(h, m.group(1), head)
            if repo and self._commit(h, repo, m.group(2), head):
                entries = []
                for p in sorted(repo.files):
                    data = repo.files[p]
                    e = {"type": "file", "path": p, "size": len(data), "oid": git_blob_oid(data)}
                    if p.endswith(LFS_SUFFIXES):
                        e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                    entries.append(e)
                body = self.tree_body if self.tree_body is not None else json.dumps(entries).encode()
                self._send(h, 200, body, {"Content-Type": "application/json"}, head)
            return
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            repo = self._repo(h, m.group(1), head)
            if repo is None or not (sha := self._commit(h, repo, m.group(2), head)):
                return
            fname = m.group(3)
            if fname not in repo.files or fname in self.hidden:
                self._error(h, 404, "EntryNotFound", f"{fname} does not exist", head, {"X-Repo-Commit": sha})
                return
            self._serve_file(h, repo, sha, fname, head)
            return
        self._error(h, 404, None, "no such endpoint", head)

    def _serve_file(self, h, repo: Repo, sha: str, fname: str, head: bool) -> None:
        data = repo.files[fname]
        etag = hashlib.sha256(data).hexdigest() if fname.endswith(LFS_SUFFIXES) else git_blob_oid(data)
        headers = {"ETag": f'"{etag}"', "X-Repo-Commit": sha, "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if self.xet:   # the file is stored in Xet: hf_xet would fetch it from a CAS server via this route
            headers |= {"X-Xet-Hash": hashlib.sha256(b"xet" + data).hexdigest(),
                        "X-Xet-Refresh-Route": f"http://{h.headers['Host']}/api/models/xet-read-token/{sha}"}
        rng = h.headers.get("Range")
        start = 0
        if rng and (mr := re.fullmatch(r"bytes=(\d+)-", rng)):
            start = int(mr.group(1))
        if head:
            self._send(h, 200, data, headers, head=True)
            return
        if start:
            h.send_response(206)
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        else:
            h.send_response(200)
        body = data[start:]
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        cut = self.drop_after.pop(fname, None) if not start else None
        cut = self.cut_every.get(fname, cut)
        if cut is not None:  # a broken connection mid-file: send part, then hang up
            h.wfile.write(body[:cut])
            h.wfile.flush()
            h.close_connection = True
            import socket
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        h.wfile.write(body)
