"""Where a validation run executes: this machine, an Android phone over adb, or arm64 under qemu-user.

All three share one interface, so the validation plan is written once:

    r.push(local_file)         -> path of that file as the target's programs see it
    r.run(tool, args, tag=..)  -> RunResult (rc, stdout, stderr, peak RSS, seconds)
    r.pull(target_path, local) -> local copy of a file the target wrote
    r.path(name)               -> a path for a new file in the target's work folder

Peak memory is the kernel's high-water mark for the child (wait4's ru_maxrss), read directly
on local runs and through `time -v` on the phone (toybox). Under qemu-user it is the emulator's
RSS (guest + translator), so it is reported but not comparable with a phone's.
"""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GgufToolError, did_you_mean
from . import metrics

REMOTE_DIR = "/data/local/tmp/gguftool"


@dataclass
class RunResult:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    seconds: float
    peak_rss_kib: int | None
    env: dict = field(default_factory=dict)

    @property
    def log(self) -> str:
        return self.stdout + self.stderr

    def command(self) -> str:
        envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (envs + " " if envs else "") + " ".join(shlex.quote(a) for a in self.argv)


def sha256_file(path: Path, _cache: dict = {}) -> str:  # noqa: B006 - deliberate per-process memo
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _cache[key] = h.hexdigest()
    return _cache[key]


GNU_TIME = Path("/usr/bin/time")


