"""Checks of the values users give: config.json fields, command-line options, request fields.

Each function returns the value (as the Python type the code needs) or raises ``ConfigError``
with one line that names the field, says what it must be and what was found:

    temperature = check_float(ns.temperature, name="--temperature", low=0.0, high=100.0)
    n_layers = config_int(cfg, "num_hidden_layers")      # "config.json lacks num_hidden_layers"
    theta = config_float(cfg, "rope_theta", default=1e4, low=0.0, low_open=True)

JSON (``json.loads``) accepts ``NaN`` and ``Infinity`` and argparse's ``type=float`` accepts
``nan`` and ``inf``: every float read from either goes through :func:`check_float`, which
refuses them. Integers refuse booleans, strings and fractional floats (``1e3`` written in JSON
is accepted as 1000).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.errors import ConfigError

__all__ = [
    "FLOAT32_MAX",
    "INT32_MAX",
    "check_bool",
    "check_float",
    "check_int",
    "check_known_options",
    "check_output_file",
    "check_seed",
    "check_text",
    "config_bool",
    "config_float",
    "config_int",
    "parse_size",
]

FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32: RoPE tables and norms are computed in float32."""
INT32_MAX = 2**31 - 1
"""Default upper bound of config.json integers (sizes, counts, token ids, positions)."""
_MISSING: Any = object()


def _show(value: Any) -> str:
    """A value as the user wrote it: JSON spelling (null, NaN, "abc"), else repr."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _range(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{_fmt(low)}, {_fmt(high)}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {_fmt(low)}"
    if high is not None:
        return f" {'<' if high_open else '<='} {_fmt(high)}"
    return ""


def check_float(
    value: Any,
    *,
    name: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite float within ``[low, high]`` (open ends with ``low_open`` /
    ``high_open``); ConfigError naming ``name`` otherwise (NaN and infinities included)."""
    want = f"a finite number{_range(low, high, low_open, high_open)}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be {want}, got {_show(value)}")
    try:
        x = float(value)
    except OverflowError:  # an int beyond float range
        raise ConfigError(f"{name} must be {want}, got {_show(value)}") from None
    if (
        not math.isfinite(x)
        or (low is not None and (x < low or (low_open and x == low)))
        or (high is not None and (x > high or (high_open and x == high)))
    ):
        raise ConfigError(f"{name} must be {want}, got {_show(value)}")
    return x


def check_int(value: Any, *, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int within ``[low, high]``; a float is accepted only when integral."""
    want = f"an integer{_range(low, high, False, False)}"
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be {want}, got {_show(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ConfigError(f"{name} must be {want}, got {value}")
    return value


def check_bool(value: Any, *, name: str) -> bool:
    """``value`` when it is a boolean (a JSON ``true``/``false``, not the string "false")."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {_show(value)}")
    return value


