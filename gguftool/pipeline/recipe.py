"""Recipes: named, declarative quantization plans in TOML (recipes/*.toml, or any file).

    name = "phone-small"
    description = "..."
    type = "Q4_HQQ"                    # default type of the weight tensors
    output_type = "Q8_0"               # optional: output.weight (or a tied token_embd)
    token_embedding_type = "Q8_0"      # optional
    pure = false                       # optional: no default mixing
    allowed = ["Q4_HQQ_128", "Q4_HQQ"] # optional: types --target-bpw/--target-size may choose from
    [solver]                           # optional: HQQ parameters for every tensor
    iters = 20
    [[rules]]                          # ordered, first match wins
    pattern = "attn_v|ffn_down"
    type = "Q5_1"
    solver = { solver = "hqq" }        # optional: parameters for this rule's tensors
    [kv]                               # the KV-cache types to validate with
    k = "tq3_1"
    v = "tq3_1"
    calibrate = true                   # optional: quantize/convert also run kv-calibrate on the output
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GgufToolError
from ..quant import codec
from ..types import CACHE_TYPES
from .plan import Options, Rule, make_rule

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOP_KEYS = {"name", "description", "type", "output_type", "token_embedding_type", "pure", "allowed", "solver",
            "rules", "kv"}
RULE_KEYS = {"pattern", "type", "solver"}
KV_KEYS = {"k", "v", "calibrate", "k_layers", "v_layers"}
SOLVERS = ("ref", "hqq")   # llama.cpp's reference quantizer, or HQQ (for Q4_1/Q5_1; our HQQ types need "hqq")


@dataclass
class Recipe:
    name: str
    description: str
    type: str
    path: Path
    text: str
    output_type: str | None = None
    token_embedding_type: str | None = None
    pure: bool = False
    allowed: list[str] = field(default_factory=list)
    solver: dict = field(default_factory=dict)
    rules: list[Rule] = field(default_factory=list)
    kv: dict[str, str] = field(default_factory=dict)
    kv_calibrate: bool = False
    kv_layers: dict[str, str] = field(default_factory=dict)   # side -> kv-calibrate --k-layers/--v-layers spec

    def options(self, base: Options) -> Options:
        """CLI options first (they override), then the recipe's."""
        base.target = base.target or self.type
        base.tensor_types = [*base.tensor_types, *self.rules]
        base.output_tensor_type = base.output_tensor_type or self.output_type
        base.token_embedding_type = base.token_embedding_type or self.token_embedding_type
        base.pure = base.pure or self.pure
        return base


INSTALLED_RECIPE_DIR = Path(__file__).resolve().parents[1] / "recipes"  # a wheel: package gguftool.recipes


def checkout_recipe_dir(package: Path) -> Path | None:
    """recipes/ beside the package `package` when that is a source checkout (its pyproject.toml and setup.py
    are there). Installed, the folder above the package is site-packages, whose `recipes` (if some other
    distribution installs one) is not ours and must not shadow or add to gguftool's recipes."""
    root = package.parent
    ours = (root / "pyproject.toml").is_file() and (root / "setup.py").is_file()
    return root / "recipes" if ours and (root / "recipes").is_dir() else None


def recipe_dirs() -> list[Path]:
    # gguftool.recipes has no __init__.py: importlib.resources would hand back a MultiplexedPath, not a folder
    checkout = checkout_recipe_dir(Path(__file__).resolve().parents[1])
    return [d for d in (checkout, INSTALLED_RECIPE_DIR) if d is not None and d.is_dir()]


def available() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in recipe_dirs():
        for p in sorted(d.glob("*.toml")):
            found.setdefault(p.stem, p)
    return found


def load(name_or_path: str) -> Recipe:
    p = Path(name_or_path)
    if not (p.suffix == ".toml" or p.exists()):
        known = available()
        if name_or_path not in known:
            raise GgufToolError(f"no recipe named {name_or_path!r}", hint="known: " + ", ".join(sorted(known)))
        p = known[name_or_path]
    if not p.is_file():
        raise GgufToolError(f"{p}: no such recipe file")
    try:
        text = p.read_text(encoding="utf-8")
        d = tomllib.loads(text)
    except UnicodeDecodeError as e:
        raise GgufToolError(f"{p}: not a recipe: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except (tomllib.TOMLDecodeError, RecursionError) as e:
        raise GgufToolError(f"{p}: not valid TOML: {e}") from None
    return parse(d, p, text)


_KIND = {bool: "true or false", str: "a string", int: "an integer", float: "a number", list: "an array",
         dict: "a table"}


def _value(where: str, key: str, v: object, kind: type):
    """`v` if it is TOML's `kind`, else an error naming the file, the key and the type wanted: a
    quoted "false" must not read as true, nor a number as a string (bool is no int here; an int is a float)."""
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, kind) and not (isinstance(v, bool) and kind is not bool):
        return v
    got = {str: "the string", bool: "the boolean", int: "the integer", float: "the number"}.get(type(v))
    shown = str(v).lower() if isinstance(v, bool) else repr(v)   # as TOML writes it
    raise GgufToolError(f"{where}: `{key}` must be {_KIND[kind]}, not "
                        + (f"{got} {shown}" if got else _KIND.get(type(v), type(v).__name__)))


