"""SIGKILL during `gguftool quantize`: the output name is either absent or a whole, valid file, and
the input never changes. Disk full: a clear error and no file left behind."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gguftool.cli import main
from gguftool.io.reader import GGUFFile

from .conftest import tiny_llama


def _start(src, out):
    return subprocess.Popen([sys.executable, "-m", "gguftool", "quantize", str(src), str(out), "Q5_1", "-t", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for_temporary(p, out, limit=60.0) -> float:
    """Seconds until the writer's temporary file appears (writing has begun)."""
    t0 = time.monotonic()
    while not list(out.parent.glob(f".{out.name}.*.tmp")) and p.poll() is None:
        if time.monotonic() - t0 > limit:
            raise AssertionError("quantize never started writing")
        time.sleep(0.005)
    return time.monotonic() - t0


def test_sigkill_at_random_points(tmp_path):
    rng = np.random.default_rng(3)
    src = tiny_llama(tmp_path / "in.gguf", rng, n_embd=512, n_ff=1536, n_vocab=256, n_layer=4)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    out = tmp_path / "out.gguf"
    # one undisturbed run: how long the write phase lasts, so the kills land inside it
    p = _start(src, out)
    _wait_for_temporary(p, out)
    t_write = time.monotonic()
    assert p.wait() == 0
    write_seconds = time.monotonic() - t_write
    out.unlink()
    outcomes = set()
    for delay in np.random.default_rng(11).uniform(0.0, 0.9 * write_seconds, size=6):
        p = _start(src, out)
        _wait_for_temporary(p, out)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if out.exists():
            f = GGUFFile(out)  # whole and valid, or this raises
            assert len(f.tensors) == len(GGUFFile(src).tensors)
            outcomes.add("complete")
            out.unlink()
        else:
            outcomes.add("absent")
        assert hashlib.sha256(src.read_bytes()).hexdigest() == digest
    assert "absent" in outcomes  # the kills did land mid-run
    # the next run cleans up what the killed ones left, and succeeds
    assert main(["quantize", str(src), str(out), "Q5_1"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.gguf", "out.gguf"]


def _mount_tiny_tmpfs(path) -> bool:
    if os.geteuid() != 0:
        return False
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


def test_disk_full_is_a_clear_error(tmp_path, rng, capsys):
    src = tiny_llama(tmp_path / "in.gguf", rng, n_embd=256, n_ff=512)
    full = tmp_path / "full"
    if not _mount_tiny_tmpfs(full):
        pytest.skip("needs root and tmpfs to make a small filesystem")
    try:
        assert main(["quantize", str(src), str(full / "o.gguf"), "Q8_0"]) == 1
        err = capsys.readouterr().err
        assert "disk full" in err and str(full / "o.gguf") in err
        assert os.listdir(full) == []
    finally:
        subprocess.run(["umount", str(full)])


def _alive(pid: int) -> bool:
    """running or sleeping (a zombie waiting for init to reap it counts as gone)"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _started_tool(p, pid_file, limit: float, what: str) -> int:
    """The pid the tool wrote once it runs (while gguftool, p, still runs)."""
    t0 = time.monotonic()
    while not (pid_file.is_file() and pid_file.read_text().strip()):
        assert time.monotonic() - t0 < limit and p.poll() is None, what
        time.sleep(0.01)
    pid = int(pid_file.read_text())
    assert _alive(pid)
    return pid


def _stops(pid: int, grace: float) -> bool:
    """Whether the process ends within `grace` seconds; one that does not is killed, so no test leaves it."""
    t0 = time.monotonic()
    while _alive(pid) and time.monotonic() - t0 < grace:
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_validate_stops_the_tool_it_runs(tmp_path, sig):
    """validate runs each llama tool in a session of its own (a timeout kills the whole group): when gguftool
    itself is interrupted, the tool (and GNU time around it) must stop too, not run on as an orphan."""
    script = (
        "import signal, sys\n"
        "from pathlib import Path\n"
        "from gguftool.validate.runners import _wait_rss\n"
        "def stop(*_): raise KeyboardInterrupt\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "d = Path(sys.argv[1])\n"
        "try:\n"
        "    _wait_rss(['sh', '-c', 'echo $$ > tool.pid; exec sleep 60'], {}, d, d / 'o', d / 'e', None)\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(130)\n")
    p = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)])
    tool = _started_tool(p, tmp_path / "tool.pid", 30, "the tool never started")
    p.send_signal(sig)
    assert p.wait(timeout=30) == 130
    assert _stops(tool, 10), "the tool outlived the interrupted gguftool"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_an_interrupted_adb_validate_stops_the_tool_on_the_phone(tmp_path, sig):
    """`validate --target adb` interrupted while a tool runs on the phone: a killed `adb shell` leaves its
    command running on the device, so gguftool must stop it there too (the fake phone's tool is a shell script
    that records its pid; the fake adb, like the real one, leaves it running when adb itself is killed)."""
    from .conftest import tiny_llama
    from .test_validate import FAKE_ADB
    bins = tmp_path / "bins"
    bins.mkdir()
    pid_file = tmp_path / "tool.pid"
    tool = bins / "llama-perplexity"
    # a loop, not `exec sleep`: like a real tool, the process keeps its own command line while it runs
    tool.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nwhile :; do sleep 0.1; done\n")
    tool.chmod(0o755)
    model = tiny_llama(tmp_path / "m.gguf", np.random.default_rng(0))
    text = tmp_path / "t.txt"
    text.write_text("It is a truth universally acknowledged. " * 50)
    env = {**os.environ, "PATH": f"{FAKE_ADB}{os.pathsep}{os.environ['PATH']}",
           "FAKE_ADB_ROOT": str(tmp_path / "phone"), "GGUFTOOL_NO_PROGRESS": "1"}
    env.pop("FAKE_ADB_STATE", None)
    p = subprocess.Popen([sys.executable, "-m", "gguftool", "validate", str(model), "--target", "adb",
                          "--bin-dir", str(bins), "--kv", "q8_0", "--text", str(text), "--no-bench", "--no-sample",
                          "--out", str(tmp_path / "rep")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pid = _started_tool(p, pid_file, 60, "the tool never started on the phone")
    p.send_signal(sig)
    assert p.wait(timeout=60) == 128 + sig, p.stderr.read().decode()[-2000:]
    assert _stops(pid, 15), "the tool kept running on the phone after gguftool was interrupted"
