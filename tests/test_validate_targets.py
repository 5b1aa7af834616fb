"""The adb and qemu-arm64 runners, end to end on a small static aarch64 program.

The adb path runs against tests/fake_adb/adb (a folder as the phone's storage, adb's messages
and exit codes, `shell` running pushed aarch64 binaries under qemu-user). References: Python's
own FNV-1a and sha256 of the same files, the files found in the fake phone's storage, and the
fake's log of which adb commands were issued. Needs aarch64-linux-gnu-gcc and qemu-aarch64
(`apt-get install gcc-aarch64-linux-gnu qemu-user`); skipped with that reason otherwise."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gguftool.errors import GgufToolError
from gguftool.validate.runners import AdbRunner, QemuRunner

HERE = Path(__file__).parent
FAKE_ADB = HERE / "fake_adb"
PROBE_SRC = HERE / "data" / "validate_probe.c"


def fnv1a64(data: bytes) -> str:
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


@pytest.fixture(scope="module")
def arm_bin(tmp_path_factory) -> Path:
    cc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
    if not cc or not qemu:
        pytest.skip("aarch64-linux-gnu-gcc or qemu-aarch64 missing (apt-get install gcc-aarch64-linux-gnu qemu-user)")
    d = tmp_path_factory.mktemp("armbin")
    r = subprocess.run([cc, "-O2", "-static", "-std=c99", str(PROBE_SRC), "-o", str(d / "probe")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cc_host = shutil.which("cc") or shutil.which("gcc")
    if cc_host:   # a host (x86) binary, to show the "phone" refuses it like Android does
        subprocess.run([cc_host, "-O2", "-std=c99", str(PROBE_SRC), "-o", str(d / "probe-host")], check=True)
    return d


@pytest.fixture
def phone(tmp_path, monkeypatch):
    """The fake adb first on PATH, an empty phone, a command log."""
    root, log = tmp_path / "phone", tmp_path / "adb.log"
    root.mkdir()
    monkeypatch.setenv("PATH", f"{FAKE_ADB}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ADB_ROOT", str(root))
    monkeypatch.setenv("FAKE_ADB_LOG", str(log))
    monkeypatch.delenv("ADB", raising=False)
    monkeypatch.delenv("MSYS_NO_PATHCONV", raising=False)
    for k in ("FAKE_ADB_STATE", "FAKE_ADB_CAPACITY", "FAKE_ADB_SERIAL"):
        monkeypatch.delenv(k, raising=False)

    def calls():
        return [json.loads(l) for l in log.read_text().splitlines()] if log.exists() else []
    return root, calls


def test_qemu_runner_runs_the_aarch64_build(arm_bin, tmp_path):
    data = os.urandom(5000)
    (tmp_path / "in.bin").write_bytes(data)
    r = QemuRunner(arm_bin, tmp_path / "work")
    res = r.run("probe", [r.push(tmp_path / "in.bin"), "24"], tag="probe")
    assert res.rc == 0, res.stderr
    assert res.stdout.split()[0] == f"fnv1a64={fnv1a64(data)}" and res.stdout.split()[1] == f"pages={24 * 256}"
    assert res.argv[0].endswith("qemu-aarch64") and res.stderr.strip() == "probe: done"
    assert res.peak_rss_kib > 24 * 1024   # the guest's 24 MiB live inside the emulator's RSS


def test_adb_push_run_pull_and_checksum_skips(arm_bin, phone, tmp_path):
    root, calls = phone
    data = os.urandom(3000)
    (tmp_path / "model.gguf").write_bytes(data)
    r = AdbRunner(arm_bin, tmp_path / "work")
    r.prepare(["probe"])
    assert r.serial == "emulator-5554" and r.has_time
    remote = r.push(tmp_path / "model.gguf")
    assert remote == "/data/local/tmp/gguftool/model.gguf"
    # the files really are on the "phone", byte for byte
    for name, src in (("probe", arm_bin / "probe"), ("model.gguf", tmp_path / "model.gguf")):
        on_phone = root / "data/local/tmp/gguftool" / name
        assert hashlib.sha256(on_phone.read_bytes()).hexdigest() == hashlib.sha256(src.read_bytes()).hexdigest()
    assert os.access(root / "data/local/tmp/gguftool/probe", os.X_OK)
    res = r.run("probe", [remote, "16"], tag="probe1")
    assert res.rc == 0, res.stderr
    assert res.stdout.strip() == f"fnv1a64={fnv1a64(data)} pages={16 * 256}"
    assert res.stderr.strip() == "probe: done"            # toybox time -v block stripped ...
    assert res.peak_rss_kib and res.peak_rss_kib > 16 * 1024   # ... and read
    # outputs came back by adb pull, into the local work folder
    assert (tmp_path / "work" / "probe1.out").read_text() == res.stdout
    assert any("pull" in c["argv"] for c in calls())
    assert all(c["MSYS_NO_PATHCONV"] == "1" for c in calls())
    n_push = sum(1 for c in calls() if "push" in c["argv"])
    assert n_push == 2
    # a second session: same files on the phone -> no push at all, only sha256sum checks
    r2 = AdbRunner(arm_bin, tmp_path / "work2")
    r2.prepare(["probe"])
    r2.push(tmp_path / "model.gguf")
    assert sum(1 for c in calls() if "push" in c["argv"]) == n_push
    assert [p["skipped"] for p in r2.pushed] == [True, True]
    # a changed file is pushed again
    (tmp_path / "model.gguf").write_bytes(data + b"x")
    r2.push(tmp_path / "model.gguf")
    assert r2.pushed[-1]["skipped"] is False
    assert (root / "data/local/tmp/gguftool/model.gguf").read_bytes() == data + b"x"


def test_adb_run_reports_a_failing_program(arm_bin, phone, tmp_path):
    r = AdbRunner(arm_bin, tmp_path / "work")
    r.prepare(["probe"])
    res = r.run("probe", ["/data/local/tmp/gguftool/missing.bin", "1"])
    assert res.rc == 3 and "No such file or directory" in res.stderr
    if (arm_bin / "probe-host").exists():   # an x86 binary on an arm phone
        r.push(arm_bin / "probe-host", "probe-host", executable=True)
        res = r.run("probe-host", ["x", "1"])
        assert res.rc == 126 and "not executable" in res.stderr


@pytest.mark.parametrize("state,match", [("none", "no Android device"), ("unauthorized", "unauthorized"),
                                         ("offline", "offline")])
def test_adb_device_errors(arm_bin, phone, tmp_path, monkeypatch, state, match):
    monkeypatch.setenv("FAKE_ADB_STATE", state)
    r = AdbRunner(arm_bin, tmp_path / "work")
    with pytest.raises(GgufToolError, match=match) as e:
        r.prepare(["probe"])
    assert e.value.hint
    r = AdbRunner(arm_bin, tmp_path / "work", serial="emulator-5554")
    with pytest.raises(GgufToolError, match=match):
        r.prepare(["probe"])


def test_adb_wrong_serial_and_no_space(arm_bin, phone, tmp_path, monkeypatch):
    r = AdbRunner(arm_bin, tmp_path / "work", serial="R58M12345")
    with pytest.raises(GgufToolError, match="no Android device"):
        r.prepare(["probe"])
    root, _ = phone
    monkeypatch.setenv("FAKE_ADB_CAPACITY", str((arm_bin / "probe").stat().st_size + 1000))
    r = AdbRunner(arm_bin, tmp_path / "work")
    r.prepare(["probe"])
    (tmp_path / "big.gguf").write_bytes(os.urandom(5000))
    with pytest.raises(GgufToolError, match="ran out of storage") as e:
        r.push(tmp_path / "big.gguf")
    assert "No space left on device" in e.value.message and "rm -r" in e.value.hint
    assert not (root / "data/local/tmp/gguftool/big.gguf").exists()


def test_adb_missing(arm_bin, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # no adb anywhere
    monkeypatch.delenv("ADB", raising=False)
    with pytest.raises(GgufToolError, match="adb is not installed") as e:
        AdbRunner(arm_bin, tmp_path / "work")
    assert "platform-tools" in e.value.hint
