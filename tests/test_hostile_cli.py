"""Hostile checkpoints and option values through the command line: one ``error:`` line naming
the tensor or field, exit code 2, at ``--tp 1`` and ``--tp 2`` (refused in the launching
process, before any rank starts), quickly and in bounded memory."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._hostile import copy_demo, edit_config, edit_header
from torch_tensorrt_dist.cli import main

NORM = "model.layers.0.input_layernorm.weight"


def _overlap(ckpt: Path) -> None:
    edit_header(ckpt, lambda h: h[NORM].update(data_offsets=[0, 512]))


def _before_data(ckpt: Path) -> None:
    edit_header(ckpt, lambda h: h[NORM].update(data_offsets=[-400, 112]))


def _header_list(ckpt: Path) -> None:
    (ckpt / "model.safetensors").write_bytes(b"\x02" + b"\0" * 7 + b"[]")  # header "[]"


def _bf16_as_f32(ckpt: Path) -> None:
    edit_header(ckpt, lambda h: h[NORM].update(dtype="F32"))


#: (id, how the demo copy is broken, what the error line must say)
CHECKPOINTS = [
    ("overlap", _overlap, rf"tensor '.*' \(data_offsets \[0, .*\]\) overlaps tensor '{NORM}'"),
    ("before_data", _before_data, rf"tensor '{NORM}': data_offsets \[-400, 112\] is not"),
    ("header_list", _header_list, r"model.safetensors: the safetensors header is a list"),
    ("bf16_as_f32", _bf16_as_f32, rf"tensor '{NORM}': a F32 tensor of shape \[256\] needs 1024"),
    (
        "layers",
        lambda c: edit_config(c, num_hidden_layers=100000),
        r"config.json says num_hidden_layers=100000, but .* holds 4 layers",
    ),
    ("vocab", lambda c: edit_config(c, vocab_size=1e12), r"config.json vocab_size must be an"),
    (
        "rope_theta_nan",
        lambda c: edit_config(c, rope_theta=float("nan"), rope_parameters=...),
        r"config.json rope_theta must be a finite number",
    ),
    (
        "heads_missing",
        lambda c: edit_config(c, num_attention_heads=...),
        r"config.json lacks num_attention_heads",
    ),
    (
        "index",
        lambda c: (c / "model.safetensors.index.json").write_text("[1]"),
        r"model.safetensors.index.json has no weight_map object",
    ),
]


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, change, _ in CHECKPOINTS:
        ckpt = copy_demo(tmp_path_factory.mktemp(name))
        change(ckpt)
        out[name] = ckpt
    return out


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("tp", ["1", "2"])
@pytest.mark.parametrize(
    ("name", "message"), [(c[0], c[2]) for c in CHECKPOINTS], ids=[c[0] for c in CHECKPOINTS]
)
def test_hostile_checkpoint_is_one_line(
    capsys: pytest.CaptureFixture[str], broken: dict[str, Path], name: str, message: str, tp: str
) -> None:
    line = _error_line(capsys, ["generate", "--model", str(broken[name]), "--tp", tp])
    assert re.search(message, line), line


OPTIONS = [  # (argv after `generate`, what the error line must say)
    (["--temperature", "nan"], r"temperature must be 0 \(greedy\) or in \[0.001, 100\], got nan"),
    (["--temperature", "inf"], r"temperature must be 0 \(greedy\) or in"),
    (["--temperature", "-1"], r"temperature must be 0 \(greedy\)"),
    (["--top-p", "nan"], r"top_p must be a finite number in \(0, 1\], got NaN"),
    (["--seed", str(2**64)], r"seed must be an integer in \[0, 2\*\*64\)"),
    (["--max-seq-len", "0"], r"--max-seq-len must be an integer >= 1, got 0"),
    (["--max-seq-len", "300"], r"--max-seq-len 300 exceeds the model's 256 positions"),
    (
        ["--prompt", b"ab\xffc".decode("utf-8", "surrogateescape")],
        r"--prompt is not valid UTF-8 text: byte 0xff at character 2",
    ),
    (["--max-new-tokens", "0"], r"--max-new-tokens must be an integer >= 1, got 0"),
]


@pytest.mark.parametrize("tp", ["1", "2"])
@pytest.mark.parametrize(("argv", "message"), OPTIONS, ids=[str(o[0][:2]) for o in OPTIONS])
def test_bad_option_is_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str, tp: str
) -> None:
    line = _error_line(capsys, ["generate", "--tp", tp, *argv])
    assert re.search(message, line), line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["explain", "--world-size", "0"], r"--world-size must be an integer in \[1, 65536\]"),
        (["explain", "--model", "moe", "--ep", "0"], r"--ep must be an integer in \[1, 2\], got 0"),
        (["explain", "--dim", "1000000000"], r"--dim must be an integer in \[1, 16384\]"),
        (["explain", "--tp", "0"], r"--tp must be an integer in \[1, 2\], got 0"),
        (["bench", "--json", "."], r"--json \. is a directory; give a file path"),
        (["bench", "--json", "no/such/dir/f.json"], r"the directory no/such/dir does not exist"),
    ],
)
def test_other_commands_check_their_options_first(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and re.search(message, err), err


def test_token_ids_beyond_the_vocabulary_are_refused_before_loading() -> None:
    from torch_tensorrt_dist.errors import ConfigError
    from torch_tensorrt_dist.families.spec import check_prompt_ids

    check_prompt_ids([[0, 1023]], vocab_size=1024)
    with pytest.raises(ConfigError, match=r"prompt #2 encodes to token id 1024, outside the mod"):
        check_prompt_ids([[5], [0, 1024]], vocab_size=1024)


def _start(argv: list[str]) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen(
        [sys.executable, "-m", "torch_tensorrt_dist", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_real_processes_refuse_in_one_line_within_bounded_memory(broken: dict[str, Path]) -> None:
    """As a user runs it (two commands at once): exit 2, one stderr line, no traceback, and a
    peak memory near an import of torch (the 100000-layer config once grew past 5.8 GB)."""
    runs = {
        "layers": ["generate", "--model", str(broken["layers"]), "--tp", "2"],
        "overlap": ["generate", "--model", str(broken["overlap"]), "--tp", "1"],
    }
    procs = {name: _start(argv) for name, argv in runs.items()}
    peaks = _peak_rss_kib(list(procs.values()))  # the output is one line: no pipe fills up
    for (name, proc), peak in zip(procs.items(), peaks, strict=True):
        err = proc.communicate(timeout=60)[1]
        lines = [line for line in err.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1, (name, err)
        assert lines[0].startswith("error: ") and "Traceback" not in err, (name, err)
        assert re.search(dict((c[0], c[2]) for c in CHECKPOINTS)[name], lines[0]), lines[0]
        assert 0 < peak < 1536 * 1024, f"{name}: peak RSS {peak} KiB"


def _peak_rss_kib(procs: list[subprocess.Popen[str]]) -> list[int]:
    """Each process's own peak resident memory (``VmHWM``, read every 5 ms until it ends). Not
    its ``ru_maxrss``: Linux carries the resident size of the forked copy of this process (an
    xdist worker, 1.6 GB after some tests) into the child's figure across exec."""
    peaks = [0] * len(procs)
    while any(p.poll() is None for p in procs):
        for i, p in enumerate(procs):
            with contextlib.suppress(OSError, ValueError, IndexError):  # ended meanwhile
                status = Path(f"/proc/{p.pid}/status").read_text()
                kib = int(status.split("VmHWM:")[1].split()[0])
                peaks[i] = max(peaks[i], kib)
        time.sleep(0.005)
    return peaks


