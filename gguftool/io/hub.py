"""Download a model repository from the Hugging Face Hub (or a mirror) with huggingface_hub.

Only the files a conversion needs are fetched (allow_patterns). The revision (branch, tag or commit)
is resolved to a commit first and the download is pinned to that commit, which the caller records
in the output's metadata. Downloads land in the standard HF cache, so a file finished once is never
fetched again (an interrupted run resumes with the files it lacks), and huggingface_hub resumes a
file whose connection breaks with a Range request. A file cut off when the run ends (deadline, attempt
limit, a signal) is not kept: huggingface_hub writes each download to a file of its own and deletes it on
failure, so that file starts over on the next run.

The HF_* variables are read when a download starts (not when huggingface_hub was imported):
HF_ENDPOINT (mirror), HF_TOKEN, HF_HUB_OFFLINE, HF_HOME / HF_HUB_CACHE.
"""
from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import GgufToolError
from . import confine
from .split import SHARD_NAME, shard_path

# What `convert` reads from a checkpoint repository (the pooling config of sentence-transformers too).
CHECKPOINT_PATTERNS = ["config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json",
                       "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                       "modules.json", "*_Pooling/config.json", "README.md"]
# GGUF repositories: without --gguf-pattern, the most precise file is requantized (names as llama.cpp writes them)
GGUF_PREFERENCE = ("F32", "BF16", "F16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_1", "Q5_0", "Q4_K_M", "Q4_1", "Q4_0")
_TRUE = ("1", "ON", "YES", "TRUE")


@dataclass(frozen=True)
class Snapshot:
    repo_id: str
    revision: str         # as asked (branch, tag or commit)
    commit: str           # the commit the files come from
    path: Path            # local folder holding the files
    kind: str             # "checkpoint" (safetensors + config.json) or "gguf"
    gguf_file: Path | None = None

    def record(self, endpoint: str | None = None) -> dict[str, str]:
        r = {"source.repo": self.repo_id, "source.revision": self.revision, "source.commit": self.commit}
        if self.gguf_file is not None:
            r["source.file"] = self.gguf_file.name
        if endpoint:
            r["source.endpoint"] = endpoint
        return r


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def offline_env() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


@contextlib.contextmanager
def _progress(show: bool) -> Iterator[None]:
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    was_disabled = are_progress_bars_disabled()
    (enable_progress_bars if show else disable_progress_bars)()
    try:
        yield
    finally:
        (disable_progress_bars if was_disabled else enable_progress_bars)()


def _model_name(f: str) -> str:
    """A split model's shards stand for one model, named as the merged file would be."""
    return SHARD_NAME.sub(".gguf", f)


def choose_gguf(files: list[str], pattern: str | None, repo_id: str) -> str:
    """The GGUF file to requantize; for a split model, its first shard (gguf_files gives all)."""
    models: dict[str, list[str]] = {}
    for f in sorted(f for f in files if f.endswith(".gguf")):
        models.setdefault(_model_name(f), []).append(f)

    def named(name: str) -> str:
        return models[name][0]   # sorted: -00001-of- first

    if pattern:
        hits = [m for m, fs in models.items()
                if any(fnmatch.fnmatch(f, pattern) or fnmatch.fnmatch(Path(f).name, pattern) for f in [m, *fs])]
        if not hits:
            raise GgufToolError(f"{repo_id}: no GGUF file matches {pattern!r}",
                                hint="files: " + ", ".join(list(models)[:12]))
        if len(hits) > 1:
            raise GgufToolError(f"{repo_id}: {len(hits)} GGUF files match {pattern!r}: {', '.join(hits[:6])}",
                                hint="give a more specific --gguf-pattern")
        return named(hits[0])
    ggufs = [m for m in models if "mmproj" not in Path(m).name.lower()]  # vision projectors are not the model
    for tag in GGUF_PREFERENCE:
        hits = [f for f in ggufs if re.search(rf"[-._]{tag}\.gguf$", f, re.IGNORECASE)]
        if len(hits) == 1:
            return named(hits[0])
    if len(ggufs) == 1:
        return named(ggufs[0])
    raise GgufToolError(f"{repo_id}: holds {len(ggufs)} GGUF files and none is clearly the most precise",
                        hint="pick one with --gguf-pattern, e.g. '*Q8_0.gguf'; files: " + ", ".join(ggufs[:8]))


def gguf_files(files: list[str], chosen: str, repo_id: str) -> list[str]:
    """`chosen` and, for a shard of a split model, every shard (llama_split_path's names)."""
    m = SHARD_NAME.search(chosen)
    if not m:
        return [chosen]
    n, prefix = int(m.group(2)), chosen[:m.start()]
    shards = [str(shard_path(prefix, i, n)) for i in range(n)]
    missing = [f for f in shards if f not in files]
    if missing:
        raise GgufToolError(f"{repo_id}: split model {_model_name(chosen)} lacks {len(missing)} of its {n} shards: "
                            f"{', '.join(missing[:4])}", hint="pick another file with --gguf-pattern")
    return shards


def _kind(files: list[str], repo_id: str) -> str:
    names = set(files)
    if "config.json" in names and any(f.endswith(".safetensors") for f in files):
        return "checkpoint"
    if any(f.endswith(".gguf") for f in files):
        return "gguf"
    raise GgufToolError(f"{repo_id}: holds neither safetensors weights with config.json nor GGUF files",
                        hint="gguftool converts safetensors checkpoints and requantizes GGUF files")


DEADLINE_SECONDS = 6 * 3600   # the whole download; huggingface_hub's own timeouts are per request
# huggingface_hub retries a broken download 5 times, and starts counting again whenever the last try brought a
# few bytes: a server that always breaks the connection after a little data is retried without end. Every
# request it makes during a download is counted here instead: one request (a file's HEAD or GET, an API call)
# is tried at most ATTEMPTS times, and all of them together are retried at most RETRIES_PER_ATTEMPT x ATTEMPTS times.
ATTEMPTS = 6
RETRIES_PER_ATTEMPT = 4


class _GaveUp(Exception):
    """Raised in huggingface_hub's HTTP client when the attempt limit is reached (turned into a GgufToolError)."""


class _Attempts:
    """The request budget of one download: counts each request (method + URL) huggingface_hub sends."""

    def __init__(self, attempts: int):
        self.attempts, self.retries = attempts, RETRIES_PER_ATTEMPT * attempts
        self.tries: dict[tuple[str, str], int] = {}
        self.answers: dict[tuple[str, str], str] = {}
        self.n_retries = 0
        self.gave_up: str | None = None
        self.stopped = False   # the download is over: later requests of it fail
        self.abandoned = False   # the caller stopped waiting for it (deadline)
        self._lock = threading.Lock()

    @staticmethod
    def what(url: str) -> str:
        path = url.split("?", 1)[0]
        return path.split("/resolve/", 1)[1].split("/", 1)[-1] if "/resolve/" in path else path.split("://", 1)[-1]

    def on_request(self, request) -> None:
        key = (request.method, str(request.url))
        with self._lock:
            if self.stopped or self.gave_up:
                raise _GaveUp(self.gave_up or "the download was stopped")
            n = self.tries[key] = self.tries.get(key, 0) + 1
            self.n_retries += n > 1
            last = self.answers.get(key, "the connection broke")
            if n > self.attempts:
                self.gave_up = f"gave up on {self.what(key[1])} after {n - 1} attempts (the last: {last})"
            elif self.n_retries > self.retries:
                self.gave_up = (f"gave up after {self.n_retries - 1} retries in all (the last of {self.what(key[1])}: "
                                f"{last})")
            if self.gave_up:
                raise _GaveUp(self.gave_up)

    def on_response(self, response) -> None:
        key = (response.request.method, str(response.request.url))
        with self._lock:
            code = response.status_code
            self.answers[key] = f"HTTP {code}" if code >= 400 else f"HTTP {code}, then the connection broke"
        if "/api/" in key[1].split("?", 1)[0]:   # an API answer (JSON, read whole into memory; files are streamed)
            response.stream = _limited_stream()(response.stream, ANSWER_LIMIT, self, self.what(key[1]))


ANSWER_LIMIT = 256 << 20   # bytes of one API answer (a repository's info or a page of its file list)


@functools.lru_cache(maxsize=1)
def _limited_stream():
    """The class of a response body that stops (the download gives up) past `limit` bytes: an endless answer
    cannot fill memory. An httpx SyncByteStream, made when first needed (httpx is huggingface_hub's)."""
    try:
        import httpx2 as httpx  # huggingface_hub 2.x's fork of httpx
    except ImportError:
        import httpx

    class Limited(httpx.SyncByteStream):
        def __init__(self, stream, limit: int, budget: _Attempts, what: str):
            self.stream, self.limit, self.budget, self.what = stream, limit, budget, what

        def __iter__(self):
            n = 0
            for chunk in self.stream:
                n += len(chunk)
                if n > self.limit:
                    self.budget.gave_up = f"gave up on {self.what}: its answer runs past {self.limit >> 20} MiB"
                    raise _GaveUp(self.budget.gave_up)
                yield chunk

        def close(self):
            self.stream.close()
    return Limited


_budget: _Attempts | None = None   # the download under way (one at a time)


def _client():
    """huggingface_hub's own HTTP client, with the budget's hooks (no-ops outside a download)."""
    from huggingface_hub.utils._http import default_client_factory
    c = default_client_factory()

    def on_request(request):
        if _budget is not None:
            _budget.on_request(request)

    def on_response(response):
        if _budget is not None:
            _budget.on_response(response)
    hooks = c.event_hooks
    c.event_hooks = {"request": [*hooks.get("request", []), on_request],
                     "response": [*hooks.get("response", []), on_response]}
    return c


_installed = False


def _install_budget() -> None:
    global _installed
    if not _installed:
        from huggingface_hub import set_client_factory
        set_client_factory(_client)
        _installed = True


def fetch(repo_id: str, revision: str | None = None, *, deadline: float | None = DEADLINE_SECONDS,
          attempts: int = ATTEMPTS, **kw) -> Snapshot:
    """Download what a conversion of `repo_id` needs; returns where it lies and which commit it is.
    A server that trickles or stalls cannot hold the run past `deadline` seconds: the download runs in
    a daemon thread and we stop waiting (the files that finished stay in the cache; the next run fetches the rest).
    A server that keeps failing cannot make it retry without end: see ATTEMPTS."""
    global _budget
    _install_budget()
    budget = _budget = _Attempts(attempts)
    try:
        with _counted_transfers():
            return _fetch_within(repo_id, revision, deadline, budget, **kw)
    finally:
        budget.stopped = True
        if not budget.abandoned:   # else it stays, so that the abandoned download stops at its next request
            _budget = None


@contextlib.contextmanager
def _counted_transfers() -> Iterator[None]:
    """huggingface_hub moves a file the Hub stores in Xet through hf_xet's own client when that package is
    installed, past the budget's hooks (only the deadline would bound it); plain HTTP(S), which the Hub serves
    for every file, is counted. GGUFTOOL_HUB_XET=1 keeps hf_xet (faster for large files, deadline only)."""
    from huggingface_hub import constants
    if os.environ.get("GGUFTOOL_HUB_XET") == "1":
        yield
        return
    was = constants.HF_HUB_DISABLE_XET   # read by huggingface_hub at each download, not at import
    constants.HF_HUB_DISABLE_XET = True
    try:
        yield
    finally:
        constants.HF_HUB_DISABLE_XET = was


def _fetch_within(repo_id: str, revision: str | None, deadline: float | None, budget: _Attempts, **kw) -> Snapshot:
    def run():
        try:
            return _fetch(repo_id, revision, **kw)
        except GgufToolError:
            if budget.gave_up:   # huggingface_hub may report our stop as "cannot reach the server"
                raise _gave_up(repo_id, budget) from None
            raise
        except _GaveUp:
            raise _gave_up(repo_id, budget) from None
    if deadline is None:
        return run()
    done: dict[str, object] = {}

    def work():
        try:
            done["snapshot"] = run()
        except BaseException as e:   # handed to the caller's thread below
            done["error"] = e
    t = threading.Thread(target=work, name="gguftool-hub", daemon=True)
    t.start()
    t.join(deadline)
    if t.is_alive():
        budget.abandoned = True
        raise GgufToolError(f"{repo_id}: the download did not finish within {deadline:g} s ({endpoint()})",
                            hint="the files that finished are cached (the one cut off starts over): run again to fetch the rest, "
                                 "or raise --deadline")
    if "error" in done:
        raise done["error"]
    return done["snapshot"]


def _gave_up(repo_id: str, budget: _Attempts) -> GgufToolError:
    return GgufToolError(f"{repo_id}: {budget.gave_up} ({endpoint()})",
                         hint="the server keeps failing; the files that finished are cached: run again later "
                              "(or raise --attempts)")


def _fetch(repo_id: str, revision: str | None = None, *, gguf_pattern: str | None = None, token: str | None = None,
           offline: bool | None = None, progress: bool | None = None) -> Snapshot:
    from huggingface_hub import HfApi, snapshot_download

    if not re.fullmatch(r"[\w.-]+/[\w.-]+|[\w.-]+", repo_id):
        raise GgufToolError(f"{repo_id!r} is not a Hub repository id", hint="e.g. HuggingFaceTB/SmolLM2-135M-Instruct")
    rev = confine.revision(revision or "main")
    ep = endpoint()
    cache = cache_dir()
    tok = token or os.environ.get("HF_TOKEN") or None
    offline = offline_env() if offline is None else offline
    show = sys.stderr.isatty() and not os.environ.get("GGUFTOOL_NO_PROGRESS") if progress is None else progress
    with _errors(repo_id, rev, ep, offline), _progress(show):
        if offline:
            folder = local_snapshot(repo_id, rev, cache)
            files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
            commit = folder.name
        else:
            with _answers(ep, f"the repository info of {repo_id}@{rev}"):
                info = HfApi(endpoint=ep, token=tok).model_info(repo_id, revision=rev)
                siblings = info.siblings or []
                files = [s.rfilename for s in siblings] if isinstance(siblings, list) else None
            commit = confine.commit(info.sha, f"{ep}: the commit of {repo_id}@{rev}")
            for f in files if files is not None else [siblings]:   # names that become paths in the cache
                try:
                    if files is None or not isinstance(f, str):
                        raise GgufToolError("")
                    confine.inside(Path("repo"), f, "")
                except GgufToolError:
                    raise GgufToolError(f"{ep}: the repository info of {repo_id}@{rev} lists the file {f!r}, which is "
                                        "not a relative path inside the repository",
                                        hint="is HF_ENDPOINT a Hugging Face hub?") from None
        kind = _kind(files, repo_id)
        chosen = choose_gguf(files, gguf_pattern, repo_id) if kind == "gguf" else None
        patterns = gguf_files(files, chosen, repo_id) if chosen else CHECKPOINT_PATTERNS
        if not offline:
            # pinned to the commit just resolved: a branch moving meanwhile cannot mix two versions
            with _answers(ep, f"the files of {repo_id}@{commit}"):
                folder = Path(snapshot_download(repo_id, revision=commit, cache_dir=cache, allow_patterns=patterns,
                                                token=tok, endpoint=ep))
            # remember the branch/tag -> commit too, so offline runs can find it by name
            if rev != commit:
                ref = cache / f"models--{repo_id.replace('/', '--')}" / "refs" / rev
                ref.parent.mkdir(parents=True, exist_ok=True)
                ref.write_text(commit)
    for f in patterns if chosen is not None else []:
        if not confine.inside(folder, f, f"{repo_id}: file").is_file():   # names the server listed
            raise GgufToolError(f"{repo_id}: {f} is not in the local snapshot {folder}",
                                hint="run again without offline mode to download it")
    return Snapshot(repo_id, rev, commit, folder, kind, folder / chosen if chosen else None)


def local_snapshot(repo_id: str, rev: str, cache: Path) -> Path:
    """The cached snapshot folder of `rev` (a commit, or a branch/tag the cache has a ref for)."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    ref = root / "refs" / rev
    commit = rev if confine.COMMIT.fullmatch(rev) else (
        confine.commit(ref.read_text().strip(), str(ref)) if ref.is_file() else None)
    folder = root / "snapshots" / commit if commit else None
    if folder is None or not folder.is_dir():
        raise GgufToolError(f"{repo_id}@{rev} is not in the local cache ({cache}) and offline mode is on",
                            hint="run once online (unset HF_HUB_OFFLINE) to fill the cache")
    return folder


@contextlib.contextmanager
def _answers(ep: str, what: str) -> Iterator[None]:
    """Around a huggingface_hub call that parses the server's answers: an answer that is not what a hub sends
    (not JSON, nested without end, the wrong shapes) is an error naming the server, not a traceback."""
    try:
        yield
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as e:
        if isinstance(e, GgufToolError) or type(e).__module__.startswith("huggingface_hub"):
            raise   # a GgufToolError, or one of huggingface_hub's own errors (_errors names those)
        raise GgufToolError(f"{ep}: {what} is not a hub's answer ({type(e).__name__}: {str(e)[:200]})",
                            hint="is HF_ENDPOINT a Hugging Face hub (or a mirror of one)?") from None


@contextlib.contextmanager
def _errors(repo_id: str, rev: str, ep: str, offline: bool) -> Iterator[None]:
    """huggingface_hub's exceptions -> one clear GgufToolError each."""
    from huggingface_hub import errors as hfe
    try:
        yield
    except GgufToolError:
        raise
    except hfe.GatedRepoError:
        raise GgufToolError(f"{repo_id} is gated: accept its licence on the Hub, then use a token",
                            hint="set HF_TOKEN or pass --token") from None
    except hfe.RevisionNotFoundError:
        raise GgufToolError(f"{repo_id}: revision {rev!r} not found on {ep}") from None
    except hfe.RemoteEntryNotFoundError as e:
        raise GgufToolError(f"{repo_id}@{rev}: a file the repository lists is missing on {ep} ({_url_file(e)})",
                            hint="the files fetched so far stay in the cache; retry later or pick another revision") from None
    except hfe.RepositoryNotFoundError:
        raise GgufToolError(f"{repo_id}: repository not found on {ep} (or it is private)",
                            hint="check the id; for a private repo set HF_TOKEN or pass --token") from None
    except hfe.LocalEntryNotFoundError:
        if offline:
            raise GgufToolError(f"{repo_id}@{rev} is not in the local cache ({cache_dir()}) and offline mode is on",
                                hint="run once online (unset HF_HUB_OFFLINE) to fill the cache") from None
        raise GgufToolError(f"cannot reach {ep} to download {repo_id}, and it is not cached",
                            hint="check the network or HF_ENDPOINT") from None
    except hfe.HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status == 401:
            raise GgufToolError(f"{ep} refused the token for {repo_id} (401 invalid credentials)",
                                hint="check HF_TOKEN / --token") from None
        raise GgufToolError(f"{ep}: HTTP error for {repo_id}: {str(e).splitlines()[0]}") from None
    except OSError as e:
        if "Consistency check failed" in str(e):
            raise GgufToolError(f"{repo_id}: a download ended early ({str(e).splitlines()[0]})",
                                hint="run the command again: finished files are kept") from None
        raise
    except Exception as e:  # httpx's transport errors (connect, read, write, protocol, timeouts), not named here
        if any(c.__name__ == "TransportError" for c in type(e).__mro__):
            raise GgufToolError(f"cannot download from {ep}: {e}", hint="check the network or HF_ENDPOINT") from None
        raise


def _url_file(e: Exception) -> str:
    url = str(getattr(getattr(e, "response", None), "url", "") or "")
    return url.split("/resolve/", 1)[-1].split("/", 1)[-1] if "/resolve/" in url else str(e).splitlines()[0]