def check_seed(value: Any, *, name: str = "seed") -> int:
    """A random seed: an integer in [0, 2**64) (what ``torch.Generator.manual_seed`` takes)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ConfigError(f"{name} must be an integer in [0, 2**64), got {_show(value)}")
    return value


def check_text(text: Any, *, name: str) -> str:
    """``text`` when it is a str that encodes as UTF-8. A command-line argument with bytes that
    are not valid in the locale's encoding arrives with lone surrogates (``surrogateescape``);
    they cannot be tokenized, so they are refused here, naming the byte."""
    if not isinstance(text, str):
        raise ConfigError(f"{name} must be text, got {_show(text)}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = ord(text[exc.start])
        what = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"U+{char:04X}"
        raise ConfigError(
            f"{name} is not valid UTF-8 text: {what} at character {exc.start}; pass UTF-8 "
            "text (check the terminal's encoding, e.g. LANG=C.UTF-8)"
        ) from None
    return text


def check_known_options(options: Mapping[str, Any], known: set[str], what: str) -> None:
    """Raise :class:`ConfigError` naming the first key of ``options`` not in ``known``, with
    the closest valid key and the full list (options are never dropped silently)."""
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown {what} {key!r}{hint} (known: {', '.join(sorted(known))})")


def check_output_file(path: str | os.PathLike[str], *, name: str) -> Path:
    """A file path that can be written: not a directory, in an existing, writable directory.
    Checked before long work whose result goes there."""
    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"{name} {out} is a directory; give a file path, e.g. {out}/out.json")
    parent = out.parent
    if not parent.is_dir():
        raise ConfigError(f"{name} {out}: the directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ConfigError(f"{name} {out} is not writable; choose another path")
    return out


#: the units :func:`parse_size` takes (lower case): IEC binary and SI decimal multiples of a byte
SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE = re.compile(r"\s*([+-]?)(\d{1,20}(?:\.\d{1,20})?)\s*([A-Za-z]*)\s*")
_SIZE_FORMS = (
    "give bytes as an integer (1073741824) or a number with a unit: KiB, MiB, GiB, TiB (powers "
    "of 1024) or KB, MB, GB, TB (powers of 1000), in any case, e.g. 4GiB or 1.5gb"
)


def parse_size(text: str, *, name: str) -> int:
    """Bytes from a size as users write it: ``1073741824``, ``4GiB``, ``512 MiB``, ``1.5GB``,
    ``2gib`` (IEC units are powers of 1024, SI units powers of 1000, as Kubernetes reads
    them; a fraction is rounded down to whole bytes). ConfigError naming ``name`` and the
    accepted forms for anything else; a size of 0 bytes or less is refused."""
    match = _SIZE.fullmatch(text)
    unit = match.group(3).lower() if match else None
    if match is None or unit not in SIZE_UNITS:
        raise ConfigError(f"{name} {text!r} is not a size: {_SIZE_FORMS}")
    size = int(Decimal(match.group(2)) * SIZE_UNITS[unit])
    if match.group(1) == "-" or size < 1:
        raise ConfigError(f"{name} {text!r} is not above 0 bytes: give a positive size, e.g. 4GiB")
    return size


def _config_value(cfg: Mapping[str, Any], key: str, default: Any, what: str, file: str) -> Any:
    """``cfg[key]``; ``default`` where it is absent or null (``_MISSING``: a required field)."""
    value = cfg.get(key)
    if value is not None:
        return value
    if default is not _MISSING:
        return default
    if key in cfg:
        raise ConfigError(f"{file} has {key}=null; it must be {what}")
    raise ConfigError(f"{file} lacks {key} ({what}); the file is incomplete")


def config_int(
    cfg: Mapping[str, Any],
    key: str,
    *,
    default: Any = _MISSING,
    low: int | None = 1,
    high: int | None = INT32_MAX,
    file: str = "config.json",
) -> int:
    """Integer field ``key`` of a config dict (required unless ``default`` is given; null means
    the default), within ``[low, high]``."""
    what = f"an integer{_range(low, high, False, False)}"
    value = _config_value(cfg, key, default, what, file)
    return check_int(value, name=f"{file} {key}", low=low, high=high)


def config_float(
    cfg: Mapping[str, Any],
    key: str,
    *,
    default: Any = _MISSING,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    file: str = "config.json",
) -> float:
    """Float field ``key`` of a config dict: finite and within range (see :func:`check_float`)."""
    what = f"a finite number{_range(low, high, low_open, high_open)}"
    value = _config_value(cfg, key, default, what, file)
    return check_float(
        value, name=f"{file} {key}", low=low, high=high, low_open=low_open, high_open=high_open
    )


def config_bool(
    cfg: Mapping[str, Any], key: str, *, default: bool, file: str = "config.json"
) -> bool:
    """Boolean field ``key`` (absent or null: ``default``); the string "false" is refused."""
    return check_bool(_config_value(cfg, key, default, "true or false", file), name=f"{file} {key}")
