"""`gguftool hub` against a fake Hub on 127.0.0.1, driven by the real huggingface_hub client."""
from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gguftool.cli import main
from gguftool.convert import archs
from gguftool.errors import GgufToolError
from gguftool.io import hub as hubio
from gguftool.io.reader import GGUFFile
from gguftool.io.safetensors import Checkpoint

from .conftest import tiny_llama
from .hfserver import FakeHub
from .test_convert import tiny_checkpoint

REPO = "tests-org/tiny-llama"


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def checkpoint_files(tmp_path, rng) -> dict[str, bytes]:
    files = _files(tiny_checkpoint(tmp_path / "src", rng, n_embd=128, n_ff=256))
    # what a real repo also holds and a conversion must not download
    files.update({"pytorch_model.bin": b"\0" * 4096, "onnx/model.onnx": b"\1" * 4096, "README.md": b"# tiny\n"})
    return files


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with FakeHub() as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_HUB_CACHE", raising=False)
        for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        yield h


def _hub(*args) -> int:
    return main(["hub", *map(str, args)])


def test_one_command_q4_hqq_from_the_hub(hub, checkpoint_files, tmp_path):
    pytest.importorskip("gguftool._fast._hqq")
    from gguftool.quant import codec
    repo = hub.add(REPO, checkpoint_files)
    out = tmp_path / "tiny-q4hqq.gguf"
    assert _hub(REPO, "--type", "Q4_HQQ", "-o", out, "--threads", "1") == 0
    f = GGUFFile(out)
    assert f.get("gguftool.source.commit") == repo.sha and f.get("gguftool.source.repo") == REPO
    assert f.get("gguftool.source.revision") == "main"
    # only the conversion's files crossed the wire
    fetched = {p.split("/resolve/")[1].split("/", 1)[1] for _, p, _ in hub.requests("GET", "") if "/resolve/" in p}
    assert fetched == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"}
    # the bytes are the Q4_HQQ codec applied to the (permuted) checkpoint weights
    ck = Checkpoint(hub_snapshot(tmp_path, repo.sha))
    q = ck["model.layers.1.self_attn.q_proj.weight"].array()
    t = f.tensor("blk.1.attn_q.weight")
    assert t.type.name == "Q4_HQQ"
    assert np.array_equal(t.raw_rows(), codec("Q4_HQQ").quantize(archs.permute(q, 4).astype(np.float32)))
    assert f.tensor("output.weight").type.name == "Q8_0"  # llama-quantize's rule for the output tensor


def hub_snapshot(tmp_path: Path, sha: str) -> Path:
    return tmp_path / "hf-home" / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / sha


