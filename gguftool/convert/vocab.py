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
from .archs import read_json_object, shown

# The Split regexes of tokenizer.json, as the model authors publish them.
LLAMA3_RX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2_RX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
            "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
KNOWN_PRE = ("gpt-2", "smollm", "llama-bpe", "qwen2", "default")


def load_tokenizer_json(model_dir: Path) -> dict[str, Any]:
    """tokenizer.json with the parts gguftool (and gguf's SpecialVocab) read checked for type, once, here."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        found = [p.name for p in (model_dir / "tokenizer.model", model_dir / "vocab.json") if p.is_file()]
        raise GgufToolError(f"{model_dir}: no tokenizer.json" + (f" (found {', '.join(found)})" if found else ""),
                            hint="gguftool reads the tokenizer from tokenizer.json (the 'fast' tokenizer file); "
                                 "save it with transformers' AutoTokenizer.save_pretrained")
    tok = read_json_object(path)

    def bad(key: str, problem: str):
        raise GgufToolError(f"{path}: `{key}` {problem}")
    for key in ("model", "pre_tokenizer", "normalizer", "post_processor", "decoder"):
        if tok.get(key) is not None and not isinstance(tok[key], dict):
            bad(key, f"must be an object, not {shown(tok[key])}")
    model = tok.get("model") or {}
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):   # BPE and WordPiece map token -> id; Unigram's list is not converted
        raise GgufToolError(f"{path}: model type {model.get('type')!r} has no token->id vocabulary (`model.vocab`)",
                            hint="gguftool converts BPE and WordPiece tokenizers")
    for t, i in vocab.items():
        if not isinstance(i, int) or isinstance(i, bool):
            bad("model.vocab", f"id of {t!r} must be an integer, not {shown(i)}")
        if i < 0:
            bad("model.vocab", f"id of {t!r} = {i}: must be at least 0")
    merges = model.get("merges")
    if merges is not None:
        if not isinstance(merges, list):
            bad("model.merges", f"must be a list, not {shown(merges)[:80]}")
        for i, m in enumerate(merges):
            if not (isinstance(m, str) or (isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m))):
                bad(f"model.merges[{i}]", f"must be a string 'a b' or a pair of strings, not {shown(m)[:80]}")
    added = tok.get("added_tokens")
    if added is not None and not isinstance(added, list):
        bad("added_tokens", f"must be a list, not {shown(added)[:80]}")
    for i, a in enumerate(added or []):
        if not isinstance(a, dict) or "id" not in a or "content" not in a:
            bad(f"added_tokens[{i}]", f"must be an object with `id` and `content`, not {shown(a)[:80]}")
        if not isinstance(a["id"], int) or isinstance(a["id"], bool) or a["id"] < 0:
            bad(f"added_tokens[{i}].id", f"must be an integer of at least 0, not {shown(a['id'])}")
        if not isinstance(a["content"], str):
            bad(f"added_tokens[{i}].content", f"must be a string, not {shown(a['content'])}")
    for key in ("pre_tokenizer", "normalizer"):   # Sequence nodes: lists of objects, as detect_pre and the flags read
        stack = [(key, tok.get(key))]
        while stack:
            where, node = stack.pop()
            if not isinstance(node, dict):
                continue
            for sub in ("pretokenizers", "normalizers"):
                if sub in node:
                    items = node[sub]
                    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
                        bad(f"{where}.{sub}", f"must be a list of objects, not {shown(items)[:80]}")
                    stack += [(f"{where}.{sub}[{i}]", x) for i, x in enumerate(items)]
    post = tok.get("post_processor") or {}
    procs = post.get("processors", [post])
    if not isinstance(procs, list) or not all(isinstance(x, dict) for x in procs):
        bad("post_processor.processors", f"must be a list of objects, not {shown(procs)[:80]}")
    return tok


def check_ids(tok: dict[str, Any], n_vocab: int, where: object) -> None:
    """Every token id of tokenizer.json (vocabulary and added tokens) is below the model's vocabulary size."""
    vocab = (tok.get("model") or {}).get("vocab")
    ids = [*(vocab.values() if isinstance(vocab, dict) else ()), *(a["id"] for a in tok.get("added_tokens") or [])]
    if ids and max(ids) >= n_vocab:
        raise GgufToolError(f"{where}: has token id {max(ids)}, but the model's vocab_size is {n_vocab}",
                            hint="vocab_size is the number of rows of the token embedding")


SPECIAL_TOKENS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask", "eot", "eom")