def _solver(where: str, d: dict) -> dict:
    """A solver table: known parameters only (a typo must not be recorded as applied), each of its type
    and range. Types come from the codecs' own defaults; ranges from the HQQ solver's checks."""
    from ..quant import all_codecs
    kinds = {k: type(v) for c in all_codecs() for k, v in c.params.items()}
    _check_keys(where, d, set(kinds))
    d = {k: _value(where, k, v, kinds[k]) for k, v in d.items()}
    if d.get("solver", "hqq") not in SOLVERS:
        raise GgufToolError(f"{where}: `solver` must be one of {', '.join(map(repr, SOLVERS))}, not {d['solver']!r}")
    try:
        from ..quant.hqq import HQQParams
    except ImportError:   # the C extension is missing: quant.codec says so when a type needs it
        return d
    try:
        HQQParams.make(**{**d, "solver": "hqq"})
    except GgufToolError as e:
        raise GgufToolError(f"{where}: {e.message}", e.hint) from None
    return d


def _check_keys(where: str, d: dict, allowed: set[str]) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise GgufToolError(f"{where}: unknown key(s) {unknown}", hint="known: " + ", ".join(sorted(allowed)))


def _type(where: str, name: object) -> str:
    if not isinstance(name, str):
        raise GgufToolError(f"{where}: a type must be a string, got {name!r}")
    try:
        c = codec(name)
    except GgufToolError as e:
        raise GgufToolError(f"{where}: {e.message}", e.hint) from None
    if c.quantize is None:
        raise GgufToolError(f"{where}: gguftool cannot produce {c.name}")
    return c.name


def parse(d: dict, path: Path, text: str = "") -> Recipe:
    where = str(path)
    _check_keys(where, d, TOP_KEYS)
    if "type" not in d:
        raise GgufToolError(f"{where}: missing `type` (the default type of the weights)")
    rules = []
    for i, r in enumerate(_value(where, "rules", d.get("rules", []), list)):
        rw = f"{where}: rules[{i}]"
        if not isinstance(r, dict):
            raise GgufToolError(f"{rw}: expected a table with pattern and type")
        _check_keys(rw, r, RULE_KEYS)
        if "pattern" not in r or "type" not in r:
            raise GgufToolError(f"{rw}: needs both `pattern` and `type`")
        pattern = _value(rw, "pattern", r["pattern"], str)
        solver = _solver(f"{rw}: solver", _value(rw, "solver", r.get("solver", {}), dict))
        rules.append(make_rule(pattern, _type(rw, r["type"]), solver, f"{rw} ({pattern!r})"))
    kv = dict(d.get("kv", {})) if isinstance(d.get("kv", {}), dict) else None
    if kv is None:
        raise GgufToolError(f"{where}: [kv] must be a table with k, v (and calibrate)")
    _check_keys(f"{where}: [kv]", kv, KV_KEYS)
    calibrate = kv.pop("calibrate", False)
    if not isinstance(calibrate, bool):
        raise GgufToolError(f"{where}: [kv] calibrate must be true or false, not {calibrate!r}")
    layers = {side: kv.pop(f"{side}_layers") for side in "kv" if f"{side}_layers" in kv}
    for side, spec in layers.items():
        if not isinstance(spec, str) or not calibrate:
            raise GgufToolError(f"{where}: [kv] {side}_layers = {spec!r}: a kv-calibrate plan string "
                                "(e.g. \"tq3_2=auto:iq4_nl:40%\") that needs calibrate = true")
        from .kvcalib import parse_plan
        base = parse_plan(spec, None, f"{where}: [kv] {side}_layers").base
        if base != str(kv.get(side, "")).lower():
            raise GgufToolError(f"{where}: [kv] {side}_layers = {spec!r} is for {base!r}, but {side} = {kv.get(side)!r}",
                                hint="a plan applies only when the cache runs its base type")
    for side, t in kv.items():
        if not isinstance(t, str) or t.lower() not in CACHE_TYPES:
            raise GgufToolError(f"{where}: [kv] {side} = {t!r} is not a KV cache type",
                                hint="choose from " + ", ".join(CACHE_TYPES))
    return Recipe(
        name=_value(where, "name", d.get("name", path.stem), str),
        description=_value(where, "description", d.get("description", ""), str), type=_type(f"{where}: type", d["type"]),
        path=path, text=text,
        output_type=_type(f"{where}: output_type", d["output_type"]) if "output_type" in d else None,
        token_embedding_type=(_type(f"{where}: token_embedding_type", d["token_embedding_type"])
                              if "token_embedding_type" in d else None),
        pure=_value(where, "pure", d.get("pure", False), bool),
        allowed=[_type(f"{where}: allowed", t) for t in _value(where, "allowed", d.get("allowed", []), list)],
        solver=_solver(f"{where}: [solver]", _value(where, "solver", d.get("solver", {}), dict)),
        rules=rules, kv={k: str(v).lower() for k, v in kv.items()},
        kv_calibrate=calibrate, kv_layers={side: spec.lower() for side, spec in layers.items()},
    )
