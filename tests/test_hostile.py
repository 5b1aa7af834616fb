"""Hostile and unlucky inputs (issue #14): each test feeds a case a user or a shared file can produce
and asserts the outcome: a clean error (exit 1 or 2, one message, no traceback) and nothing lost.

Classes: output safety (non-files as outputs, convert's checkpoint files as outputs, signals, long
names, closed pipes), CLI habits (did you mean, no abbreviations, type hints, directories as models),
values (recipe value types, values beyond the fp16 range with and without the native build, CLI numbers
and sizes), no traceback (GGUF metadata of the wrong type, depth or range; config.json, tokenizer.json,
tokenizer_config.json, modules.json values; checkpoint tensors no GGUF holds; adb output), bounded work
and memory (catastrophic patterns, a stalled hub, counts and sizes a header or config claims, under
RLIMIT_AS). The hub's answers and attempt limit are in test_hub.py, random values in test_fuzz_reader.py."""
from __future__ import annotations

import argparse
import hashlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gguftool.cli import build_parser, main
from gguftool.errors import GgufToolError
from gguftool.io.reader import GGUFFile
from gguftool.io.writer import StreamingWriter, check_output_path, check_replaceable, temporary_path
from gguftool.types import tensor_type

from .conftest import tiny_llama
from .test_convert import tiny_checkpoint

TYPE = "Q4_HQQ"   # a gguftool type: quantize plans it itself (no native llama-quantize involved)


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _temporaries(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith(".") and ".tmp" in p.name)


# ============================================================================ output safety

def _fifo(p: Path) -> int:
    os.mkfifo(p)
    return stat.S_IFIFO


def _dev_null_link(p: Path) -> int:
    p.symlink_to("/dev/null")   # as root a replaced /dev/null would break the machine; a link is safe to test
    return stat.S_IFCHR


def _char_device(p: Path) -> int:
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))   # a second /dev/null
    return stat.S_IFCHR


def _directory(p: Path) -> int:
    p.mkdir()
    return stat.S_IFDIR


def _socket(p: Path) -> int:
    if len(os.fsencode(p)) > 100:
        pytest.skip("path too long for a unix socket")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()
    return stat.S_IFSOCK


NODES = {"fifo": _fifo, "dev-null-symlink": _dev_null_link, "char-device": _char_device,
         "directory": _directory, "socket": _socket}


@pytest.mark.parametrize("kind", NODES)
def test_quantize_refuses_an_output_that_is_not_a_regular_file(tmp_path, rng, capsys, kind):
    src = tiny_llama(tmp_path / "m.gguf", rng)
    out = tmp_path / "out.gguf"
    fmt = NODES[kind](out)
    assert main(["quantize", str(src), str(out), TYPE]) == 1
    err = capsys.readouterr().err
    assert f"error: {out}: " in err and ("will not replace it" in err or "is a directory" in err)
    assert stat.S_IFMT(os.stat(out).st_mode) == fmt   # still there, still what it was
    assert _temporaries(tmp_path) == []


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "huge"])
def test_a_tensor_type_file_that_is_no_rule_list_is_refused(tmp_path, rng, capsys, kind):
    """--tensor-type-file is read whole: a FIFO or /dev/zero would never end (or fill memory), so only a
    regular file of bounded size is read, and nothing is written."""
    src = tiny_llama(tmp_path / "m.gguf", rng)
    rules = tmp_path / "rules.txt"
    if kind == "fifo":
        os.mkfifo(rules)
    elif kind == "dev-zero":
        rules.symlink_to("/dev/zero")
    elif kind == "directory":
        rules.mkdir()
    else:
        with open(rules, "wb") as f:
            f.truncate(17 * 2**20)
    out = tmp_path / "out.gguf"
    assert main(["quantize", str(src), str(out), TYPE, "--tensor-type-file", str(rules)]) == 1
    err = capsys.readouterr().err
    assert f"error: {rules}: the tensor type file is " in err and "unexpected" not in err, err
    assert not out.exists() and _temporaries(tmp_path) == []


@pytest.mark.parametrize("kind", ["fifo", "dev-null-symlink", "directory"])
def test_convert_refuses_an_output_that_is_not_a_regular_file(tmp_path, rng, capsys, kind):
    ck = tiny_checkpoint(tmp_path / "ck", rng)
    out = tmp_path / "out.gguf"
    fmt = NODES[kind](out)
    assert main(["convert", str(ck), str(out)]) == 1
    assert f"error: {out}: " in capsys.readouterr().err
    assert stat.S_IFMT(os.stat(out).st_mode) == fmt


@pytest.mark.parametrize("kind", ["fifo", "dev-null-symlink", "directory"])
def test_imatrix_refuses_a_bad_output_before_it_runs(tmp_path, rng, capsys, kind):
    src = tiny_llama(tmp_path / "m.gguf", rng)
    out = tmp_path / "m.imatrix.gguf"
    fmt = NODES[kind](out)
    assert main(["imatrix", str(src), "-o", str(out)]) == 1
    assert f"error: {out}: " in capsys.readouterr().err
    assert stat.S_IFMT(os.stat(out).st_mode) == fmt
    assert main(["imatrix", str(src), "-o", str(src)]) == 1   # nor its own model
    assert "output path is the input file" in capsys.readouterr().err


def test_writer_refuses_a_fifo_at_begin_and_at_commit(tmp_path):
    """Writers that do not call check_output_path (kv-calibrate's) are covered, and a FIFO made while
    the file is written is refused at the rename, the temporary removed."""
    out = tmp_path / "o.gguf"
    os.mkfifo(out)
    w = StreamingWriter(out, "llama")
    w.add_tensor_info("a", (4, 32), tensor_type(0))
    with pytest.raises(GgufToolError, match="is a FIFO"), w.session():
        w.begin()
    assert stat.S_ISFIFO(os.stat(out).st_mode) and _temporaries(tmp_path) == []
    out.unlink()
    w = StreamingWriter(out, "llama")
    w.add_tensor_info("a", (4, 32), tensor_type(0))
    with pytest.raises(GgufToolError, match="is a FIFO"), w.session():
        w.begin()
        w.write(np.zeros((4, 32), np.float32))
        os.mkfifo(out)
        w.commit()
    assert stat.S_ISFIFO(os.stat(out).st_mode) and _temporaries(tmp_path) == []


def test_report_files_that_are_not_regular_files_are_refused(tmp_path):
    from gguftool.validate import report
    out = tmp_path / "rep"
    out.mkdir()
    report.check_out(out)   # an empty folder is fine
    os.mkfifo(out / "report.json")
    with pytest.raises(GgufToolError, match="report.json: exists and is a FIFO"):
        report.check_out(out)
    with pytest.raises(GgufToolError, match="is a FIFO"):
        report._atomic_write(out / "report.json", b"{}")
    (tmp_path / "file").write_text("x")
    with pytest.raises(GgufToolError, match="not a directory"):
        report.check_out(tmp_path / "file")
    assert stat.S_ISFIFO(os.stat(out / "report.json").st_mode)


def _checkpoint_outputs(ck: Path, tmp: Path) -> dict[str, Path]:
    """Output paths that are a file convert reads, each spelt another way."""
    (tmp / "hard.json").hardlink_to(ck / "config.json")
    (tmp / "sym.json").symlink_to(ck / "tokenizer.json")
    (ck / "pool").mkdir()
    (ck / "pool" / "config.json").write_text("{}")   # a sub-folder (sentence-transformers pooling)
    (tmp / "linked").symlink_to(ck, target_is_directory=True)
    return {"same path": ck / "model.safetensors", "dot-dot": ck / ".." / ck.name / "config.json",
            "hard link": tmp / "hard.json", "symlink": tmp / "sym.json", "sub-folder": ck / "pool" / "config.json",
            "via a linked folder": tmp / "linked" / "tokenizer_config.json"}


def test_convert_output_is_never_a_file_of_its_checkpoint(tmp_path, rng, capsys):
    ck = tiny_checkpoint(tmp_path / "ck", rng)
    cases = _checkpoint_outputs(ck, tmp_path)
    before = {p.name: _digest(p) for p in ck.rglob("*") if p.is_file()}
    for how, out in cases.items():
        assert main(["convert", str(ck), str(out)]) == 1, how
        assert "output path is a file of the input checkpoint" in capsys.readouterr().err, how
    assert {p.name: _digest(p) for p in ck.rglob("*") if p.is_file()} == before
    # a GGUF in the folder is not a checkpoint file: a second run rewrites the first one's output
    out = ck / "model-f16.gguf"
    assert main(["convert", str(ck), str(out)]) == 0
    assert main(["convert", str(ck), str(out)]) == 0
    assert len(GGUFFile(out).tensors) > 0
    # and the checkpoint given through a symlink is the same checkpoint
    assert main(["convert", str(tmp_path / "linked"), str(ck / "model.safetensors")]) == 1


def _start(src: Path, out: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gguftool", "quantize", str(src), str(out), "Q5_1", "-t", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)


def _wait_for_temporary(p: subprocess.Popen, out: Path, limit: float = 60.0) -> None:
    t0 = time.monotonic()
    while not list(out.parent.glob(f".{out.name}.*.tmp")):
        assert p.poll() is None, "quantize ended before it began writing"
        assert time.monotonic() - t0 < limit, "quantize never started writing"
        time.sleep(0.005)


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory) -> Path:
    """Big enough that quantizing it to Q5_1 on one thread takes a good fraction of a second."""
    d = tmp_path_factory.mktemp("slow")
    return tiny_llama(d / "in.gguf", np.random.default_rng(3), n_embd=512, n_ff=1536, n_vocab=256, n_layer=4)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_signals_remove_the_temporary_file(tmp_path, slow_model, sig):
    digest = _digest(slow_model)
    out = tmp_path / "out.gguf"
    p = _start(slow_model, out)
    _wait_for_temporary(p, out)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, err
    assert "no output file was left behind" in err and "Traceback" not in err
    assert not out.exists() and _temporaries(tmp_path) == []
    assert _digest(slow_model) == digest


