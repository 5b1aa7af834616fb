"""README's tour as a new user runs it: the wheel built from this checkout, installed (not editable) into a
fresh virtual environment with its dependencies from PyPI, every command of the tour on the real models,
run from a folder outside the checkout. Each step checks what the command wrote, not only its exit code."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest

from gguftool.io.reader import GGUFFile
from gguftool.pipeline.kvplan import Shape

from .hfserver import FakeHub
from .test_convert import tiny_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.native]
REPO_ROOT = Path(__file__).resolve().parents[1]


def _run(argv, cwd=None, env=None, timeout=1800) -> str:
    r = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, argv))}\n{r.stdout[-1500:]}\n{r.stderr[-2500:]}"
    return r.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """bin/ of a fresh venv holding the wheel of this checkout."""
    root = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", REPO_ROOT, "--no-deps", "--no-build-isolation", "-q",
          "-w", root / "dist"], timeout=1800)
    wheel = next((root / "dist").glob("gguftool-*.whl"))
    venv.create(root / "venv", with_pip=True)
    py = root / "venv" / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel], timeout=1800)
    # the wheel's own package, not this checkout
    where = _run([py, "-c", "import gguftool; print(gguftool.__file__)"], cwd=root)
    assert str(root / "venv") in where and str(REPO_ROOT) not in where
    return root / "venv" / "bin"


def test_readme_tour_after_a_plain_install(installed, smollm2, minilm_dir, tmp_path, rng):
    readme = (REPO_ROOT / "README.md").read_text()
    tour = readme[readme.index("## A tour"):]
    tour = tour[:tour.index("```", tour.index("```") + 3)]
    nouns = {m.group(1) for m in re.finditer(r"^gguftool (\S+)", tour.split("```sh", 1)[1], re.M)}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{installed}{os.pathsep}{env.get('PATH', '')}", GGUFTOOL_NO_PROGRESS="1")
    work = tmp_path / "work"
    work.mkdir()
    seen, flags = set(), set()

    def gt(*args, **kw) -> str:
        seen.add(str(args[0]))
        flags.update(str(a) for a in args if str(a).startswith("--"))
        return _run(["gguftool", *args], cwd=work, env={**env, **kw.pop("env", {})}, **kw)

    src = GGUFFile(smollm2)
    doc = json.loads(gt("inspect", smollm2, "--tensors", "--metadata", "--format", "json"))
    assert len(doc["tensors"]) == len(src.tensors)

    plan = gt("quantize", smollm2, "q4hqq.gguf", "Q4_HQQ", "--allow-requantize", "--tensor-type", "attn_v=Q8_0",
              "--dry-run")
    assert "Q4_HQQ" in plan and not (work / "q4hqq.gguf").exists()
    gt("quantize", smollm2, "q4hqq.gguf", "Q4_HQQ", "--allow-requantize", "--tensor-type", "attn_v=Q8_0")
    f = GGUFFile(work / "q4hqq.gguf")
    assert f.tensor("blk.3.attn_v.weight").type.name == "Q8_0" and f.tensor("blk.3.attn_q.weight").type.name == "Q4_HQQ"
    gt("quantize", smollm2, "q41.gguf", "Q4_1", "--solver", "hqq", "--allow-requantize")
    assert GGUFFile(work / "q41.gguf").tensor("blk.0.ffn_down.weight").type.name == "Q4_1"
    gt("quantize", smollm2, "phone.gguf", "--recipe", "phone-small", "--target-bpw", "4.5", "--allow-requantize")
    phone = GGUFFile(work / "phone.gguf")
    assert phone.get("gguftool.recipe.name") == "phone-small"
    assert phone.get("gguftool.kv_calib.blk.0.k_mean") is not None   # the recipe's [kv] calibrate = true

    gt("quantize", smollm2, "split.gguf", "Q4_HQQ", "--allow-requantize", "--split-max-size", "40M")
    shards = sorted(work.glob("split-*-of-*.gguf"))
    assert [p.name for p in shards] == [f"split-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert len(json.loads(gt("inspect", shards[0], "--tensors", "--format", "json"))["tensors"]) == len(src.tensors)

    listed = gt("recipes", "list")
    assert {"phone-small", "max-compression", "quality", "stock-llamacpp"} <= set(re.findall(r"^(\S+)", listed, re.M))
    assert "[kv]" in gt("recipes", "show", "phone-small")

    gt("convert", minilm_dir, "minilm.gguf", "--outtype", "Q4_HQQ")
    m = GGUFFile(work / "minilm.gguf")
    assert m.architecture == "bert" and any(t.type.name == "Q4_HQQ" for t in m.tensors)

    files = {p.relative_to(d).as_posix(): p.read_bytes()
             for d in [tiny_checkpoint(tmp_path / "ckpt", rng, n_embd=128, n_ff=256)] for p in sorted(d.rglob("*"))
             if p.is_file()}
    with FakeHub() as hub:
        hub.add("tests-org/tiny-llama", files)
        gt("hub", "tests-org/tiny-llama", "--type", "Q4_HQQ", "-o", "tiny.gguf",
           env={"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "0"})
    assert GGUFFile(work / "tiny.gguf").get("gguftool.source.repo") == "tests-org/tiny-llama"

    plan = gt("kv-plan", smollm2, "--memory", "2GiB", "--ctx", "8192", "--kv", "q5_0/tq3_1", "--kv", "q4_0",
              "--kv", "q5_0/tq3_3")
    assert re.search(r"^q5_0/tq3_1\s+4\.50\s", plan, re.M) and re.search(r"^q5_0/tq3_3\s+4\.38\s", plan, re.M)
    # uncalibrated, only stock q4_0/q4_0 is measured; after kv-calibrate both are, and one is named
    assert "best measured pair at 8,192 tokens: q4_0/q4_0 (like q4_0)" in plan
    # calibrated, q5_0/tq3_3 is both the smallest and the best measured of the three
    assert re.search(r"^after gguftool kv-calibrate: q5_0/tq3_3 \(better than q4_0\)$", plan, re.M)
    gt("kv-calibrate", smollm2, "smol-kv.gguf", "--chunks", "2")
    cal = GGUFFile(work / "smol-kv.gguf")
    assert np.asarray(cal.get("gguftool.kv_calib.blk.29.k_scale")).shape == (192,)
    said = gt("kv-calibrate", smollm2, "smol-kv-plan.gguf", "--k-layers", "tq3_3=auto:iq4_nl:40%", "--chunks", "2")
    planned = GGUFFile(work / "smol-kv-plan.gguf")
    assert planned.get("gguftool.kv_layers.k.for") == "tq3_3"
    assert f"layers {planned.get('gguftool.kv_layers.k')}" in said
    rules = Shape.from_gguf(planned).k_plan.rules
    assert sum(hi - lo + 1 for lo, hi, t in rules if t == "iq4_nl") == 12   # 40% of the 30 layers

    assert re.match(r"(reused cached build|built) in ", gt("native", "build", "-j", "2", timeout=3600))
    assert "cache:" in gt("native", "info")

    gt("imatrix", smollm2, "-o", "smol.imatrix.gguf", "--chunks", "2", "--ctx", "128")
    # a text of the user's own (here the excerpt backwards, so it cannot be the default text's start)
    (work / "my.txt").write_text((REPO_ROOT / "tests" / "data" / "native_pride_excerpt.txt").read_text()[::-1])
    gt("imatrix", smollm2, "-o", "mine.imatrix.gguf", "--text", "my.txt", "--chunks", "2", "--ctx", "128")
    ours, default = GGUFFile(work / "mine.imatrix.gguf"), GGUFFile(work / "smol.imatrix.gguf")
    name = next(t.name for t in default.tensors if t.name.endswith(".in_sum2"))
    assert not np.array_equal(ours.tensor(name).data, default.tensor(name).data)   # another text, other sums
    gt("sensitivity", smollm2, "-o", "smol.sensitivity.json", "--tensors", r"blk\.1[01]\.ffn_down", "--chunks", "1",
       "--ctx", "256")
    sens = json.loads((work / "smol.sensitivity.json").read_text())
    assert set(sens["kld"]) == {"blk.10.ffn_down.weight", "blk.11.ffn_down.weight"} and min(sens["kld"].values()) > 0
    sized = json.loads(gt("quantize", smollm2, "sized.gguf", "--recipe", "phone-small", "--target-bpw", "5",
                          "--sensitivity", "smol.sensitivity.json", "--allow-requantize", "--dry-run", "--format", "json"))
    assert sized["bits_per_weight"] <= 5 and not (work / "sized.gguf").exists()
    gt("quantize", smollm2, "q4km.gguf", "Q4_K_M", "--allow-requantize", "--imatrix", "smol.imatrix.gguf")
    km = GGUFFile(work / "q4km.gguf")
    assert {"Q4_K", "Q6_K"} <= {t.type.name for t in km.tensors} and km.get("quantize.imatrix.entries_count") > 100
    # the same mix with its K tensors searched (the _kquant extension is in the wheel): same types, other bytes
    gt("quantize", smollm2, "q4km-hqq.gguf", "Q4_K_M", "--solver", "hqq", "--allow-requantize")
    kh = GGUFFile(work / "q4km-hqq.gguf")
    assert [(t.name, t.type.name) for t in kh.tensors] == [(t.name, t.type.name) for t in km.tensors]
    assert json.loads(kh.get("gguftool.quantize.params")) == {"solver": "hqq"}

    # the default --out is relative (validate-out): the runs happen inside it
    gt("validate", smollm2, "--target", "local", "--isolate", "--types", "f16,tq3_1", "--chunks", "2", "--ctx", "128",
       "--no-sample", "--bench-p", "16", "--bench-n", "4", "--reps", "1", timeout=3600)
    rep = json.loads((work / "validate-out" / "report.json").read_text())
    assert rep["ok"] and {(c["k"], c["v"]) for c in rep["cells"]} >= {("tq3_1", "f16"), ("f16", "tq3_1")}
    assert all(c["peak_rss_kib"] for c in rep["cells"]) and (work / "validate-out" / "ppl_vs_bits.png").is_file()
    assert rep["k_score_error"]["types"]["tq3_1"]["rel_rms"] > rep["k_score_error"]["types"]["f16"]["rel_rms"]

    from gguftool.errors import GgufToolError
    from gguftool.validate import cross
    try:
        cross.find_cross_build()
    except GgufToolError:
        seen.add("validate")   # qemu-arm64 / adb need the aarch64 build (tests/test_validate_native.py)
    else:
        gt("validate", smollm2, "--target", "qemu-arm64", "--kv", "tq3_1", "--chunks", "1", "--ctx", "64",
           "--no-sample", "--no-bench", "--out", "qemu-out", timeout=3600)
        assert json.loads((work / "qemu-out" / "report.json").read_text())["ok"]
        fake = {"PATH": f"{REPO_ROOT / 'tests' / 'fake_adb'}{os.pathsep}{env['PATH']}",
                "FAKE_ADB_ROOT": str(tmp_path / "phone")}
        gt("validate", smollm2, "--target", "adb", "--kv", "tq3_1", "--chunks", "1", "--ctx", "64",
           "--no-sample", "--no-bench", "--out", "adb-out", timeout=3600, env=fake)
        assert json.loads((work / "adb-out" / "report.json").read_text())["ok"]
    assert nouns <= seen, f"tour commands not exercised: {nouns - seen}"
    # and every option the tour shows was given to some command above
    shown = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", tour))
    assert shown <= flags, f"tour options not exercised: {shown - flags}"