def _wait_rss(argv: list[str], env: dict, cwd: Path, out: Path, err: Path, timeout: float | None) -> tuple[int, int]:
    """Run argv with stdout/stderr into files; (rc, peak RSS KiB).

    A child forked from this (possibly large) Python process inherits its memory high-water mark at
    exec, so wait4's ru_maxrss can report the parent's size. GNU time forks the program from a small
    process and reports it correctly; wait4 is the fallback where it is missing."""
    rss_file = out.with_name(out.name + ".maxrss")
    timed = GNU_TIME.is_file()
    if timed:
        argv = [str(GNU_TIME), "-f", "%M", "-o", str(rss_file), *argv]
    with open(out, "wb") as fo, open(err, "wb") as fe:
        try:
            p = subprocess.Popen(argv, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                 start_new_session=True)
        except OSError as e:
            raise GgufToolError(f"cannot run {argv[0]}: {e.strerror}") from e
        timer = None
        if timeout:
            timer = threading.Timer(timeout, lambda: os.killpg(p.pid, signal.SIGKILL))
            timer.start()
        reaped = False
        try:
            _, status, ru = os.wait4(p.pid, 0)
            reaped = True
        finally:
            if timer:
                timer.cancel()
            if not reaped:   # interrupted (Ctrl-C, SIGTERM, SIGHUP): the tool has a session of its own, stop it too
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                    os.waitpid(p.pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
        p.returncode = os.waitstatus_to_exitcode(status)  # keep Popen from waiting again
    if timed:
        try:
            return p.returncode, int(rss_file.read_text().split()[-1])
        except (OSError, ValueError, IndexError):
            pass  # killed before time wrote its line
    return p.returncode, int(ru.ru_maxrss)


class Runner:
    """Base: a target with a work folder. Subclasses say how files move and programs start."""
    name = "?"
    emulated = False

    def __init__(self, bin_dir: Path, workdir: Path, threads: int = 2):
        # absolute: the tools run with the work folder as their current directory
        self.bin_dir = Path(bin_dir).resolve()
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.threads = threads
        self._n = 0

    def describe(self) -> dict:
        return {"target": self.name, "bin_dir": str(self.bin_dir), "emulated": self.emulated}

    def prepare(self, tools: list[str]) -> None:
        for t in tools:
            if not (self.bin_dir / t).is_file():
                raise GgufToolError(f"{t} is missing from {self.bin_dir}",
                                    "build the tools first (see `gguftool validate --help`)")

    def push(self, local: Path, name: str | None = None) -> str:
        return str(Path(local).resolve())

    def path(self, name: str) -> str:
        return str((self.workdir / name).resolve())

    def pull(self, target_path: str, local: Path) -> Path:
        if Path(target_path).resolve() != Path(local).resolve():
            shutil.copyfile(target_path, local)
        return Path(local)

    def _tag(self, tool: str, tag: str | None) -> str:
        self._n += 1
        return re.sub(r"[^A-Za-z0-9_.-]", "_", tag or f"{self._n:03d}-{tool}")

    def _argv(self, tool: str, args: list[str]) -> list[str]:
        return [str(self.bin_dir / tool), *args]

    def run(self, tool: str, args: list[str], env: dict | None = None, tag: str | None = None,
            timeout: float | None = None) -> RunResult:
        tag = self._tag(tool, tag)
        argv = self._argv(tool, [str(a) for a in args])
        full_env = dict(os.environ, **(env or {}))
        out, err = self.workdir / f"{tag}.out", self.workdir / f"{tag}.err"
        t0 = time.monotonic()
        rc, rss = _wait_rss(argv, full_env, self.workdir, out, err, timeout)
        return RunResult(argv, rc, out.read_text(errors="replace"), err.read_text(errors="replace"),
                         time.monotonic() - t0, rss, dict(env or {}))


class LocalRunner(Runner):
    """The host's native build (gguftool native build)."""
    name = "local"


class QemuRunner(Runner):
    """The static aarch64 build, run on this machine under qemu-user."""
    name = "qemu-arm64"
    emulated = True

    def __init__(self, bin_dir: Path, workdir: Path, threads: int = 2, qemu: str | None = None, cpu: str = "max"):
        super().__init__(bin_dir, workdir, threads)
        self.qemu = qemu or find_qemu()
        self.cpu = cpu

    def describe(self) -> dict:
        return {**super().describe(), "qemu": self.qemu, "qemu_cpu": self.cpu}

    def _argv(self, tool: str, args: list[str]) -> list[str]:
        return [self.qemu, "-cpu", self.cpu, str(self.bin_dir / tool), *args]


def find_qemu() -> str:
    q = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if not q:
        raise GgufToolError("qemu-aarch64 is not installed (needed for --target qemu-arm64)",
                            "`apt-get install qemu-user` (Debian/Ubuntu) or qemu-user-static")
    return q


# ---------------------------------------------------------------------------------------------- adb

ADB_NO_DEVICE = ("no devices/emulators found", "no devices found")
# the states `adb devices` prints (adb's transport.cpp: to_string(ConnectionState)); "no permissions" is two words
ADB_STATES = ("device", "offline", "unauthorized", "bootloader", "recovery", "rescue", "sideload", "host",
              "authorizing", "connecting", "detached", "unknown", "no")
ADB_OUTPUT_LIMIT = 1 << 20   # bytes kept of each adb output stream
LOG_LIMIT = 16 << 20         # bytes kept (the end) of each log a run on the device brings back


def _drain(stream, kept: dict[int, bytes], i: int) -> None:
    """Read a pipe to its end, keeping its first ADB_OUTPUT_LIMIT bytes."""
    head = bytearray()
    for chunk in iter(lambda: stream.read(1 << 16), b""):
        if len(head) < ADB_OUTPUT_LIMIT:
            head += chunk[:ADB_OUTPUT_LIMIT - len(head)]
    stream.close()
    kept[i] = bytes(head)


def read_log_tail(path: Path, limit: int = LOG_LIMIT) -> str:
    """A log file's text, its last `limit` bytes only (a note says how much was left out)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size > limit:
            f.seek(size - limit)
        data = f.read(limit)
    text = data.decode("utf-8", errors="replace")
    return f"[{size - limit} bytes before this were left out]\n{text}" if size > limit else text


class AdbRunner(Runner):
    """An Android device over adb: binaries and inputs pushed to /data/local/tmp/gguftool, each run's
    stdout/stderr/exit status written to files there and pulled back.

    Pushes are skipped when `sha256sum` on the device already gives the local file's digest.
    MSYS_NO_PATHCONV=1 is set for every adb call: Git Bash on Windows otherwise rewrites
    /data/local/tmp/... into a local Windows path and `adb push` "succeeds" into nowhere."""
    name = "adb"

    def __init__(self, bin_dir: Path, workdir: Path, threads: int = 2, serial: str | None = None,
                 adb: str | None = None, remote_dir: str = REMOTE_DIR):
        super().__init__(bin_dir, workdir, threads)
        self.adb = adb or os.environ.get("ADB") or shutil.which("adb")
        if not self.adb:
            raise GgufToolError("adb is not installed or not on PATH (needed for --target adb)",
                                "install Android platform-tools (`apt-get install adb`, or the SDK's "
                                "platform-tools) and put adb on PATH, or set ADB=/path/to/adb")
        self.serial = serial
        self.remote_dir = remote_dir.rstrip("/")
        self.pushed: list[dict] = []   # record of every push: name, bytes, skipped
        self.has_time = False

    def describe(self) -> dict:
        return {**super().describe(), "serial": self.serial, "remote_dir": self.remote_dir, "adb": self.adb}

    # -- adb plumbing
    def _adb(self, *args: str, timeout: float | None = 600, check: bool = True) -> subprocess.CompletedProcess:
        """Run adb; its output is text (bytes that are not UTF-8 replaced) and at most ADB_OUTPUT_LIMIT bytes of
        each stream are kept (the rest is read and dropped: an adb that prints without end cannot fill memory)."""
        cmd = [self.adb] + (["-s", self.serial] if self.serial else []) + list(args)
        env = dict(os.environ, MSYS_NO_PATHCONV="1")
        try:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
        except OSError as e:
            raise GgufToolError(f"cannot run {self.adb}: {e.strerror}",
                                "point ADB (or PATH) at Android platform-tools' adb") from None
        kept: dict[int, bytes] = {}
        readers = [threading.Thread(target=_drain, args=(f, kept, i), daemon=True)
                   for i, f in enumerate((p.stdout, p.stderr))]
        for t in readers:
            t.start()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise GgufToolError(f"adb {' '.join(args[:2])} did not finish within {timeout:.0f} s",
                                "is the device still connected? (`adb devices`)") from None
        except BaseException:   # interrupted (Ctrl-C, SIGTERM, SIGHUP): no adb left running behind us
            p.kill()
            p.wait()
            raise
        finally:
            for t in readers:
                t.join(10)
        out, err = (kept.get(i, b"").decode("utf-8", errors="replace") for i in (0, 1))
        r = subprocess.CompletedProcess(cmd, p.returncode, out, err)
        if check and r.returncode != 0:
            self._raise(r, args)
        return r

    def _raise(self, r: subprocess.CompletedProcess, args) -> None:
        msg = (r.stderr + r.stdout).strip()
        low = msg.lower()
        if any(s in low for s in ADB_NO_DEVICE) or ("device" in low and "not found" in low):
            raise GgufToolError(f"no Android device found by adb ({msg.splitlines()[0] if msg else 'no output'})",
                                "connect the phone by USB, enable USB debugging (Settings > Developer options),"
                                " check `adb devices`; with several devices use --target adb:SERIAL")
        if "unauthorized" in low:
            raise GgufToolError("the device is unauthorized: this computer's adb key is not accepted yet",
                                "unlock the phone and accept the 'Allow USB debugging?' dialog, then retry")
        if "no permissions" in low:
            raise GgufToolError("adb may not open the device (no permissions)",
                                "add a udev rule for the phone (Android's `android-udev-rules`), replug it, "
                                "then `adb kill-server && adb devices`")
        if "offline" in low:
            raise GgufToolError("the device is offline", "reconnect the cable; `adb kill-server && adb devices`")
        if "no space left" in low:
            raise GgufToolError(f"the device ran out of storage: {msg.splitlines()[-1]}",
                                f"free space under {self.remote_dir} (`adb shell rm -r {self.remote_dir}`) "
                                "or use a smaller model")
        raise GgufToolError(f"adb {' '.join(args[:2])} failed (exit {r.returncode}): {msg[-400:]}")

    def check_device(self) -> str:
        """The serial of the one ready device, or a clear error for none / unauthorized / offline / several."""
        r = self._adb("devices", check=False) if not self.serial else None
        if r is not None:
            # `serial<TAB>state [details]`; other lines (daemon notices, noise) are not devices
            rows = [w for w in (l.split() for l in r.stdout.splitlines()[1:]) if len(w) >= 2 and w[1] in ADB_STATES]
            if not rows:
                raise GgufToolError("no Android device found by adb (`adb devices` lists none)",
                                    "connect the phone by USB and enable USB debugging (Developer options)")
            states = {s: ("no permissions" if st == "no" else st) for s, st, *_ in rows}
            ready = [s for s, st in states.items() if st == "device"]
            if not ready:
                st = next(iter(states.values()))
                self._raise(subprocess.CompletedProcess([], 1, "", f"device {st}"), ["devices"])
            if len(ready) > 1:
                raise GgufToolError(f"several devices are connected ({', '.join(ready)})",
                                    f"pick one with --target adb:{ready[0]}")
            self.serial = ready[0]
        else:
            st = self._adb("get-state", check=False)
            if st.returncode != 0 or st.stdout.strip() != "device":
                self._raise(st if st.returncode else subprocess.CompletedProcess([], 1, "", f"device {st.stdout}"),
                            ["get-state"])
        self._adb("shell", f"mkdir -p {shlex.quote(self.remote_dir)}")
        self.has_time = self._adb("shell", "time -v true", check=False).returncode == 0
        return self.serial

    def remote_sha256(self, remote: str) -> str | None:
        r = self._adb("shell", f"sha256sum {shlex.quote(remote)} 2>/dev/null", check=False)
        word = r.stdout.split()[:1]
        return word[0] if r.returncode == 0 and word and len(word[0]) == 64 else None

    # -- Runner interface
    def prepare(self, tools: list[str]) -> None:
        super().prepare(tools)
        self.check_device()
        for t in tools:
            self.push(self.bin_dir / t, t, executable=True)

    def path(self, name: str) -> str:
        return f"{self.remote_dir}/{name}"

    def push(self, local: Path, name: str | None = None, executable: bool = False) -> str:
        local = Path(local)
        remote = self.path(name or local.name)
        digest = sha256_file(local)
        skipped = self.remote_sha256(remote) == digest
        if not skipped:
            self._adb("push", str(local), remote, timeout=3600)
            if self.remote_sha256(remote) != digest:
                raise GgufToolError(f"{remote} on the device does not match {local} after adb push",
                                    "on Windows Git Bash, is MSYS_NO_PATHCONV=1 honoured? retry the push")
        if executable:
            self._adb("shell", f"chmod 755 {shlex.quote(remote)}")
        self.pushed.append({"name": local.name, "remote": remote, "bytes": local.stat().st_size, "skipped": skipped})
        return remote

    def stop_tools(self) -> None:
        """Kill what runs from the work folder on the device. A killed `adb shell` leaves its command running
        there (adbd only hangs up a pty), so an interrupted or timed-out run would keep the phone busy and hot.
        Best effort: the device may be gone, which is why the run was cut short."""
        pattern = "[" + self.remote_dir[0] + "]" + re.escape(self.remote_dir[1:] + "/")   # [/]data: not pkill's own shell
        try:
            self._adb("shell", f"pkill -9 -f {shlex.quote(pattern)}", timeout=15, check=False)
        except (GgufToolError, OSError):
            pass

    def pull(self, target_path: str, local: Path) -> Path:
        self._adb("pull", target_path, str(local))
        return Path(local)

    def run(self, tool: str, args: list[str], env: dict | None = None, tag: str | None = None,
            timeout: float | None = None) -> RunResult:
        tag = self._tag(tool, tag)
        envs = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (env or {}).items())
        timed = "time -v " if self.has_time else ""
        argv = [f"{self.remote_dir}/{tool}", *[str(a) for a in args]]   # by its full path: stop_tools finds it
        line = (f"cd {shlex.quote(self.remote_dir)} && {envs + ' ' if envs else ''}{timed}"
                f"{' '.join(shlex.quote(a) for a in argv)} > {tag}.out 2> {tag}.err; echo $? > {tag}.rc")
        t0 = time.monotonic()
        try:
            self._adb("shell", line, timeout=timeout)
        except BaseException:
            self.stop_tools()
            raise
        seconds = time.monotonic() - t0
        got = {}
        for ext in ("out", "err", "rc"):
            p = self.pull(self.path(f"{tag}.{ext}"), self.workdir / f"{tag}.{ext}")
            if not p.is_file():
                raise GgufToolError(f"adb pull of {self.path(f'{tag}.{ext}')} did not bring back a file",
                                    "is the device's storage full or the work folder gone? (`adb shell ls "
                                    f"{self.remote_dir}`)")
            got[ext] = read_log_tail(p) if ext != "rc" else read_log_tail(p, 64)
        status = got["rc"].strip()
        if not re.fullmatch(r"\d{1,3}", status):   # `echo $?` writes 0..255
            raise GgufToolError(f"{tool} on the device: its exit status file {tag}.rc holds no exit status "
                                f"{status[:40]!r}", "the device's shell did not run the command line; check "
                                f"`adb shell 'cd {self.remote_dir} && ls'`")
        rc = int(status)
        err = got["err"]
        rss = metrics.parse_peak_rss_kib(err) if self.has_time else None
        if self.has_time:
            err = metrics.strip_time_v(err)
        return RunResult(argv, rc, got["out"], err, seconds, rss, dict(env or {}))


def make_runner(target: str, workdir: Path, threads: int = 2, bin_dir: Path | None = None) -> Runner:
    """--target local | qemu-arm64 | adb[:SERIAL] -> a runner with the right binaries."""
    if target == "local":
        if bin_dir is None:
            from ..native import tools
            bin_dir = tools.find_build().bin_dir
        return LocalRunner(bin_dir, workdir, threads)
    if target in ("qemu-arm64", "adb") or target.startswith("adb:"):
        if bin_dir is None:
            from . import cross
            bin_dir = cross.find_cross_build().bin_dir
        if target == "qemu-arm64":
            return QemuRunner(bin_dir, workdir, threads)
        return AdbRunner(bin_dir, workdir, threads, serial=target.partition(":")[2] or None)
    raise GgufToolError(f"unknown target {target!r}" + did_you_mean(target, ["local", "qemu-arm64", "adb"]),
                        "use local, qemu-arm64, adb or adb:SERIAL")