def test_dropped_connection_resumes_with_a_range_request(hub, checkpoint_files, tmp_path, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1 << 14)  # small chunks: a cut lands after whole chunks
    repo = hub.add(REPO, checkpoint_files)
    size = len(checkpoint_files["model.safetensors"])
    hub.drop_after["model.safetensors"] = size // 2
    snap = hubio.fetch(REPO)
    gets = hub.requests("GET", "/model.safetensors")
    assert len(gets) == 2 and gets[0][2] is None
    start = int(gets[1][2].removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= size // 2  # resumed, not restarted
    got = (snap.path / "model.safetensors").read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(checkpoint_files["model.safetensors"]).digest()
    assert snap.commit == repo.sha


def test_interrupted_run_fetches_only_what_is_missing(hub, checkpoint_files, tmp_path):
    hub.add(REPO, checkpoint_files)
    hub.hidden.add("model.safetensors")  # the first run fails on this file (404 EntryNotFound)
    out = tmp_path / "o.gguf"
    with pytest.raises(GgufToolError, match="model.safetensors"):
        hubio.fetch(REPO)
    assert _hub(REPO, "--type", "F16", "-o", out) == 1 and not out.exists()
    hub.hidden.clear()
    n_config = len(hub.requests("GET", "/config.json"))
    assert _hub(REPO, "--type", "F16", "-o", out) == 0
    assert len(hub.requests("GET", "/config.json")) == n_config  # finished files are not downloaded again
    assert len(hub.requests("GET", "/model.safetensors")) == 1
    assert GGUFFile(out).tensor("blk.0.ffn_up.weight").type.name == "F16"


@pytest.mark.parametrize("args,match", [
    (["--type", "Q4_KX"], "unknown quantization type 'Q4_KX' (did you mean Q4_K?)"),
    (["--recipe", "no-such-recipe"], "no-such-recipe"),
    (["--tensor-type", "ffn_up=Q9_9"], "Q9_9"),
])
def test_a_bad_target_is_refused_before_anything_downloads(hub, checkpoint_files, tmp_path, capsys, args, match):
    hub.add(REPO, checkpoint_files)
    assert _hub(REPO, *args, "-o", tmp_path / "o.gguf") == 1
    assert match in capsys.readouterr().err
    assert hub.requests("GET", "/model.safetensors") == [] and hub.requests("GET", "/config.json") == []


def test_index_naming_a_missing_shard_is_a_clear_error(hub, tmp_path, rng):
    files = _files(tiny_checkpoint(tmp_path / "src", rng, shards=2))
    del files["model-00002-of-00002.safetensors"]
    hub.add(REPO, files)
    out = tmp_path / "o.gguf"
    assert _hub(REPO, "--type", "F16", "-o", out) == 1 and not out.exists()
    with pytest.raises(GgufToolError, match="missing: model-00002-of-00002.safetensors"):
        Checkpoint(hubio.fetch(REPO).path)


def test_not_found_private_and_bad_token(hub, checkpoint_files, monkeypatch):
    with pytest.raises(GgufToolError, match="not found"):
        hubio.fetch("nobody/nothing")
    hub.add(REPO, checkpoint_files, private_token="hf_right")
    with pytest.raises(GgufToolError) as e:  # 401 without a token: the hub hides private repos
        hubio.fetch(REPO)
    assert "private" in e.value.message and "HF_TOKEN" in e.value.hint
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(GgufToolError, match="401"):
        hubio.fetch(REPO)
    monkeypatch.setenv("HF_TOKEN", "hf_right")
    assert hubio.fetch(REPO).kind == "checkpoint"
    with pytest.raises(GgufToolError, match="revision 'v9' not found"):
        hubio.fetch(REPO, "v9")


def test_offline_mode_uses_the_warm_cache(hub, checkpoint_files, tmp_path, monkeypatch):
    repo = hub.add(REPO, checkpoint_files)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(GgufToolError, match="not in the local cache"):  # cold cache
        hubio.fetch(REPO)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    hubio.fetch(REPO)
    n = len(hub.log)
    hub.server.shutdown()  # no network from here on
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "offline.gguf"
    assert _hub(REPO, "--type", "Q8_0", "-o", out) == 0
    assert len(hub.log) == n
    assert GGUFFile(out).get("gguftool.source.commit") == repo.sha
    assert hubio.fetch(REPO, repo.sha).commit == repo.sha  # by commit too


def test_revision_is_pinned_and_recorded(hub, checkpoint_files, tmp_path):
    repo = hub.add(REPO, checkpoint_files, refs={"v1.0": ""})
    repo.refs["v1.0"] = repo.sha
    out = tmp_path / "o.gguf"
    assert _hub(REPO, "--revision", "v1.0", "--type", "F32", "-o", out) == 0
    f = GGUFFile(out)
    assert (f.get("gguftool.source.revision"), f.get("gguftool.source.commit")) == ("v1.0", repo.sha)
    # every file request named the commit, never the moving tag
    assert all(repo.sha in p for m, p, _ in hub.log if "/resolve/" in p)


def test_gguf_repository_is_requantized(hub, tmp_path, rng):
    src = tmp_path / "src"
    src.mkdir()
    f32 = tiny_llama(src / "tiny-F32.gguf", rng)
    f16 = tiny_llama(src / "tiny-F16.gguf", rng, dtype=np.float16)
    hub.add("tests-org/tiny-GGUF", {"tiny-F32.gguf": f32.read_bytes(), "tiny-F16.gguf": f16.read_bytes(),
                                    "README.md": b"# gguf\n"})
    out = tmp_path / "o.gguf"
    assert _hub("tests-org/tiny-GGUF", "--type", "Q8_0", "-o", out) == 0  # F32 is the most precise: chosen
    g = GGUFFile(out)
    assert g.get("gguftool.source.file") == "tiny-F32.gguf" and g.tensor("blk.0.attn_q.weight").type.name == "Q8_0"
    fetched = [p for _, p, _ in hub.requests("GET") if p.endswith(".gguf")]
    assert len(fetched) == 1 and fetched[0].endswith("tiny-F32.gguf")
    assert _hub("tests-org/tiny-GGUF", "--gguf-pattern", "*F16.gguf", "--type", "Q8_0", "-o", out) == 0
    assert GGUFFile(out).get("gguftool.source.file") == "tiny-F16.gguf"
    with pytest.raises(GgufToolError, match="no GGUF file matches"):
        hubio.fetch("tests-org/tiny-GGUF", gguf_pattern="*Q2_K*")


# -- the attempt limit (issue #14, bounded work) ------------------------------------------------------
def test_a_connection_that_always_breaks_hits_the_attempt_limit(hub, checkpoint_files, tmp_path, monkeypatch, capsys):
    """Each try brings a few bytes, so huggingface_hub alone would retry it without end: it is tried --attempts times."""
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1 << 12)
    hub.add(REPO, checkpoint_files)
    hub.cut_every["model.safetensors"] = 5000
    out = tmp_path / "o.gguf"
    assert _hub(REPO, "--type", "F16", "-o", out, "--attempts", "3") == 1
    err = capsys.readouterr().err
    assert f"error: {REPO}: gave up on model.safetensors after 3 attempts (the last: HTTP 206, then the connection broke)" \
        in err and "the files that finished are cached" in err and "unexpected" not in err
    assert len(hub.requests("GET", "/model.safetensors")) == 3 and not out.exists()
    hub.cut_every.clear()   # the server mends: the next run finishes, without fetching the finished files again
    n_config = len(hub.requests("GET", "/config.json"))
    assert _hub(REPO, "--type", "F16", "-o", out) == 0
    assert len(hub.requests("GET", "/config.json")) == n_config == 1