def test_explain_refuses_a_config_it_cannot_build_in_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """explain builds a checkpoint config's whole model with random weights: a config of
    20,000 layers is refused from its parameter count (its tensors' shapes), before any weight
    is allocated."""
    import torch_tensorrt_dist.cli.explain as explain
    from torch_tensorrt_dist.errors import ConfigError

    free = explain.available_memory()
    assert free is None or free > 0  # MemAvailable on Linux
    ckpt = copy_demo(tmp_path / "huge")
    edit_config(ckpt, num_hidden_layers=20_000)
    monkeypatch.setattr(explain, "available_memory", lambda: 8 * 2**30)
    assert main(["explain", "--model", "llama", "--checkpoint", str(ckpt)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "explain builds its whole model with random float32" in err, err
    assert "more than half of the 8.0 GiB available" in err
    # 2 GiB of weights: refused with 3 GiB left, not with 5 GiB, nor where memory is unknown
    shapes = {"w": (2**29,)}
    monkeypatch.setattr(explain, "available_memory", lambda: 3 * 2**30)
    with pytest.raises(ConfigError, match=r"0\.54B parameters, 2\.0 GiB"):
        explain.check_fits(shapes, "x")
    monkeypatch.setattr(explain, "available_memory", lambda: 5 * 2**30)
    explain.check_fits(shapes, "x")
    monkeypatch.setattr(explain, "available_memory", lambda: None)
    explain.check_fits(shapes, "x")