def test_an_ignored_sighup_stays_ignored(tmp_path, slow_model):
    """nohup: a SIGHUP the caller chose to ignore must not stop the run."""
    out = tmp_path / "out.gguf"
    p = _start(slow_model, out, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    _wait_for_temporary(p, out)
    p.send_signal(signal.SIGHUP)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert len(GGUFFile(out).tensors) == len(GGUFFile(slow_model).tensors)


def test_main_restores_the_signal_handlers(tmp_path, rng):
    src = tiny_llama(tmp_path / "m.gguf", rng)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    assert main(["inspect", str(src)]) == 0
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before


def _name(n_bytes: int, char: str = "a") -> str:
    """A file name of exactly n_bytes bytes in UTF-8, ending in .gguf."""
    body = n_bytes - len(".gguf")
    w = len(char.encode())
    return char * (body // w) + "b" * (body % w) + ".gguf"


@pytest.mark.parametrize("char", ["a", "é", "語"])
def test_a_255_byte_output_name_works(tmp_path, rng, char):
    src = tiny_llama(tmp_path / "m.gguf", rng)
    out = tmp_path / _name(255, char)
    assert len(os.fsencode(out.name)) == 255
    assert main(["quantize", str(src), str(out), TYPE]) == 0
    assert len(GGUFFile(out).tensors) == len(GGUFFile(src).tensors)
    assert _temporaries(tmp_path) == []


def test_temporary_names_fit_name_max(tmp_path):
    for n in (10, 200, 230, 231, 240, 254, 255):
        for char in ("a", "é", "語"):
            out = tmp_path / _name(n, char)
            for tag in (f"{4194304}.tmp", "kv-calibrate"):
                t = temporary_path(out, tag)
                assert len(os.fsencode(t.name)) <= 255 and t.parent == out.parent and t.name.startswith(".")
                t.write_bytes(b"")   # the file system takes it
                t.unlink()
            # the same output always gets the same temporary stem, whatever the pid
            assert temporary_path(out, "1.tmp").name[:-5] == temporary_path(out, "4194304.tmp").name[:-11]


def test_a_name_beyond_name_max_is_a_clean_error(tmp_path, rng, capsys):
    src = tiny_llama(tmp_path / "m.gguf", rng)
    out = tmp_path / _name(256)
    assert main(["quantize", str(src), str(out), TYPE]) == 1
    assert "File name too long" in capsys.readouterr().err


def test_stale_temporary_of_a_long_name_is_cleaned_up(tmp_path, rng):
    src = tiny_llama(tmp_path / "m.gguf", rng)
    out = tmp_path / _name(255)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = temporary_path(out, f"{dead.pid}.tmp")
    stale.write_bytes(b"left by a killed run")
    assert main(["quantize", str(src), str(out), TYPE]) == 0
    assert not stale.exists() and out.exists()


def _closed_pipe_run(args: list[str]) -> subprocess.CompletedProcess:
    r, w = os.pipe()
    os.close(r)   # the reader is gone before the first write, as `| head -1` is after its line
    try:
        return subprocess.run([sys.executable, "-m", "gguftool", *args], stdout=w, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(w)


@pytest.mark.parametrize("extra", [[], ["--format", "json"]], ids=["text", "json"])
def test_a_closed_stdout_pipe_ends_quietly(tmp_path, rng, extra):
    src = tiny_llama(tmp_path / "m.gguf", rng)
    r = _closed_pipe_run(["inspect", str(src), *extra])
    assert r.returncode == 128 + signal.SIGPIPE and r.stderr == ""


def test_head_after_the_first_line_ends_quietly(tmp_path, rng):
    src = tiny_llama(tmp_path / "m.gguf", rng, n_layer=40)   # a plan longer than a pipe buffer
    r = subprocess.run(f"{sys.executable} -m gguftool quantize {src} {tmp_path / 'o.gguf'} {TYPE} --dry-run | head -1",
                       shell=True, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.count("\n") == 1
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr


def test_check_replaceable_accepts_files_and_links_to_files(tmp_path):
    f = tmp_path / "f.gguf"
    f.write_bytes(b"x")
    (tmp_path / "l.gguf").symlink_to(f)
    (tmp_path / "dangling.gguf").symlink_to(tmp_path / "nowhere")
    for p in ("f.gguf", "l.gguf", "dangling.gguf", "absent.gguf"):
        check_replaceable(tmp_path / p)
    check_output_path(tmp_path / "f.gguf", [tmp_path / "other.gguf"])


# ============================================================================ CLI habits

def _parsers(p: argparse.ArgumentParser, path=("gguftool",)):
    """Every parser of the command tree with its command path."""
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _parsers(sp, (*path, name))


def test_every_parser_refuses_abbreviations():
    tree = list(_parsers(build_parser()))
    assert len(tree) > 10
    for path, p in tree:
        assert p.allow_abbrev is False, path


@pytest.mark.parametrize("argv, wanted", [
    (["quantize", "a.gguf", "b.gguf", "Q8_0", "--thread", "2"], "did you mean --threads?"),
    (["quantize", "a.gguf", "b.gguf", "Q8_0", "--thread=2"], "did you mean --threads?"),
    (["quantize", "a.gguf", "b.gguf", "Q8_0", "--thr", "2"], "unrecognized arguments: --thr 2"),   # no abbreviation
    (["quantize", "a.gguf", "b.gguf", "--recipes", "x"], "did you mean --recipe?"),
    (["convert", "d", "o.gguf", "--outype", "f16"], "did you mean --outtype?"),
    (["validate", "m.gguf", "--chunk", "4"], "did you mean --chunks?"),
    (["kv-plan", "m.gguf", "--memory", "1G", "--kv-head", "2"], "did you mean --kv-heads?"),
    (["quantise", "a.gguf"], "did you mean quantize?"),
    (["recipes", "lst"], "did you mean list?"),
    (["native", "biuld"], "did you mean build?"),
    (["quantize", "a.gguf", "b.gguf", "Q8_0", "--solver", "hqqq"], "did you mean hqq?"),
    (["--verison"], "unrecognized arguments: --verison (did you mean --version?)"),   # not "COMMAND is required"
    (["--verison", "inspect", "m.gguf"], "did you mean --version?"),
    (["quantize", "--thread", "2"], "unrecognized arguments: --thread (did you mean --threads?)"),   # no positionals yet
    (["inspct", "m.gguf"], "did you mean inspect?"),
    (["kv-plna", "m.gguf"], "did you mean kv-plan?"),
])
def test_misspelt_options_get_did_you_mean(capsys, argv, wanted):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert wanted in capsys.readouterr().err


def test_unknown_type_hint_lists_only_writable_types(monkeypatch):
    from gguftool import quant
    quant._load()
    fake = quant.Codec(tensor_type(0), None, None)   # a readable-only codec, under another name
    monkeypatch.setitem(quant._CODECS, "READ_ONLY_X", fake)
    with pytest.raises(GgufToolError) as e:
        quant.codec("Q4_HQX")
    listed = e.value.hint.split(": ", 1)[1].split(", ")
    assert "READ_ONLY_X" not in listed and "did you mean Q4_HQQ" in e.value.message
    assert set(listed) == {c.name for c in quant.all_codecs() if c.quantize is not None}


@pytest.mark.parametrize("argv, wanted, listed", [
    (["quantize", "{m}", "{o}", "Q4KM"], "unknown quantization type 'Q4KM' (did you mean Q4_K_M?)", "Q4_K_M"),
    (["quantize", "{m}", "{o}", "q5km"], "(did you mean Q5_K_M?)", "Q4_HQQ"),
    (["convert", "{d}", "{o}", "--outtype", "Q4_HQX"], "(did you mean Q4_HQQ?)", "IQ3_M"),
    (["hub", "org/repo", "--type", "IQ3M", "-o", "{o}"], "(did you mean IQ3_M?)", "Q3_K_L"),
    (["validate", "{m}", "--target", "lcoal", "--out", "{o}"], "unknown target 'lcoal' (did you mean local?)", "adb:SERIAL"),
])
def test_misspelt_values_get_did_you_mean(tmp_path, rng, capsys, argv, wanted, listed):
    """A mistyped TYPE is matched against the types and llama-quantize's mixes, and the hint lists both."""
    m = tiny_llama(tmp_path / "m.gguf", rng)
    ck = tiny_checkpoint(tmp_path / "ck", rng)
    assert main([a.format(m=m, d=ck, o=tmp_path / "o.gguf") for a in argv]) == 1
    err = capsys.readouterr().err
    assert wanted in err and listed in err.split("hint:", 1)[1], err
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("cmd", [["inspect"], ["quantize", "{d}", "{o}", TYPE], ["kv-plan", "{d}", "--memory", "1G"],
                                 ["kv-calibrate", "{d}", "{o}"], ["validate", "{d}", "--out", "{o}"],
                                 ["imatrix", "{d}", "-o", "{o}"]], ids=lambda c: c[0])
def test_a_directory_given_as_a_model_says_so(tmp_path, rng, capsys, cmd):
    ck = tiny_checkpoint(tmp_path / "ck", rng)
    argv = [a.format(d=ck, o=tmp_path / "o.gguf") for a in cmd] + ([str(ck)] if cmd == ["inspect"] else [])
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"{ck}: is a directory, not a GGUF file" in err and "gguftool convert" in err
    plain = tmp_path / "plain"
    plain.mkdir()
    assert main(["inspect", str(plain)]) == 1
    assert "is a directory, not a GGUF file" in capsys.readouterr().err


def test_a_file_given_as_a_checkpoint_says_so(tmp_path, rng, capsys):
    src = tiny_llama(tmp_path / "m.gguf", rng)
    assert main(["convert", str(src), str(tmp_path / "o.gguf")]) == 1
    err = capsys.readouterr().err
    assert "not a directory" in err and "gguftool quantize" in err
    assert main(["inspect", "/dev/null"]) == 1
    assert "not a regular file" in capsys.readouterr().err


# ============================================================================ values

RECIPE_VALUES = [   # (body after `type = "Q4_HQQ"`, the key named, the type asked for)
    ('pure = "false"', "`pure`", "true or false"),   # bool("false") is True: it turned pure mode on
    ("pure = 1", "`pure`", "true or false"),
    ('name = 3', "`name`", "a string"),
    ('description = ["a"]', "`description`", "a string"),
    ('allowed = "Q4_0"', "`allowed`", "an array"),     # iterated letter by letter before
    ("solver = 3", "`solver`", "a table"),
    ('rules = "x"', "`rules`", "an array"),
    ('[solver]\niter = 5', "unknown key(s) ['iter']", "known: "),   # a typo, ignored yet recorded as applied
    ('[solver]\niters = "5"', "`iters`", "an integer"),
    ("[solver]\niters = 5.5", "`iters`", "an integer"),
    ("[solver]\nrefit = true", "`refit`", "an integer"),
    ('[solver]\nbeta = "10"', "`beta`", "a number"),
    ("[solver]\nbeta = -1", "[solver]", "HQQ beta must be a positive number"),
    ("[solver]\nlp_norm = 2", "[solver]", "lp_norm must be in (0, 1]"),
    ('[solver]\nsolver = "fast"', "`solver`", "one of 'ref', 'hqq'"),
    ("[solver]\nsolver = true", "`solver`", "a string"),
    ('[[rules]]\npattern = 5\ntype = "Q8_0"', "rules[0]: `pattern`", "a string"),
    ('[[rules]]\npattern = "x"\ntype = "Q8_0"\nsolver = 1', "rules[0]: `solver`", "a table"),
    ('[[rules]]\npattern = "x"\ntype = "Q8_0"\nsolver = { iters = true }', "rules[0]: solver: `iters`", "an integer"),
    ('[[rules]]\npattern = "x"\ntype = "Q8_0"\nsolver = { kapa = 1.0 }', "rules[0]: solver: unknown key(s) ['kapa']", ""),
    ('[kv]\nk = 4', "[kv] k = 4", "KV cache type"),
]


@pytest.mark.parametrize("body, key, wanted", RECIPE_VALUES, ids=[b.split("\n")[-1] for b, _, _ in RECIPE_VALUES])
def test_a_recipe_value_of_the_wrong_type_names_file_key_and_type(tmp_path, body, key, wanted):
    from gguftool.pipeline import recipe
    p = tmp_path / "r.toml"
    p.write_text(f'type = "Q4_HQQ"\n{body}\n')
    with pytest.raises(GgufToolError) as e:
        recipe.load(str(p))
    assert str(p) in str(e.value) and key in str(e.value) and wanted in str(e.value)


def test_recipe_values_of_the_right_type_pass(tmp_path):
    from gguftool.pipeline import recipe
    p = tmp_path / "r.toml"
    p.write_text('type = "Q4_HQQ"\npure = true\nallowed = ["Q4_HQQ", "Q8_0"]\n'
                 '[solver]\nsolver = "hqq"\nkappa = 1\nbeta = 10\niters = 5\n'
                 '[[rules]]\npattern = "x"\ntype = "Q5_1"\nsolver = { solver = "hqq", refit = 0 }\n')
    r = recipe.load(str(p))
    assert r.pure is True and r.solver == {"solver": "hqq", "kappa": 1.0, "beta": 10.0, "iters": 5}
    assert isinstance(r.solver["kappa"], float) and r.rules[0].params == {"solver": "hqq", "refit": 0}


def test_quantize_with_a_mistyped_recipe_writes_nothing(tmp_path, rng, capsys):
    src = tiny_llama(tmp_path / "m.gguf", rng)
    p = tmp_path / "r.toml"
    p.write_text('type = "Q4_HQQ"\npure = "false"\n')
    out = tmp_path / "o.gguf"
    assert main(["quantize", str(src), str(out), "--recipe", str(p)]) == 1
    assert "`pure` must be true or false, not the string 'false'" in capsys.readouterr().err
    assert not out.exists()


def _codecs():
    """(type, quantize with the C kernels, the numpy twin) for every target whose block has an fp16 scale."""
    from gguftool.quant import hqq, tq3, tq3_1
    yield "TQ3_0", lambda x: tq3.quantize_tq3(x, threads=2), tq3.quantize_tq3_ref
    yield "TQ3_1", lambda x: tq3_1.quantize_tq3_1(x, threads=2), tq3_1.quantize_tq3_1_ref
    for t in ("Q4_HQQ", "Q4_HQQ_128", "Q4_1", "Q5_1"):   # Q4_1/Q5_1: `--solver hqq`
        yield t, (lambda x, t=t: hqq.quantize_hqq(x, t, threads=2)), (lambda x, t=t: hqq.quantize_hqq_ref(x, t))


CODECS = [c[0] for c in _codecs()]
# values each type cannot hold (its fp16 scale or Q4_1's offset overflows); and values it still holds
BEYOND = {"TQ3_0": 2e5, "TQ3_1": 1e7, "Q4_HQQ": 3e6, "Q4_HQQ_128": 3e6, "Q4_1": -8e4, "Q5_1": -8e4}
WITHIN = {"TQ3_0": 2e4, "TQ3_1": 1e6, "Q4_HQQ": 1e5, "Q4_HQQ_128": 1e5, "Q4_1": 2e4, "Q5_1": 2e4}


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("impl", ["c", "numpy"])
def test_values_beyond_fp16_are_refused_with_the_row_named(rng, name, impl):
    quantize = next(c for c in _codecs() if c[0] == name)[1 if impl == "c" else 2]
    x = (rng.standard_normal((9, 256)) * 0.02).astype(np.float32)
    x[6, 128:160] = BEYOND[name] * rng.standard_normal(32)   # row 6, columns 128..159 (and up to 255)
    x[8, :32] = BEYOND[name]                                   # a later one (constant): the first is named
    with pytest.raises(GgufToolError) as e:
        quantize(x)
    assert f"cannot quantize to {name}: row 6, columns 128.." in e.value.message
    assert "BF16" in e.value.hint


@pytest.mark.parametrize("name", CODECS)
def test_large_values_within_fp16_are_encoded(rng, name):
    from gguftool.quant import codec
    quantize, ref = next(c for c in _codecs() if c[0] == name)[1:]
    x = (rng.standard_normal((4, 256)) * WITHIN[name]).astype(np.float32)
    if name in ("Q4_1", "Q5_1"):
        x[1] = np.abs(x[1]) + 6e4   # offsets near fp16's limit: m = 6e4 still fits
    q = quantize(x)
    assert np.array_equal(q, ref(x))   # the twins agree on what is kept too
    y = codec(name).dequantize(q).reshape(x.shape)
    rel = np.sqrt(np.mean((y - x) ** 2, axis=1) / np.mean(x ** 2, axis=1))
    assert np.all(rel < 0.25), rel


def _wide_model(path: Path, rng, bad_row: int) -> Path:
    from .conftest import write_gguf
    w = (rng.standard_normal((64, 256)) * 0.02).astype(np.float32)
    w[bad_row, 32:64] = 3e5
    return write_gguf(path, {"blk.0.ffn_up.weight": (w, None), "blk.0.attn_norm.weight": (np.ones(256, np.float32), None)})


@pytest.mark.parametrize("target", [["TQ3_0"], ["Q4_HQQ"], ["Q4_1", "--solver", "hqq"], ["Q5_1", "--solver", "hqq"]],
                         ids=lambda t: "-".join(t))
def test_quantize_names_the_tensor_and_its_row(tmp_path, rng, capsys, monkeypatch, target):
    """Rows counted in the tensor, across the pipeline's chunks and threads."""
    from gguftool.pipeline import quantize as qpipe
    monkeypatch.setattr(qpipe, "CHUNK_VALUES", 8 * 256)   # 8 rows a chunk: row 45 is in the 6th, second thread
    src = _wide_model(tmp_path / "m.gguf", rng, bad_row=45)
    out = tmp_path / "o.gguf"
    assert main(["quantize", str(src), str(out), *target, "-t", "2"]) == 1
    err = capsys.readouterr().err
    assert f"tensor 'blk.0.ffn_up.weight': cannot quantize to {target[0]}: row 45, columns 32..63" in err
    assert not out.exists() and _temporaries(tmp_path) == []


def test_size_targeting_skips_a_type_that_cannot_hold_a_tensor(tmp_path, rng):
    from gguftool.pipeline import budget
    from gguftool.pipeline.plan import Options, make_plan
    src = GGUFFile(_wide_model(tmp_path / "m.gguf", rng, bad_row=3))
    plan = make_plan(src, Options(target="Q8_0"))
    step = next(s for s in plan.steps if s.tensor.name == "blk.0.ffn_up.weight")
    err = budget.measure(src, step, ["TQ3_0", "Q8_0"], {})
    assert set(err) == {"Q8_0"}


def _number_options():
    """(command path, option, its type's name) for every option of the tree that takes a number."""
    for path, p in _parsers(build_parser()):
        for a in p._actions:
            if a.option_strings and getattr(a.type, "__name__", None) in ("int", "float"):
                yield path[1:], max(a.option_strings, key=len), a.dest


NUMBER_OPTIONS = list(_number_options())
NEGATIVE_OK = {"seed"}   # llama.cpp reads a negative seed as "random"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "-1"])
def test_cli_numbers_are_checked(capsys, value):
    assert len(NUMBER_OPTIONS) >= 25
    tried = 0
    for path, opt, dest in NUMBER_OPTIONS:
        if value == "-1" and dest in NEGATIVE_OK:
            continue
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args([*path, f"{opt}={value}"])   # `=`: argparse reads "-inf" as an option
        err = capsys.readouterr().err
        assert e.value.code == 2 and opt in err, (opt, err)
        assert any(w in err for w in ("not a finite number", "must be at least", "must be above", "not an integer")), \
            (path, opt, value, err)
        tried += 1
    assert tried >= 25


def test_cli_numbers_in_range_pass():
    args = build_parser().parse_args(["validate", "m.gguf", "--threads", "3", "--timeout", "2.5", "--seed", "-1",
                                      "--sustained", "0"])
    assert (args.threads, args.timeout, args.seed, args.sustained) == (3, 2.5, -1, 0.0)
    for bad in (["--threads", "0"], ["--ctx", "0"], ["--timeout", "0"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["validate", "m.gguf", *bad])


def test_an_unexpected_error_is_one_line_and_a_hint_not_a_traceback(tmp_path, monkeypatch, capsys):
    """The last-resort handler: a bug of ours ends in one error line naming where, and how to report it."""
    from gguftool.cli import inspect as inspect_cli
    from gguftool.cli import main

    def boom(args):
        raise ZeroDivisionError("division by zero")
    monkeypatch.setattr(inspect_cli, "run", boom)
    real = tmp_path / "m.gguf"
    real.write_bytes(b"")
    monkeypatch.delenv("GGUFTOOL_DEBUG", raising=False)
    assert main(["inspect", str(real)]) == 70
    err = capsys.readouterr().err
    assert err.startswith("error: unexpected ZeroDivisionError in gguftool (test_hostile.py:")
    assert "GGUFTOOL_DEBUG=1" in err and "Traceback" not in err
    monkeypatch.setenv("GGUFTOOL_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(["inspect", str(real)])


@pytest.mark.parametrize("content", [b"", b"GGUF", b"GGUF\x03\x00\x00\x00" + b"\xff" * 24, b"\x00" * 64])
def test_known_bad_inputs_never_reach_the_last_resort(tmp_path, capsys, content):
    from gguftool.cli import main
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    assert main(["inspect", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.gguf" in err and "unexpected" not in err


# -- readable outputs --------------------------------------------------------------------------------
def _aligned_model(path, alignment: int):
    import numpy as np
    from gguf import GGUFWriter
    w = GGUFWriter(path, "llama")
    w.add_custom_alignment(alignment)
    rng = np.random.default_rng(0)
    for name in ("a.weight", "b.weight", "c_norm.weight"):
        w.add_tensor(name, rng.standard_normal((8, 64) if "norm" not in name else (64,)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [64, 256])
def test_a_non_default_alignment_is_kept_and_the_output_reads_back(tmp_path, alignment):
    from gguftool.cli import main
    from gguftool.io.reader import GGUFFile
    src = _aligned_model(tmp_path / "m.gguf", alignment)
    assert main(["quantize", str(src), str(tmp_path / "o.gguf"), "Q8_0", "--pure"]) == 0
    out = GGUFFile(tmp_path / "o.gguf")   # the reader checks every offset against the declared alignment
    assert out.get("general.alignment") == alignment and out.alignment == alignment
    assert all(t.offset % alignment == 0 for t in out.tensors) and out.tensor("a.weight").type.name == "Q8_0"


@pytest.mark.native
@pytest.mark.slow
def test_llama_cpp_loads_outputs_of_a_non_default_alignment(smollm2, tmp_path):
    """A real model written with general.alignment 256, and requantized from that file: llama.cpp loads both
    and decodes what the default-aligned file decodes (the same tensor bytes at other offsets)."""
    from gguftool.native import tools
    try:
        build = tools.find_build()
    except GgufToolError as e:
        pytest.skip(e.message)
    plain, aligned, again = tmp_path / "plain.gguf", tmp_path / "aligned.gguf", tmp_path / "again.gguf"
    opts = ["--allow-requantize", "--pure"]
    assert main(["quantize", str(smollm2), str(plain), "Q8_0", *opts]) == 0
    assert main(["quantize", str(smollm2), str(aligned), "Q8_0", *opts, "--override-kv", "general.alignment=int:256"]) == 0
    assert main(["quantize", str(aligned), str(again), "Q4_0", "--allow-requantize", "--pure"]) == 0
    a, p, g = GGUFFile(aligned), GGUFFile(plain), GGUFFile(again)
    assert a.alignment == g.alignment == 256 and p.alignment == 32
    assert all(t.offset % 256 == 0 for t in [*a.tensors, *g.tensors])
    assert any(t.offset % 256 for t in p.tensors)   # the default layout differs, so the loader had work to do

    def complete(m: Path) -> str:
        r = subprocess.run([str(build.tool("llama-completion")), "-m", str(m), "-p", "The capital of France is",
                            "-n", "8", "-t", "2", "--temp", "0", "-no-cnv"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout
    text = complete(plain)
    assert len(text) > len("The capital of France is") and complete(aligned) == text
    assert complete(again).startswith("The capital of France is")


def test_more_than_four_dimensions_and_overlapping_data_are_refused(tmp_path):
    import struct

    import numpy as np
    from gguf import GGUFWriter

    from gguftool.io.reader import GGUFFile
    w = GGUFWriter(tmp_path / "5d.gguf", "llama")
    w.add_tensor("x.weight", np.zeros((1, 1, 1, 2, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GgufToolError, match="5 dimensions; GGUF tensors have at most 4"):
        GGUFFile(tmp_path / "5d.gguf")
    # two tensors, the second's offset rewritten to point inside the first's data
    p = _aligned_model(tmp_path / "ov.gguf", 32)
    raw = bytearray(p.read_bytes())
    name = b"b.weight"
    i = raw.index(name) + len(name)
    n_dims = struct.unpack_from("<I", raw, i)[0]
    off_at = i + 4 + 8 * n_dims + 4
    struct.pack_into("<Q", raw, off_at, 32)
    p.write_bytes(bytes(raw))
    with pytest.raises(GgufToolError, match="'b.weight': its data overlaps tensor 'a.weight'"):
        GGUFFile(p)


# -- confinement: paths named by files and servers stay inside their folder ---------------------------
@pytest.mark.parametrize("shard, why", [("../outside.safetensors", "points outside"),
                                        ("/etc/hostname", "not a relative path"),
                                        ("sub/../../outside.safetensors", "points outside"),
                                        (7, "not a relative path")])
def test_checkpoint_index_shards_stay_inside(tmp_path, shard, why):
    import json

    import numpy as np

    from gguftool.io.safetensors import Checkpoint

    from .hf_export import save_file
    ck = tmp_path / "ck"
    ck.mkdir()
    save_file(tmp_path / "outside.safetensors", {"w": np.zeros((2, 2), np.float32)})
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(GgufToolError, match=f"model.safetensors.index.json: shard: .*{why}"):
        Checkpoint(ck)


def test_pooling_path_stays_inside(tmp_path):
    import json

    from gguftool.convert.archs import pooling_type
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Pooling", "path": "../evil"}]))
    with pytest.raises(GgufToolError, match="modules.json: pooling module: '../evil' points outside"):
        pooling_type(ck)


@pytest.mark.parametrize("rev", ["../../../tmp/evil", "/abs", "a/../b", "a\\b", "x\0y", ""])
def test_hub_revisions_that_are_paths_are_refused_before_any_request(tmp_path, monkeypatch, rev):
    from gguftool.io import hub
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")   # nothing listens: a request would fail differently
    with pytest.raises(GgufToolError, match="is not a branch, tag or commit name"):
        hub.fetch("org/model", rev or "", offline=False) if rev else hub.confine.revision(rev)


@pytest.mark.parametrize("sha", ["../../x", "ABCDEF" * 7, "0" * 39, None, 12])
def test_commit_ids_from_a_server_or_the_cache_must_be_hex(tmp_path, sha):
    from gguftool.io import confine, hub
    with pytest.raises(GgufToolError, match="is not a commit id"):
        confine.commit(sha, "server")
    if isinstance(sha, str):   # a poisoned refs/ file in the cache is refused too
        root = tmp_path / "models--org--m"
        (root / "refs").mkdir(parents=True)
        (root / "refs" / "main").write_text(sha)
        with pytest.raises(GgufToolError, match="is not a commit id"):
            hub.local_snapshot("org/m", "main", tmp_path)


# -- bounded work ------------------------------------------------------------------------------------
def test_a_catastrophic_pattern_is_an_error_not_a_hang(tmp_path, capsys):
    """(x|xx)+y against a name of 40 x's backtracks for ~fib(40) steps: the match times out and names the rule."""
    import numpy as np

    from gguftool.cli import main

    from .conftest import write_gguf
    name = "x" * 40 + ".weight"
    src = write_gguf(tmp_path / "m.gguf", {name: (np.ones((4, 32), np.float32), None)})
    assert main(["quantize", str(src), str(tmp_path / "o.gguf"), "Q8_0", "--tensor-type", "(x|xx)+y=Q4_0"]) == 1
    err = capsys.readouterr().err
    assert "--tensor-type (x|xx)+y=Q4_0: the pattern '(x|xx)+y' took over 1 s" in err and "backtracking" in err
    assert not (tmp_path / "o.gguf").exists()


def test_a_pattern_slow_on_every_name_is_stopped_by_its_total(tmp_path, capsys):
    """Each name alone takes well under the limit (26 x's: ~0.25 s here), but 60 of them would take
    minutes: the limit is on the pattern's time over the whole plan, so the run stops near 1 s."""
    import numpy as np

    from gguftool.cli import main

    from .conftest import write_gguf
    names = [f"{i:02d}" + "x" * 26 + ".weight" for i in range(60)]
    src = write_gguf(tmp_path / "m.gguf", {n: (np.ones((4, 32), np.float32), None) for n in names})
    assert main(["quantize", str(src), str(tmp_path / "o.gguf"), "Q8_0", "--tensor-type", "(x|xx)+y=Q4_0"]) == 1
    err = capsys.readouterr().err
    assert "took over 1 s on the tensor names" in err and not (tmp_path / "o.gguf").exists()
    stopped_at = int(err.split("(at '", 1)[1][:2])
    assert 0 < stopped_at < 59, err   # not on the first name (each is fast alone), and before the last


def test_a_stalled_hub_hits_the_deadline_with_a_clear_error(tmp_path, monkeypatch, capsys):
    """A server that accepts the connection and never answers: the run ends at --deadline, named."""
    import socket

    from gguftool.cli import main
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)   # connections are accepted by the kernel; nothing is ever sent back
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{srv.getsockname()[1]}")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        monkeypatch.chdir(tmp_path)
        assert main(["hub", "org/model", "--deadline", "1.5"]) == 1
        err = capsys.readouterr().err
        assert "org/model: the download did not finish within 1.5 s" in err and "finished are cached" in err
        assert not list(tmp_path.glob("*.gguf"))
    finally:
        srv.close()


# ============================================================================ metadata values (issue #14: no traceback)
# A GGUF value of the wrong type, depth or range is refused when the file is opened, naming the file, the key and
# what llama.cpp reads there: every command that reads the model (inspect too) says so with exit 1, none reaches the
# last-resort handler (exit 70).

def _meta_model(path: Path, kv: dict[str, tuple[object, object]], drop: tuple[str, ...] = ()) -> Path:
    """A tiny llama GGUF whose metadata holds `kv` (key -> (value, GGUFValueType)) besides the usual keys."""
    from gguf import GGUFValueType as T
    from gguf import GGUFWriter
    w = GGUFWriter(path, "llama")
    base = {"general.name": ("tiny", T.STRING), "llama.block_count": (1, T.UINT32),
            "llama.embedding_length": (64, T.UINT32), "llama.attention.head_count": (4, T.UINT32)}
    for k, (v, t) in {**base, **kv}.items():
        if k in drop:
            continue
        if t == T.ARRAY:
            w.add_key_value(k, v, T.ARRAY)
        else:
            w.add_key_value(k, v, t)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((32, 64)).astype(np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    w.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((64, 64)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _metadata_cases():
    from gguf import GGUFValueType as T
    A = T.ARRAY
    return {   # id: (key -> (value, type), what the error must say)
        "block_count-string": ({"llama.block_count": ("2", T.STRING)}, "'llama.block_count' is a string, not an integer"),
        "block_count-array": ({"llama.block_count": ([1, 1], A)}, "'llama.block_count' is an array of int32s, not an integer"),
        "block_count-float": ({"llama.block_count": (1.5, T.FLOAT32)}, "'llama.block_count' is a float32, not an integer"),
        "block_count-bool": ({"llama.block_count": (True, T.BOOL)}, "'llama.block_count' is a bool, not an integer"),
        "block_count-negative": ({"llama.block_count": (-1, T.INT32)}, "'llama.block_count' = -1: must be 1 to 512"),
        "block_count-huge": ({"llama.block_count": (2**32 - 1, T.UINT32)}, "must be 1 to 512"),
        "block_count-u64-huge": ({"llama.block_count": (2**63, T.UINT64)}, "must be 1 to 512"),
        "context_length-string": ({"llama.context_length": ("4096", T.STRING)}, "'llama.context_length' is a string"),
        "head_count-nested": ({"llama.attention.head_count": ([[4]], A)}, "'llama.attention.head_count' is an array of arrays"),
        "head_count-wrong-length": ({"llama.attention.head_count": ([4, 4, 4], A)},
                                    "'llama.attention.head_count' holds 3 values, one per block: llama.block_count is 1"),
        "head_count-strings": ({"llama.attention.head_count": (["4"], A)}, "'llama.attention.head_count' is an array of strings"),
        "head_count-not-dividing": ({"llama.attention.head_count": (65, T.UINT8)},   # found by the fuzz test
                                    "'llama.attention.head_count' = 65 does not divide llama.embedding_length = 64"),
        "ff-negative-in-array": ({"llama.feed_forward_length": ([-5], A)}, "'llama.feed_forward_length' holds -5"),
        "rope_base-string": ({"llama.rope.freq_base": ("10000", T.STRING)}, "'llama.rope.freq_base' is a string, not a number"),
        "rope_base-nan": ({"llama.rope.freq_base": (float("nan"), T.FLOAT32)}, "'llama.rope.freq_base' = nan"),
        "eps-array": ({"llama.attention.layer_norm_rms_epsilon": ([1e-5], A)}, "is an array of float32s, not a number"),
        "architecture-int": ({"general.architecture": (7, T.UINT32)}, "'general.architecture' is a uint32, not a string"),
        "architecture-array": ({"general.architecture": (["llama"], A)}, "'general.architecture' is an array"),
        "name-int": ({"general.name": (3, T.UINT32)}, "'general.name' is a uint32, not a string"),
        "tokens-ints": ({"tokenizer.ggml.tokens": ([1, 2, 3], A)}, "'tokenizer.ggml.tokens' is an array of int32s"),
        "tokens-string": ({"tokenizer.ggml.tokens": ("abc", T.STRING)}, "'tokenizer.ggml.tokens' is a string, not an array"),
        "scores-strings": ({"tokenizer.ggml.tokens": (["a", "b"], A), "tokenizer.ggml.scores": (["x", "y"], A)},
                           "'tokenizer.ggml.scores' is an array of strings, not an array of numbers"),
        "token_type-length": ({"tokenizer.ggml.tokens": (["a", "b"], A), "tokenizer.ggml.token_type": ([1], A)},
                              "'tokenizer.ggml.token_type' holds 1 values, but tokenizer.ggml.tokens holds 2"),
        "merges-ints": ({"tokenizer.ggml.merges": ([1], A)}, "'tokenizer.ggml.merges' is an array of int32s"),
        "bos-string": ({"tokenizer.ggml.bos_token_id": ("1", T.STRING)}, "'tokenizer.ggml.bos_token_id' is a string"),
        "add_bos-int": ({"tokenizer.ggml.add_bos_token": (1, T.UINT32)}, "'tokenizer.ggml.add_bos_token' is a uint32, "
                                                                         "not true or false"),
        "tokenizer_model-int": ({"tokenizer.ggml.model": (1, T.UINT32)}, "'tokenizer.ggml.model' is a uint32"),
        "swa-pattern-strings": ({"llama.attention.sliding_window_pattern": (["x"], A)}, "is an array of strings"),
        "split-count-string": ({"split.count": ("2", T.STRING)}, "'split.count' is a string, not an integer"),
        "type-record-string": ({"gguftool.type.Q4_HQQ.id": ("512", T.STRING)}, "'gguftool.type.Q4_HQQ.id' is a string"),
        "file_type-float": ({"general.file_type": (1.0, T.FLOAT32)}, "'general.file_type' is a float32, not an integer"),
    }


METADATA_CASES = _metadata_cases()


@pytest.mark.parametrize("case", METADATA_CASES)
def test_a_metadata_value_of_the_wrong_type_names_file_key_and_problem(tmp_path, capsys, case):
    kv, wanted = METADATA_CASES[case]
    src = _meta_model(tmp_path / "m.gguf", kv)
    for argv in (["inspect", str(src), "--metadata"], ["kv-plan", str(src), "--memory", "1G"],
                 ["quantize", str(src), str(tmp_path / "o.gguf"), TYPE]):
        assert main(argv) == 1, (case, argv)
        err = capsys.readouterr().err
        assert f"error: {src}: metadata " in err and wanted in err, (case, argv, err)
        assert "unexpected" not in err and "Traceback" not in err
    assert not (tmp_path / "o.gguf").exists()


def test_metadata_values_of_the_right_types_pass(tmp_path, capsys):
    from gguf import GGUFValueType as T
    A = T.ARRAY
    src = _meta_model(tmp_path / "m.gguf", {
        "llama.block_count": (2, T.UINT32), "llama.attention.head_count_kv": ([2, 4], A),   # per-layer, as OpenELM
        "llama.context_length": (2048, T.UINT64), "llama.rope.freq_base": (1e4, T.FLOAT64),
        "tokenizer.ggml.tokens": (["a", "b"], A), "tokenizer.ggml.scores": ([0.0, -1.0], A),
        "tokenizer.ggml.token_type": ([1, 1], A), "tokenizer.ggml.bos_token_id": (1, T.UINT32),
        "tokenizer.ggml.add_bos_token": (True, T.BOOL), "llama.attention.sliding_window_pattern": ([True, False], A),
        "some.other.key": ([[1, 2], ["x"]], A)})   # keys nobody reads may hold anything
    assert main(["inspect", str(src), "--metadata"]) == 0
    assert "llama.attention.head_count_kv" in capsys.readouterr().out


# ============================================================================ checkpoint values (config, tokenizer)
# config.json, tokenizer.json, tokenizer_config.json and modules.json are checked where they are read; a value of the
# wrong type or range is an error naming the file, the key and the problem (exit 1), never the last resort (exit 70).

class _Whole:
    """An edit's result that replaces the whole document (other edits change it in place)."""
    def __init__(self, value):
        self.value = value


def _edit_json(path: Path, edit) -> None:
    import json
    d = json.loads(path.read_text()) if path.exists() else None
    out = edit(d)
    path.write_text(json.dumps(out.value if isinstance(out, _Whole) else d))


def _set(**kv):
    return lambda d: d.update(kv)


def _tok_model(**kv):
    return lambda d: d["model"].update(kv)


def _vocab_id(token, value):
    return lambda d: d["model"]["vocab"].__setitem__(token, value)


CONFIG_CASES = {   # id: (file, edit, what the error must say)
    "heads-string": ("config.json", _set(num_attention_heads="4"),
                     "`num_attention_heads` must be an integer, not the string '4'"),
    "heads-float": ("config.json", _set(num_attention_heads=4.5), "`num_attention_heads` must be an integer, not 4.5"),
    "heads-negative": ("config.json", _set(num_attention_heads=-4), "`num_attention_heads` = -4: must be 1 to 65536"),
    "heads-zero": ("config.json", _set(num_attention_heads=0), "`num_attention_heads` = 0: must be 1 to"),
    "heads-huge": ("config.json", _set(num_attention_heads=10**12), "`num_attention_heads` = 1000000000000"),
    "heads-bool": ("config.json", _set(num_attention_heads=True), "`num_attention_heads` must be an integer, not True"),
    "heads-list": ("config.json", _set(num_attention_heads=[4]), "`num_attention_heads` must be an integer, not [4]"),
    "heads-not-dividing": ("config.json", _set(num_attention_heads=3),
                           "hidden_size 64 is not a multiple of num_attention_heads 3"),
    "kv-heads-not-dividing": ("config.json", _set(num_key_value_heads=3),
                              "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    "layers-string": ("config.json", _set(num_hidden_layers="2"), "`num_hidden_layers` must be an integer"),
    "hidden-zero": ("config.json", _set(hidden_size=0), "`hidden_size` = 0: must be 1 to"),
    "vocab-not-the-embedding": ("config.json", _set(vocab_size=100000),
                                "`vocab_size` is 100000, but the embedding model.embed_tokens.weight has 298 rows"),
    "hidden-not-the-embedding": ("config.json", _set(hidden_size=128),
                                 "`hidden_size` is 128, but the embedding model.embed_tokens.weight has 64 columns"),
    "kv-heads-not-the-weights": ("config.json", _set(num_key_value_heads=4),
                                 "model.layers.0.self_attn.k_proj.weight has 32 rows, but config.json's heads give 64"),
    "head-dim-not-the-weights": ("config.json", _set(head_dim=32), "self_attn.q_proj.weight has 64 rows, but"),
    "ctx-string": ("config.json", _set(max_position_embeddings="256"), "`max_position_embeddings` must be an integer"),
    "eps-string": ("config.json", _set(rms_norm_eps="1e-5"), "`rms_norm_eps` must be a number, not the string '1e-5'"),
    "eps-negative": ("config.json", _set(rms_norm_eps=-1.0), "`rms_norm_eps` = -1.0: must be above 0"),
    "theta-string": ("config.json", _set(rope_theta="1e4"), "`rope_theta` must be a number"),
    "head-dim-float": ("config.json", _set(head_dim=16.5), "`head_dim` must be an integer, not 16.5"),
    "rope-scaling-string": ("config.json", _set(rope_scaling="linear"), "`rope_scaling` must be an object"),
    "rope-factor-string": ("config.json", _set(rope_scaling={"rope_type": "linear", "factor": "2"}),
                           "`rope_scaling.factor` must be a number, not the string '2'"),
    "rope-yarn-no-ctx": ("config.json", _set(rope_scaling={"rope_type": "yarn", "factor": 2.0}),
                         "`rope_scaling.original_max_position_embeddings` is missing"),
    "architectures-string": ("config.json", _set(architectures="LlamaForCausalLM"),
                             "`architectures` must be a list of class names, not the string 'LlamaForCausalLM'"),
    "config-list": ("config.json", lambda d: _Whole([d]), "config.json: not a JSON object"),
    "tok-not-object": ("tokenizer.json", lambda d: _Whole([d]), "tokenizer.json: not a JSON object"),
    "tok-vocab-id-string": ("tokenizer.json", _vocab_id("e", "x"), "tokenizer.json: `model.vocab` id of 'e' must be an integer"),
    "tok-vocab-id-negative": ("tokenizer.json", _vocab_id("e", -1), "tokenizer.json: `model.vocab` id of 'e' = -1"),
    "tok-vocab-list": ("tokenizer.json", _tok_model(vocab=[["a", 0]]), "no token->id vocabulary"),
    "tok-model-string": ("tokenizer.json", lambda d: d.update(model="BPE"), "tokenizer.json: `model` must be an object"),
    "tok-added-not-list": ("tokenizer.json", _set(added_tokens={"id": 0}), "`added_tokens` must be a list"),
    "tok-added-no-id": ("tokenizer.json", lambda d: d["added_tokens"][0].__delitem__("id"), "`added_tokens[0]`"),
    "tok-added-id-string": ("tokenizer.json", lambda d: d["added_tokens"][0].update(id="0"),
                            "`added_tokens[0].id` must be an integer"),
    "tok-added-content-int": ("tokenizer.json", lambda d: d["added_tokens"][1].update(content=5),
                              "`added_tokens[1].content` must be a string"),
    "tok-merges-ints": ("tokenizer.json", _tok_model(merges=[1, 2]), "tokenizer.json: `model.merges[0]` must be a string"),
    "tok-merges-string": ("tokenizer.json", _tok_model(merges="e t"), "tokenizer.json: `model.merges` must be a list"),
    "tok-pre-string": ("tokenizer.json", _set(pre_tokenizer="ByteLevel"), "`pre_tokenizer` must be an object"),
    "tok-normalizer-list": ("tokenizer.json", _set(normalizer=["Lowercase"]), "`normalizer` must be an object"),
    "tokcfg-list": ("tokenizer_config.json", lambda d: _Whole([d]), "tokenizer_config.json: not a JSON object"),
    "tokcfg-prefix-string": ("tokenizer_config.json", _set(add_prefix_space="yes"),
                             "`add_prefix_space` must be true or false, not the string 'yes'"),
    "tokcfg-bos-int": ("tokenizer_config.json", _set(bos_token=7), "tokenizer_config.json: `bos_token`"),
    "tokcfg-add-bos-string": ("tokenizer_config.json", _set(add_bos_token="true"), "`add_bos_token` must be true or false"),
    "tokcfg-template-int": ("tokenizer_config.json", _set(chat_template=5), "`chat_template` must be a string"),
    "modules-strings": ("modules.json", lambda d: _Whole(["sentence_transformers.models.Pooling"]),
                        "modules.json: `[0]` must be an object"),
    "modules-dict": ("modules.json", lambda d: _Whole({"path": "1_Pooling"}), "modules.json: must be a list"),
    "modules-path-int": ("modules.json", lambda d: _Whole([{"type": "sentence_transformers.models.Pooling", "path": 1}]),
                         "not a relative path"),
    "pooling-config-list": ("1_Pooling/config.json", lambda d: _Whole([True]), "1_Pooling/config.json: not a JSON object"),
}


def _hostile_checkpoint(tmp_path: Path, case: str) -> Path:
    name, edit, _ = CONFIG_CASES[case]
    arch = "Qwen2ForCausalLM" if name.startswith(("modules", "1_Pooling")) else "LlamaForCausalLM"   # pooling: qwen/bert
    ck = tiny_checkpoint(tmp_path / "ck", np.random.default_rng(0), arch=arch)
    if name.startswith(("modules", "1_Pooling")):
        import json
        (ck / "1_Pooling").mkdir()
        (ck / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
        (ck / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}]))
    _edit_json(ck / name, edit)
    return ck


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_a_checkpoint_value_of_the_wrong_type_names_file_key_and_problem(tmp_path, capsys, case):
    ck = _hostile_checkpoint(tmp_path, case)
    out = tmp_path / "o.gguf"
    assert main(["convert", str(ck), str(out)]) == 1, case
    err = capsys.readouterr().err
    wanted = CONFIG_CASES[case][2]
    assert f"error: {ck}" in err and wanted in err, (case, err)
    assert "unexpected" not in err and "warning" not in err and not out.exists()   # one message, before planning


# ============================================================================ bounded memory
# Counts and sizes a header or config claims never drive an allocation: each case runs in a process limited to
# 2 GiB of address space (an allocation proportional to the claim dies there) and must still end in a clean error.
_LIMITED = """
import contextlib, io, json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))
from gguftool.cli import main
out = {}
for case, argv in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
        except BaseException as e:   # a MemoryError the handler did not see
            rc = repr(e)
    out[case] = [rc, err.getvalue()]
print(json.dumps(out))
"""


def _run_limited(cases: dict[str, list[str]]) -> dict[str, tuple[object, str]]:
    import json
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", _LIMITED, json.dumps(cases)], capture_output=True, text=True, timeout=600,
                       env=env, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.splitlines()[-1])


def _gguf_bytes(n_tensors: int, n_kv: int, body: bytes = b"") -> bytes:
    import struct
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body


def _claims_gguf() -> dict[str, tuple[bytes, str]]:
    import struct

    def s(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b
    arr = s(b"x.a") + struct.pack("<I", 9)
    return {   # id: (file bytes, what the error says)
        "n_tensors-2^63": (_gguf_bytes(2**63 - 1, 0), "run past the end of the file"),
        "n_kv-2^63": (_gguf_bytes(0, 2**63 - 1), "run past the end of the file"),
        "n_kv-10^7": (_gguf_bytes(0, 10**7, s(b"k") + struct.pack("<IB", 0, 1)), "run past the end of the file"),
        "u8-array-2^62": (_gguf_bytes(0, 1, arr + struct.pack("<IQ", 0, 2**62) + bytes(64)), "run past the end"),
        "string-array-2^62": (_gguf_bytes(0, 1, arr + struct.pack("<IQ", 8, 2**62) + bytes(8 * 1000)), "runs past the end"),
        "nested-array-2^62": (_gguf_bytes(0, 1, arr + struct.pack("<IQ", 9, 2**62) + struct.pack("<IQ", 0, 0) * 1000),
                              "run past the end"),
        "key-length-2^63": (_gguf_bytes(0, 1, struct.pack("<Q", 2**63) + b"abc"), "run past the end"),
        "string-length-2^62": (_gguf_bytes(0, 1, s(b"x.a") + struct.pack("<IQ", 8, 2**62) + b"abc"), "run past the end"),
        "n_dims-2^31": (_gguf_bytes(1, 0, s(b"t") + struct.pack("<I", 2**31) + bytes(64)), "run past the end"),
        "dims-2^62": (_gguf_bytes(1, 0, s(b"t") + struct.pack("<IQQIQ", 2, 2**62, 2**62, 0, 0) + bytes(64)),
                      "data runs past the end of the file"),
    }


def _safetensors_bytes(header: object, data: bytes = b"", raw: bytes | None = None) -> bytes:
    import json
    import struct
    h = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def _claims_safetensors() -> dict[str, tuple[bytes, str]]:
    import struct
    entry = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    return {
        "header-length-2^63": (struct.pack("<Q", 2**63) + b"{}", "header length 9223372036854775808 does not fit"),
        "shape-TBs": (_safetensors_bytes({"w": {**entry, "shape": [2**40, 2**40]}}, bytes(16)),
                      "holds 16 bytes, but F32[1099511627776, 1099511627776] needs"),
        "shape-wraps-int64": (_safetensors_bytes({"w": {**entry, "dtype": "I8", "shape": [2**61 + 1, 8],
                                                        "data_offsets": [0, 8]}}, bytes(8)), "holds 8 bytes"),
        "negative-dims": (_safetensors_bytes({"w": {**entry, "shape": [-2, -2]}}, bytes(16)), "malformed header entry"),
        "string-offsets": (_safetensors_bytes({"w": {**entry, "data_offsets": ["0", "16"]}}, bytes(16)),
                           "malformed header entry"),
        "offsets-past-end": (_safetensors_bytes({"w": {**entry, "data_offsets": [0, 2**62]}}, bytes(16)),
                             "lies outside the file"),
        "nested-200k-deep": (_safetensors_bytes(None, raw=b"[" * 200000 + b"]" * 200000), "corrupt safetensors header"),
        "metadata-list": (_safetensors_bytes({"__metadata__": [1], "w": entry}, bytes(16)), "__metadata__ is not an object"),
    }


def test_claimed_counts_and_sizes_fail_fast_with_bounded_memory(tmp_path, rng):
    cases, wanted = {}, {}
    (tmp_path / "out").mkdir()
    for case, (data, msg) in _claims_gguf().items():
        p = tmp_path / f"{case}.gguf"
        p.write_bytes(data)
        cases[case], wanted[case] = ["inspect", str(p), "--metadata"], (str(p), msg)
    for case, (data, msg) in _claims_safetensors().items():
        ck = tiny_checkpoint(tmp_path / case, rng)
        (ck / "model.safetensors").write_bytes(data)
        cases[case] = ["convert", str(ck), str(tmp_path / "out" / f"{case}.gguf")]
        wanted[case] = (str(ck / "model.safetensors"), msg)
    for case, edit, msg in [   # config.json and tokenizer.json claims: a vocabulary, layers
            ("vocab-10^12", _set(vocab_size=10**12), "`vocab_size` = 1000000000000: must be 1 to"),
            ("vocab-2^31-not-the-embedding", _set(vocab_size=2**31 - 1), "has 298 rows"),
            ("layers-10^9", _set(num_hidden_layers=10**9), "`num_hidden_layers` = 1000000000: must be 1 to 512"),
            ("token-id-10^12", None, "tokenizer.json: has token id 1000000000000, but the model's vocab_size is 298"),
            ("config-nested-200k-deep", "deep", "config.json: not valid JSON")]:
        ck = tiny_checkpoint(tmp_path / case, rng)
        if edit == "deep":
            (ck / "config.json").write_text("[" * 200000 + "]" * 200000)
        elif edit is None:
            _edit_json(ck / "config.json", lambda d: d.pop("vocab_size") and None)   # the embedding gives it
            _edit_json(ck / "tokenizer.json", _vocab_id("e", 10**12))
        else:
            _edit_json(ck / "config.json", edit)
        cases[case], wanted[case] = ["convert", str(ck), str(tmp_path / "out" / f"{case}.gguf")], (str(ck), msg)
    got = _run_limited(cases)
    assert len(got) == len(cases) >= 20
    for case, (rc, err) in got.items():
        where, msg = wanted[case]
        assert rc == 1 and f"error: {where}" in err and msg in err, (case, rc, err)
        assert "unexpected" not in err and "MemoryError" not in err, (case, err)
    assert list((tmp_path / "out").iterdir()) == []


# ============================================================================ adb output
# What adb prints is input too: garbage rows, bytes that are not UTF-8, endless output, an exit status file that
# holds no number, a pull that leaves nothing, an adb that cannot run. Each is a clean error (or ignored where it
# is noise) with bounded memory, never the last resort.

def _fake_adb(tmp_path: Path, body: str) -> Path:
    """An adb that runs `body` (bash; "$1" is the command: devices, shell, push, pull, get-state)."""
    p = tmp_path / "adb"
    p.write_text("#!/bin/bash\nif [ \"$1\" = -s ]; then shift 2; fi\n" + body + "\n")
    p.chmod(0o755)
    return p


_GOOD_DEVICE = 'case "$1" in devices) printf "List of devices attached\\nR58M\\tdevice\\n\\n";; *) exit 0;; esac'


def _adb_runner(tmp_path: Path, body: str, serial: str | None = None):
    from gguftool.validate.runners import AdbRunner
    (tmp_path / "bin").mkdir(exist_ok=True)
    return AdbRunner(tmp_path / "bin", tmp_path / "work", serial=serial, adb=str(_fake_adb(tmp_path, body)))


def test_adb_devices_garbage_rows_are_ignored(tmp_path):
    r = _adb_runner(tmp_path, 'case "$1" in devices) printf "List of devices attached\\ngarbage\\n\\xff\\xfe\\x00 \\x80\\n'
                              '* daemon started successfully\\nR58M\\tdevice\\tusb:1-1\\n\\n";; *) exit 0;; esac')
    assert r.check_device() == "R58M"


@pytest.mark.parametrize("devices", ["garbage only\\n", "\\xff\\xfe\\n\\x80\\x81 \\xc3\\n", ""])
def test_adb_devices_without_a_device_row_is_no_device(tmp_path, devices):
    r = _adb_runner(tmp_path, f'case "$1" in devices) printf "List of devices attached\\n{devices}";; *) exit 0;; esac')
    with pytest.raises(GgufToolError, match="no Android device found by adb"):
        r.check_device()


def test_adb_non_utf8_error_output_is_a_clean_error(tmp_path):
    r = _adb_runner(tmp_path, 'printf "adb: \\xff\\xfe failed \\x80\\n" >&2; exit 1')
    with pytest.raises(GgufToolError, match=r"adb shell mkdir -p /x failed \(exit 1\): adb: \ufffd\ufffd failed"):
        r._adb("shell", "mkdir -p /x")


def test_adb_endless_output_keeps_memory_bounded(tmp_path):
    """`adb devices` printing 1.5 GiB: read in a process limited to 1 GiB of address space beyond what it uses."""
    script = _fake_adb(tmp_path, 'case "$1" in devices) printf "List of devices attached\\nR58M\\tdevice\\n"; '
                                 'head -c 1610612736 /dev/zero | tr "\\0" "x";; *) exit 0;; esac')
    code = f"""
import resource
from pathlib import Path
from gguftool.validate.runners import AdbRunner
r = AdbRunner(Path({str(tmp_path)!r}), Path({str(tmp_path / 'w')!r}), adb={str(script)!r})
soft = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_AS, (min(soft + 2**30, hard) if hard > 0 else soft + 2**30, hard))
res = r._adb("devices")
print(len(res.stdout), res.stdout[:40].replace(chr(10), "|"))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[1], env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    n, head = p.stdout.split(" ", 1)
    assert int(n) <= 2**21 and head.startswith("List of devices attached|R58M")


def _adb_run_device(rc_text: str | None, out_bytes: int = 2) -> str:
    """A device whose run writes nothing itself: `pull` makes the .out/.err/.rc files (rc_text None: no .rc file)."""
    rc = "" if rc_text is None else f'*.rc) printf "{rc_text}" > "$3";; '
    return ('case "$1" in devices) printf "List of devices attached\\nR58M\\tdevice\\n";; '
            f'pull) case "$2" in {rc}*.out) head -c {out_bytes} /dev/zero | tr "\\0" "o" > "$3";; '
            '*.err) printf "err\\n" > "$3";; esac;; *) exit 0;; esac')


@pytest.mark.parametrize("rc_text, wanted", [("garbage\\xff", "exit status 'garbage\ufffd'"), ("", "exit status ''"),
                                             ("99999999999999999999", "exit status '99999999999999999999'"),
                                             (None, "did not bring back")])
def test_adb_run_with_a_bad_exit_status_file_is_a_clean_error(tmp_path, rc_text, wanted):
    r = _adb_runner(tmp_path, _adb_run_device(rc_text))
    r.check_device()
    with pytest.raises(GgufToolError, match=wanted):
        r.run("llama-bench", ["-m", "x.gguf"])


def test_adb_run_keeps_a_bounded_tail_of_a_huge_log(tmp_path):
    from gguftool.validate import runners
    r = _adb_runner(tmp_path, _adb_run_device("0", out_bytes=runners.LOG_LIMIT * 3))
    r.check_device()
    res = r.run("llama-bench", [])
    assert res.rc == 0 and len(res.stdout) <= runners.LOG_LIMIT + 200 and res.stdout.endswith("ooo")
    assert "bytes before this were left out" in res.stdout


@pytest.mark.parametrize("how", ["not-executable", "not-a-program"])
def test_an_adb_that_cannot_run_is_a_clean_error(tmp_path, how):
    from gguftool.validate.runners import AdbRunner
    adb = tmp_path / "adb"
    adb.write_bytes(b"\x7fELF\x02\x01\x01 not really" if how == "not-a-program" else b"#!/bin/sh\n")
    adb.chmod(0o644 if how == "not-executable" else 0o755)
    (tmp_path / "bin").mkdir()
    r = AdbRunner(tmp_path / "bin", tmp_path / "w", adb=str(adb))
    with pytest.raises(GgufToolError, match=f"cannot run {adb}"):
        r.check_device()


# ============================================================================ values beyond fp16: stock types without ggml
STOCK_BEYOND = {"Q4_0": 1e8, "Q4_1": -1e5, "Q5_0": 1e8, "Q5_1": -1e5, "Q8_0": 1e8, "F16": 1e5}


@pytest.mark.parametrize("name", STOCK_BEYOND)
def test_stock_types_without_the_native_build_refuse_rows_beyond_fp16(rng, monkeypatch, name):
    """gguf.quants' numpy path (no native build) refuses what the ggml path refuses (ggml_validate_row_data):
    the same error, naming the row and columns, instead of writing inf scales."""
    from gguftool.quant import codec, standard
    x = (rng.standard_normal((9, 256)) * 0.02).astype(np.float32)
    x[6, 128:160] = STOCK_BEYOND[name] * (1 + rng.random(32))
    x[8, :32] = STOCK_BEYOND[name]
    block = 1 if name == "F16" else 32
    errors, have_ggml = {}, standard._ggml_available()
    for ggml in (False, True):
        if ggml and not have_ggml:
            continue
        monkeypatch.setattr(standard, "_ggml_available", lambda g=ggml: g)
        with pytest.raises(GgufToolError) as e:
            codec(name).quantize(x)
        errors[ggml] = e.value.message
        assert f"cannot quantize to {name}: row 6, columns 128..{128 + block - 1} " in e.value.message, e.value.message
    if name != "F16" and len(errors) == 2:
        assert errors[False] == errors[True]


@pytest.mark.parametrize("name", STOCK_BEYOND)
def test_stock_types_without_the_native_build_keep_large_values_within_fp16(rng, monkeypatch, name):
    from gguftool.quant import codec, standard
    monkeypatch.setattr(standard, "_ggml_available", lambda: False)
    x = (rng.standard_normal((4, 256)) * (1e4 if name == "F16" else 1e3)).astype(np.float32)
    q = codec(name).quantize(x)
    y = codec(name).dequantize(q).reshape(x.shape)
    assert np.all(np.isfinite(y))
    assert np.sqrt(np.mean((y - x) ** 2) / np.mean(x ** 2)) < 0.25


def test_quantize_without_the_native_build_names_the_tensor_and_row(tmp_path, rng, capsys, monkeypatch):
    from gguftool.quant import standard
    monkeypatch.setattr(standard, "_ggml_available", lambda: False)
    src = _wide_model(tmp_path / "m.gguf", rng, bad_row=45)   # 3e5 at row 45: beyond Q4_0's d (max/-8 fits: 3.75e4)
    x = GGUFFile(src).tensor("blk.0.ffn_up.weight").data.copy()
    x[45, 32:64] = 1e8
    from .conftest import write_gguf
    write_gguf(src, {"blk.0.ffn_up.weight": (x, None), "blk.0.attn_norm.weight": (np.ones(256, np.float32), None)})
    out = tmp_path / "o.gguf"
    assert main(["quantize", str(src), str(out), "Q8_0", "--pure", "-t", "2"]) == 1
    err = capsys.readouterr().err
    assert "tensor 'blk.0.ffn_up.weight': cannot quantize to Q8_0: row 45, columns 32..63" in err, err
    assert not out.exists() and _temporaries(tmp_path) == []


# ============================================================================ other CLI inputs
@pytest.mark.parametrize("argv, wanted", [
    (["quantize", "{m}", "{o}", "Q8_0", "--split-max-size", "1e999G"], "cannot read size '1e999G'"),   # was exit 70
    (["quantize", "{m}", "{o}", "Q8_0", "--split-max-size", "nan"], "cannot read size 'nan'"),
    (["kv-plan", "{m}", "--memory", "infG"], "cannot read size 'infG'"),
    (["kv-plan", "{m}", "--memory", "1e400GiB"], "cannot read size '1e400GiB'"),
    (["kv-plan", "{m}", "--memory=-1G"], "cannot read size '-1G'"),
    (["quantize", "{m}", "{o}", "Q8_0", "--imatrix", "/dev/zero"], "/dev/zero: not a regular file"),   # was a MemoryError
    (["quantize", "{m}", "{o}", "--recipe", "{m}"], "{m}: not a recipe: not UTF-8 text"),   # was exit 70
    (["quantize", "{m}", "{o}", "Q8_0", "--override-kv", "llama.block_count=str:abc"],
     "--override-kv llama.block_count: is a string here, but gguftool and llama.cpp read an integer"),   # was written
    (["quantize", "{m}", "{o}", "Q8_0", "--override-kv", "llama.block_count=int:100000"],
     "--override-kv llama.block_count: = 100000: must be 1 to 512"),
    (["quantize", "{m}", "{o}", "Q8_0", "--override-kv", "tokenizer.ggml.add_bos_token=int:1"],
     "read true or false there"),
    (["quantize", "{m}", "{o}", "Q8_0", "--override-kv", "general.architecture=int:3"], "read a string there"),
])
def test_other_cli_inputs_are_clean_errors(tmp_path, capsys, argv, wanted):
    from gguf import GGUFValueType as T
    m = _meta_model(tmp_path / "m.gguf", {"llama.attention.head_count_kv": (4, T.UINT32)})
    o = tmp_path / "o.gguf"
    argv = [a.format(m=m, o=o) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert wanted.format(m=m) in err and "unexpected" not in err, err
    assert not o.exists()


def test_override_kv_of_keys_nobody_reads_or_of_the_right_type_pass(tmp_path):
    m = _meta_model(tmp_path / "m.gguf", {})
    o = tmp_path / "o.gguf"
    assert main(["quantize", str(m), str(o), "Q8_0", "--pure", "--override-kv", "llama.block_count=int:1",
                 "--override-kv", "my.own.key=str:x", "--override-kv", "general.name=str:renamed"]) == 0
    f = GGUFFile(o)
    assert (f.get("general.name"), f.get("my.own.key"), f.get("llama.block_count")) == ("renamed", "x", 1)


@pytest.mark.parametrize("shape", [(0, 64), (128, 0), (2, 3, 4, 5, 6)], ids=str)
def test_a_checkpoint_tensor_no_gguf_can_hold_is_refused(tmp_path, capsys, shape):
    """Zero-size dimensions (were exit 70) and more than 4 (was written, then refused by every reader)."""
    from gguftool.io.safetensors import SafetensorsFile

    from .hf_export import save_file
    ck = tiny_checkpoint(tmp_path / "ck", np.random.default_rng(0))
    f = SafetensorsFile(ck / "model.safetensors")
    w = {n: t.array().copy() for n, t in f.tensors.items()}
    f.close()
    w["model.layers.0.mlp.up_proj.weight"] = np.zeros(shape, np.float32)
    save_file(ck / "model.safetensors", w, {"format": "pt"})
    assert main(["convert", str(ck), str(tmp_path / "o.gguf")]) == 1
    err = capsys.readouterr().err
    assert f"tensor 'model.layers.0.mlp.up_proj.weight' has shape {list(shape)}; a GGUF tensor has 1 to 4" in err, err
    assert "unexpected" not in err and not (tmp_path / "o.gguf").exists()


def test_adb_devices_no_permissions_says_so(tmp_path):
    r = _adb_runner(tmp_path, 'case "$1" in devices) printf "List of devices attached\\nR58M\\tno permissions (user in '
                              'plugdev group; are your udev rules wrong?)\\n";; *) exit 0;; esac')
    with pytest.raises(GgufToolError, match=r"adb may not open the device \(no permissions\)"):
        r.check_device()



@pytest.mark.parametrize("card", [
    "---\nlicense: [1, {a: 2}]\ntags: 5\nbase_model: 7\n---\n",   # values of the wrong type (were exit 70)
    "---\n: : :\n  - [\n---\n",                                      # not YAML (was exit 70)
    b"\xff\xfe---\n\x00\x01",                                         # not UTF-8 (was exit 70)
], ids=["types", "not-yaml", "not-utf8"])
def test_a_model_card_gguf_cannot_read_is_one_clear_error(tmp_path, capsys, card):
    ck = tiny_checkpoint(tmp_path / "ck", np.random.default_rng(0))
    (ck / "README.md").write_bytes(card if isinstance(card, bytes) else card.encode())
    assert main(["convert", str(ck), str(tmp_path / "o.gguf")]) == 1
    err = capsys.readouterr().err
    assert f"error: {ck}: gguf cannot read the model card metadata" in err and "front matter" in err, err
    assert "unexpected" not in err and "warning" not in err and not (tmp_path / "o.gguf").exists()


def test_a_model_card_with_odd_but_readable_front_matter_converts(tmp_path):
    ck = tiny_checkpoint(tmp_path / "ck", np.random.default_rng(0))
    (ck / "README.md").write_text("---\n- 1\n- 2\n---\n# a list, not a mapping: gguf ignores it\n")
    assert main(["convert", str(ck), str(tmp_path / "o.gguf")]) == 0



@pytest.mark.parametrize("name, content, wanted", [
    ("chat_template.json", b"[1]", "chat_template.json: not a JSON object"),   # was a warning, then the error
    ("chat_template.json", b"{", "chat_template.json: not valid JSON"),
    ("chat_template.jinja", b"\xff\xfe", "chat_template.jinja: not a chat template: not UTF-8 text"),
    ("model.safetensors.index.json", b"\xff", "model.safetensors.index.json: not a safetensors index"),   # was exit 70
    ("generation_config.json", b"[1]", "gguf cannot read the model card metadata"),
], ids=["chat-json-list", "chat-json-bad", "chat-jinja-binary", "index-binary", "generation-config-list"])
def test_other_checkpoint_files_are_checked_before_planning(tmp_path, capsys, name, content, wanted):
    ck = tiny_checkpoint(tmp_path / "ck", np.random.default_rng(0))
    (ck / name).write_bytes(content)
    assert main(["convert", str(ck), str(tmp_path / "o.gguf")]) == 1
    err = capsys.readouterr().err
    assert f"error: {ck}" in err and wanted in err and "unexpected" not in err and "warning" not in err, err