def test_a_server_answering_500_for_files_hits_the_attempt_limit(hub, checkpoint_files, tmp_path, capsys):
    hub.add(REPO, checkpoint_files)
    hub.status_files = 500
    assert _hub(REPO, "--type", "F16", "-o", tmp_path / "o.gguf", "--attempts", "2") == 1
    err = capsys.readouterr().err
    assert re.search(rf"error: {REPO}: gave up on \S+ after 2 attempts \(the last: HTTP 500\)", err), err
    per_file = Counter(p for m, p, _ in hub.log if "/resolve/" in p)
    assert per_file and max(per_file.values()) <= 2


def test_a_server_answering_500_to_everything_is_one_clear_error(hub, checkpoint_files, tmp_path, capsys):
    hub.add(REPO, checkpoint_files)
    hub.status_all = 500
    assert _hub(REPO, "--type", "F16", "-o", tmp_path / "o.gguf") == 1
    err = capsys.readouterr().err
    assert "500" in err and REPO in err and "unexpected" not in err
    assert len(hub.log) <= ATTEMPTS_DEFAULT


ATTEMPTS_DEFAULT = hubio.ATTEMPTS


def test_a_server_that_hangs_up_at_once_is_one_clear_error(tmp_path, monkeypatch, capsys):
    """Accepts the connection and closes it before answering, every time."""
    import socket
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    accepted = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            accepted.append(1)
            c.close()
    threading.Thread(target=serve, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{srv.getsockname()[1]}")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        assert _hub(REPO, "-o", tmp_path / "o.gguf", "--deadline", "60") == 1
        err = capsys.readouterr().err
        assert "error: " in err and "127.0.0.1" in err and "unexpected" not in err, err
        assert len(accepted) <= ATTEMPTS_DEFAULT
    finally:
        srv.close()


def test_the_overall_retry_budget(monkeypatch):
    """Many requests each retried a little: the download stops at RETRIES_PER_ATTEMPT x attempts retries in all."""
    from types import SimpleNamespace
    b = hubio._Attempts(3)
    assert b.retries == hubio.RETRIES_PER_ATTEMPT * 3
    with pytest.raises(hubio._GaveUp, match=r"gave up after 12 retries in all \(the last of f12: HTTP 503\)"):
        for i in range(100):
            req = SimpleNamespace(method="GET", url=f"http://h/org/m/resolve/abc/f{i}")
            b.on_request(req)
            b.on_response(SimpleNamespace(request=req, status_code=503))
            b.on_request(req)   # one retry each: none reaches 3 attempts
    assert b.n_retries == 13
    with pytest.raises(hubio._GaveUp):   # and everything after it is refused too
        b.on_request(SimpleNamespace(method="GET", url="http://h/other"))


# -- hostile hub answers (issue #14, no traceback) -----------------------------------------------------
_SHA = "a" * 40
HUB_ANSWERS = {   # id: (the repository info's body, what the error says)
    "not-json": (b"<html>hi</html>", "is not a hub's answer (JSONDecodeError"),
    "a-list": (b"[1]", "is not a hub's answer (TypeError"),
    "not-utf8": (b"\xff\xfe{", "is not a hub's answer (UnicodeDecodeError"),
    "nested-100k-deep": (b"[" * 100000 + b"]" * 100000, "is not a hub's answer (RecursionError"),
    "siblings-a-string": ({"id": REPO, "sha": _SHA, "siblings": "x"}, "is not a hub's answer"),
    "siblings-ints": ({"id": REPO, "sha": _SHA, "siblings": [1, 2]}, "is not a hub's answer"),
    "sibling-without-name": ({"id": REPO, "sha": _SHA, "siblings": [{"x": 1}]}, "is not a hub's answer (KeyError"),
    "file-name-an-int": ({"id": REPO, "sha": _SHA, "siblings": [{"rfilename": 5}]}, "lists the file 5, which is not"),
    "file-name-dot-dot": ({"id": REPO, "sha": _SHA, "siblings": [{"rfilename": "../../x-Q8_0.gguf"}]},
                          "lists the file '../../x-Q8_0.gguf', which is not a relative path inside the repository"),
    "file-name-absolute": ({"id": REPO, "sha": _SHA, "siblings": [{"rfilename": "/etc/config.json"}]},
                           "lists the file '/etc/config.json'"),
    "no-commit": ({"id": REPO, "siblings": []}, "None is not a commit id"),
}


@pytest.mark.parametrize("case", HUB_ANSWERS)
def test_a_hostile_hub_answer_is_one_clear_error(hub, checkpoint_files, tmp_path, capsys, case):
    import json
    body, wanted = HUB_ANSWERS[case]
    hub.add(REPO, checkpoint_files)
    hub.info_body = body if isinstance(body, bytes) else json.dumps(body).encode()
    assert _hub(REPO, "-o", tmp_path / "o.gguf", "--deadline", "60") == 1
    err = capsys.readouterr().err
    assert f"error: {hub.url}: " in err and wanted in err and "unexpected" not in err, err
    assert not (tmp_path / "o.gguf").exists()


def test_an_endless_answer_keeps_memory_bounded(hub, checkpoint_files, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hubio, "ANSWER_LIMIT", 4 << 20)
    hub.add(REPO, checkpoint_files)
    hub.info_endless = True
    assert _hub(REPO, "-o", tmp_path / "o.gguf", "--deadline", "60") == 1
    err = capsys.readouterr().err
    assert f"error: {REPO}: gave up on 127.0.0.1" in err and "its answer runs past 4 MiB" in err, err


@pytest.mark.parametrize("body", [b"<html>", b'{"a": 1}', b'[{"type": "file"}]', b'[{"type": "file", "path": 5, "size": "x"}]',
                                  b"[" * 100000], ids=["html", "object", "no-path", "wrong-types", "deep"])
def test_a_hostile_file_list_is_one_clear_error(hub, checkpoint_files, tmp_path, capsys, body):
    hub.add(REPO, checkpoint_files)
    hub.tree_body = body
    rc = _hub(REPO, "-o", tmp_path / "o.gguf", "--deadline", "60")
    err = capsys.readouterr().err
    assert rc == 1 and f"error: {hub.url}: the files of {REPO}@" in err and "is not a hub's answer" in err, err


def test_files_stored_in_xet_come_over_counted_http(hub, checkpoint_files, tmp_path, capsys):
    """With hf_xet installed, huggingface_hub moves a file the Hub keeps in Xet through hf_xet's own client,
    which the attempt budget never sees. gguftool downloads such files over plain HTTP(S): a connection that
    always breaks hits --attempts as for any file, and a server that mends then serves the run (the fake hub
    has no CAS server, so a transfer through hf_xet could not succeed)."""
    pytest.importorskip("hf_xet")
    from huggingface_hub import constants
    hub.add(REPO, checkpoint_files)
    hub.xet = True
    hub.cut_every["model.safetensors"] = 5000
    out = tmp_path / "o.gguf"
    assert _hub(REPO, "--type", "F16", "-o", out, "--attempts", "2") == 1
    assert "gave up on model.safetensors after 2 attempts" in capsys.readouterr().err
    assert len(hub.requests("GET", "/model.safetensors")) == 2
    hub.cut_every.clear()
    assert _hub(REPO, "--type", "F16", "-o", out) == 0 and out.exists()
    assert constants.HF_HUB_DISABLE_XET is False   # restored after the download