def check_tokenizer_config(model_dir: Path) -> dict[str, Any] | None:
    """tokenizer_config.json, the values gguf's SpecialVocab and we read checked (it skips a value of the wrong
    type without a word: a BOS token given as a number would silently be no BOS token)."""
    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return None
    cfg = read_json_object(path)
    for t in SPECIAL_TOKENS:
        v = cfg.get(f"{t}_token")
        if v is not None and not isinstance(v, str) and not (isinstance(v, dict) and isinstance(v.get("content"), str)):
            raise GgufToolError(f"{path}: `{t}_token` must be a string or an object with a string `content`, "
                                f"not {shown(v)[:80]}")
    for key in [f"add_{t}_token" for t in SPECIAL_TOKENS] + ["add_prefix_space"]:
        if cfg.get(key) is not None and not isinstance(cfg[key], bool):
            raise GgufToolError(f"{path}: `{key}` must be true or false, not {shown(cfg[key])}")
    templates = [model_dir / "chat_template.jinja", *sorted((model_dir / "additional_chat_templates").glob("*.jinja"))]
    for t in templates:   # the chat template files gguf's SpecialVocab reads besides tokenizer_config.json
        if t.is_file():
            try:
                t.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise GgufToolError(f"{t}: not a chat template: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if (model_dir / "chat_template.json").is_file():
        read_json_object(model_dir / "chat_template.json")
    tmpl = cfg.get("chat_template")
    if tmpl is not None and not isinstance(tmpl, str) and not (
            isinstance(tmpl, list) and all(isinstance(x, dict) and isinstance(x.get("name"), str)
                                           and isinstance(x.get("template"), str) for x in tmpl)):
        raise GgufToolError(f"{path}: `chat_template` must be a string or a list of {{name, template}} objects, "
                            f"not {shown(tmpl)[:80]}")
    return cfg


def _special_vocab(model_dir: Path, **kw) -> gguf.SpecialVocab:
    """gguf's SpecialVocab (merges, special ids, chat template) on files checked above; anything else it trips on
    in them is still named as theirs."""
    try:
        return gguf.SpecialVocab(model_dir, **kw)
    except (AttributeError, TypeError, KeyError, ValueError, IndexError, RecursionError) as e:
        raise GgufToolError(f"{model_dir}: gguf cannot read the special tokens of tokenizer.json / tokenizer_config.json "
                            f"({type(e).__name__}: {e})") from None


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
        pattern = parts[0].get("pattern")
        rx = pattern.get("Regex") if isinstance(pattern, dict) else None
        return {LLAMA3_RX: "llama-bpe", QWEN2_RX: "qwen2"}.get(rx)
    return None


def _looks_special(text: str) -> bool:
    # convert_hf_to_gguf.py's does_token_look_special: added tokens some models forget to flag special
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>")) or (text.startswith("<unused") and text.endswith(">")))


def base_vocab(tok: dict[str, Any], vocab_size: int | None, where: object = "tokenizer.json") -> tuple[list[str], list[int]]:
    """Tokens by id with their llama.cpp token types (get_vocab_base's rules)."""
    model = tok.get("model") or {}
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise GgufToolError(f"{where}: model type {model.get('type')!r} has no token->id vocabulary")
    reverse = {i: t for t, i in vocab.items()}
    added = {a["id"]: a for a in tok.get("added_tokens") or []}
    for i, a in added.items():
        reverse[i] = a["content"]
    n = vocab_size if vocab_size is not None else max(reverse) + 1
    check_ids(tok, n, where)
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
    tokens, types = base_vocab(tok, vocab_size, model_dir / "tokenizer.json")
    g.add_tokenizer_model("gpt2")
    g.add_tokenizer_pre(pre)
    g.add_token_list(tokens)
    g.add_token_types(types)
    special = _special_vocab(model_dir, load_merges=True)
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
    tokens, types = base_vocab(tok, vocab_size, model_dir / "tokenizer.json")
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
    _special_vocab(model_dir, n_vocab=len(tokens)).add_to_gguf(g)


def write_wpm(model_dir: Path, tok: dict[str, Any], cfg: dict[str, Any], g: gguf.GGUFWriter) -> None:
    """BERT WordPiece, in llama.cpp's 'phantom space' form: word starts get U+2581, '##' pieces lose the prefix."""
    model = tok.get("model") or {}
    if model.get("type") != "WordPiece":
        raise GgufToolError(f"{model_dir}/tokenizer.json: expected a WordPiece tokenizer for BERT, found {model.get('type')!r}")
    tokens, types = base_vocab(tok, cfg.get("vocab_size"), model_dir / "tokenizer.json")
    g.add_token_type_count(int(cfg.get("type_vocab_size", 1)))

    def phantom(t: str, ty: int) -> str:
        if ty == gguf.TokenType.CONTROL:
            return t
        return t[2:] if t.startswith("##") else "\u2581" + t
    g.add_tokenizer_model("bert")
    g.add_tokenizer_pre("default")
    g.add_token_list([phantom(t, ty) for t, ty in zip(tokens, types)])
    g.add_token_types(types)
    _special_vocab(model_dir, n_vocab=len(tokens)).add_to_gguf(g)


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


def load_checked(model_dir: Path, n_vocab: int) -> dict[str, Any]:
    """tokenizer.json and tokenizer_config.json checked (types, and ids below n_vocab): what write_vocab reads."""
    tok = load_tokenizer_json(model_dir)
    check_tokenizer_config(model_dir)
    check_ids(tok, n_vocab, model_dir / "tokenizer.json")
    return tok


def write_vocab(kind: str, arch_name: str, model_dir: Path, cfg: dict[str, Any], g: gguf.GGUFWriter,
                pre_override: str | None = None, tok: dict[str, Any] | None = None) -> str:
    tok = load_tokenizer_json(model_dir) if tok is None else tok
    tcfg = check_tokenizer_config(model_dir)
    for k, v in normalizer_flags(tok.get("normalizer")).items():
        g.add_bool(NORMALIZER_KEYS[k], v)
    if kind == "wpm":
        write_wpm(model_dir, tok, cfg, g)
        return "default"
    if arch_name == "llama" and tcfg is not None and tcfg.get("add_prefix_space") is not None:
        g.add_add_space_prefix(tcfg["add_prefix_space"])
    pre = write_bpe(model_dir, tok, cfg.get("vocab_size"), g, pre_override)
    if arch_name == "llama" and cfg.get("vocab_size") == 49152:
        # convert_hf_to_gguf.py's rule for this vocabulary size (Granite small, SmolLM): no BOS
        g.kv_data[0].pop(gguf.Keys.Tokenizer.ADD_BOS, None)
        g.add_add_bos_token(False)
    return pre
