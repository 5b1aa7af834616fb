"""Tokenizer -> GGUF metadata, from tokenizer.json (no transformers needed).

Token lists and types follow convert_hf_to_gguf.py's get_vocab_base (GPT-2 style BPE and WordPiece);
merges, special token ids, add_bos/add_eos and the chat template come from gguf's own SpecialVocab.
llama.cpp picks its pre-tokenizer regex by the `tokenizer.ggml.pre` name. convert_hf_to_gguf.py finds
that name by hashing transformers' output on a probe text; we read the pre-tokenizer that
tokenizer.json declares and recognise the families we support, and refuse to guess otherwise.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf

from ..errors import GgufToolError

# The Split regexes of tokenizer.json, as the model authors publish them.
LLAMA3_RX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2_RX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
            "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
KNOWN_PRE = ("gpt-2", "smollm", "llama-bpe", "qwen2", "default")


def load_tokenizer_json(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        found = [p.name for p in (model_dir / "tokenizer.model", model_dir / "vocab.json") if p.is_file()]
        raise GgufToolError(f"{model_dir}: no tokenizer.json" + (f" (found {', '.join(found)})" if found else ""),
                            hint="gguftool reads the tokenizer from tokenizer.json (the 'fast' tokenizer file); "
                                 "save it with transformers' AutoTokenizer.save_pretrained")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GgufToolError(f"{path}: not valid JSON ({e})") from None


def _pre_parts(tok: dict[str, Any]) -> list[dict[str, Any]]:
    pre = tok.get("pre_tokenizer") or {}
    return list(pre.get("pretokenizers", [])) if pre.get("type") == "Sequence" else ([pre] if pre else [])


def detect_pre(tok: dict[str, Any]) -> str | None:
    """llama.cpp's pre-tokenizer name for a byte-level BPE tokenizer.json, or None if not recognised."""
    parts = _pre_parts(tok)
    kinds = [p.get("type") for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        rx = (parts[0].get("pattern") or {}).get("Regex")
        return {LLAMA3_RX: "llama-bpe", QWEN2_RX: "qwen2"}.get(rx)
    return None


def _looks_special(text: str) -> bool:
    # convert_hf_to_gguf.py's does_token_look_special: added tokens some models forget to flag special
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>")) or (text.startswith("<unused") and text.endswith(">")))


def base_vocab(tok: dict[str, Any], vocab_size: int | None) -> tuple[list[str], list[int]]:
    """Tokens by id with their llama.cpp token types (get_vocab_base's rules)."""
    model = tok.get("model") or {}
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise GgufToolError(f"tokenizer.json: model type {model.get('type')!r} has no token->id vocabulary")
    reverse = {int(i): t for t, i in vocab.items()}
    added = {int(a["id"]): a for a in tok.get("added_tokens", [])}
    for i, a in added.items():
        reverse[i] = a["content"]
    n = vocab_size if vocab_size is not None else max(reverse) + 1
    if reverse and max(reverse) >= n:
        raise GgufToolError(f"tokenizer.json has token id {max(reverse)} but the model's vocab_size is {n}")
    tokens, types = [], []
    for i in range(n):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        text = reverse[i]
        if i in added:
            if added[i].get("special") or _looks_special(text):
                types.append(gguf.TokenType.CONTROL)
            else:
                text = text.replace("\u2581", " ")  # llama.cpp expects user-defined tokens pre-normalised
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(text)
    return tokens, types


def write_bpe(model_dir: Path, tok: dict[str, Any], vocab_size: int | None, g: gguf.GGUFWriter,
              pre_override: str | None = None) -> str:
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise GgufToolError(f"{model_dir}/tokenizer.json: tokenizer model {model.get('type')!r} is not supported for "
                            "this architecture", hint="gguftool converts byte-level BPE (GPT-2 style) decoder tokenizers")
    if model.get("byte_fallback"):
        write_spm(model_dir, tok, vocab_size, g)
        return "default"
    pre = pre_override or detect_pre(tok)
    if pre is None:
        raise GgufToolError(
            f"{model_dir}/tokenizer.json: unrecognised pre-tokenizer {json.dumps(tok.get('pre_tokenizer'))[:200]}",
            hint=f"pass --tokenizer-pre NAME with llama.cpp's name for it (gguftool knows {', '.join(KNOWN_PRE)})")
    tokens, types = base_vocab(tok, vocab_size)
    g.add_tokenizer_model("gpt2")
    g.add_tokenizer_pre(pre)
    g.add_token_list(tokens)
    g.add_token_types(types)
    special = gguf.SpecialVocab(model_dir, load_merges=True)
    if not special.merges:
        raise GgufToolError(f"{model_dir}/tokenizer.json: BPE tokenizer without merges")
    special.add_to_gguf(g)
    return pre


def write_spm(model_dir: Path, tok: dict[str, Any], vocab_size: int | None, g: gguf.GGUFWriter) -> None:
    """SentencePiece BPE saved as tokenizer.json (byte_fallback: Llama 2, Mistral v0.1-v0.3) -> llama.cpp's
    'llama' tokenizer. Types as gguf's LlamaHfVocab gives them (<0xXX> BYTE, specials CONTROL, the unk token
    UNKNOWN). Scores: llama.cpp merges the best-scoring pair first; SentencePiece's BPE pieces are stored in
    merge order, so -id reproduces its ranking without the tokenizer.model file."""
    import re
    model = tok["model"]
    tokens, types = base_vocab(tok, vocab_size)
    unk = model.get("unk_token")
    scores = []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty == gguf.TokenType.NORMAL and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", t):
            types[i] = ty = gguf.TokenType.BYTE
        elif ty == gguf.TokenType.NORMAL and t == unk:
            types[i] = ty = gguf.TokenType.UNKNOWN
        elif ty == gguf.TokenType.USER_DEFINED:
            tokens[i] = t.replace(" ", "\u2581")  # SentencePiece text keeps its U+2581 spaces
        scores.append(float(-i) if ty == gguf.TokenType.NORMAL else (-1000.0 if ty == gguf.TokenType.USER_DEFINED else 0.0))
    g.add_tokenizer_model("llama")
    g.add_tokenizer_pre("default")
    g.add_token_list(tokens)
    g.add_token_scores(scores)
    g.add_token_types(types)
    gguf.SpecialVocab(model_dir, n_vocab=len(tokens)).add_to_gguf(g)


def write_wpm(model_dir: Path, tok: dict[str, Any], cfg: dict[str, Any], g: gguf.GGUFWriter) -> None:
    """BERT WordPiece, in llama.cpp's 'phantom space' form: word starts get U+2581, '##' pieces lose the prefix."""
    model = tok.get("model") or {}
    if model.get("type") != "WordPiece":
        raise GgufToolError(f"{model_dir}/tokenizer.json: expected a WordPiece tokenizer for BERT, found {model.get('type')!r}")
    tokens, types = base_vocab(tok, cfg.get("vocab_size"))
    g.add_token_type_count(int(cfg.get("type_vocab_size", 1)))

    def phantom(t: str, ty: int) -> str:
        if ty == gguf.TokenType.CONTROL:
            return t
        return t[2:] if t.startswith("##") else "\u2581" + t
    g.add_tokenizer_model("bert")
    g.add_tokenizer_pre("default")
    g.add_token_list([phantom(t, ty) for t, ty in zip(tokens, types)])
    g.add_token_types(types)
    gguf.SpecialVocab(model_dir, n_vocab=len(tokens)).add_to_gguf(g)


NORMALIZER_KEYS = {"lowercase": "tokenizer.ggml.normalizer.lowercase",
                   "strip_accents": "tokenizer.ggml.normalizer.strip_accents"}


def normalizer_flags(norm: dict[str, Any] | None, flags: dict[str, bool] | None = None) -> dict[str, bool]:
    """Lowercasing / accent stripping declared by tokenizer.json's normalizer. llama.cpp's WordPiece tokenizer
    lowercases only when the file says so (newer gguf-py writes these keys; the gguf package we use does not)."""
    flags = {} if flags is None else flags
    if not norm:
        return flags
    kind = norm.get("type")
    if kind == "Lowercase":
        flags["lowercase"] = True
    elif kind == "StripAccents":
        flags["strip_accents"] = True
    elif kind == "BertNormalizer":
        for k in NORMALIZER_KEYS:
            if norm.get(k) is not None:
                flags[k] = bool(norm[k])
    elif kind == "Sequence":
        for n in norm.get("normalizers", []):
            normalizer_flags(n, flags)
    return flags


def write_vocab(kind: str, arch_name: str, model_dir: Path, cfg: dict[str, Any], g: gguf.GGUFWriter,
                pre_override: str | None = None) -> str:
    tok = load_tokenizer_json(model_dir)
    for k, v in normalizer_flags(tok.get("normalizer")).items():
        g.add_bool(NORMALIZER_KEYS[k], v)
    if kind == "wpm":
        write_wpm(model_dir, tok, cfg, g)
        return "default"
    if arch_name == "llama":
        tcfg = model_dir / "tokenizer_config.json"
        if tcfg.is_file():
            try:
                add_prefix = json.loads(tcfg.read_text(encoding="utf-8")).get("add_prefix_space")
            except json.JSONDecodeError as e:
                raise GgufToolError(f"{tcfg}: not valid JSON ({e})") from None
            if add_prefix is not None:
                g.add_add_space_prefix(add_prefix)
    pre = write_bpe(model_dir, tok, cfg.get("vocab_size"), g, pre_override)
    if arch_name == "llama" and cfg.get("vocab_size") == 49152:
        # convert_hf_to_gguf.py's rule for this vocabulary size (Granite small, SmolLM): no BOS
        g.kv_data[0].pop(gguf.Keys.Tokenizer.ADD_BOS, None)
        g.add_add_bos_token(False)
    return pre
