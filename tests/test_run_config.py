"""The run configuration: sizes as users write them, the KV-cache options' bounds, the command
line read into one picklable config, and what every command refuses alike (one line, exit 2,
before any rank starts)."""

from __future__ import annotations

import pickle

import pytest

from torch_tensorrt_dist.cli import build_parser, main
from torch_tensorrt_dist.cli._options import run_config
from torch_tensorrt_dist.config import (
    CacheOptions,
    GenerateJob,
    ModelOptions,
    Parallel,
    RunConfig,
    ServeJob,
)
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.families import DenseSpec, PipelineSpec, checkpoint_spec
from torch_tensorrt_dist.quantization.scheme import QuantConfig
from torch_tensorrt_dist.validation import parse_size

FORMS = (
    "give bytes as an integer (1073741824) or a number with a unit: KiB, MiB, GiB, TiB (powers "
    "of 1024) or KB, MB, GB, TB (powers of 1000), in any case, e.g. 4GiB or 1.5gb"
)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1073741824", 2**30),
        ("100b", 100),
        ("100B", 100),
        ("4KiB", 4 * 2**10),
        ("4MiB", 4 * 2**20),
        ("4GiB", 4 * 2**30),
        ("2TiB", 2 * 2**40),
        ("4gib", 4 * 2**30),
        ("4GIB", 4 * 2**30),
        ("3KB", 3000),
        ("3MB", 3 * 10**6),
        ("1.5GB", 1_500_000_000),
        ("2tb", 2 * 10**12),
        (" 512 MiB ", 512 * 2**20),  # spaces around and between
        ("0.5KiB", 512),
        ("1.0001KB", 1000),  # a fraction of a byte is rounded down
        ("+8kb", 8000),
    ],
)
def test_sizes_as_users_write_them(text: str, size: int) -> None:
    assert parse_size(text, name="--kv-cache-memory") == size


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("4G", "is not a size"),  # one letter: 2**30 to some, 10**9 to others
        ("4 Gi", "is not a size"),
        ("4GiBs", "is not a size"),
        ("1e9", "is not a size"),
        ("4,5GB", "is not a size"),
        ("GiB", "is not a size"),
        ("", "is not a size"),
        ("0", "is not above 0 bytes"),
        ("0GiB", "is not above 0 bytes"),
        ("-1GiB", "is not above 0 bytes"),
        ("0.1B", "is not above 0 bytes"),
    ],
)
def test_sizes_refused_name_the_flag_and_the_forms(text: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(text, name="--kv-cache-memory")
    if why == "is not a size":
        assert str(info.value) == f"--kv-cache-memory {text!r} is not a size: {FORMS}"
    else:
        assert str(info.value) == (
            f"--kv-cache-memory {text!r} is not above 0 bytes: give a positive size, e.g. 4GiB"
        )


def test_kv_cache_bounds() -> None:
    for size in (1, 2, 16, 256):
        assert CacheOptions(block_size=size, max_prefill_tokens=256).block_size == size
    for size in (0, 3, 24, 512):
        with pytest.raises(ConfigError) as info:
            CacheOptions(block_size=size)
        assert str(info.value) == (
            f"--block-size {size} is not a power of two in [1, 256]: give one of 1, 2, 4, 8, "
            "16, 32, 64, 128, 256 (default 16)"
        )
    with pytest.raises(ConfigError) as info:
        CacheOptions(max_prefill_tokens=8)
    assert str(info.value) == (
        "--max-prefill-tokens 8 is below --block-size 16: a step must be able to prefill a "
        "whole block; give at least 16"
    )
    with pytest.raises(ConfigError, match=r"^--max-prefill-tokens must be an integer >= 1, got 0"):
        CacheOptions(max_prefill_tokens=0)
    with pytest.raises(ConfigError, match=r"^--kv-cache-memory must be an integer >= 1, got 0"):
        CacheOptions(kv_cache_memory=0)
    defaults = CacheOptions()
    # unset means the default, or the value an artifact was compiled with
    assert (defaults.block_size, defaults.max_prefill_tokens) == (None, None)
    assert (defaults.block, defaults.prefill_budget, defaults.prefix_caching) == (16, 512, True)


def test_the_command_line_becomes_one_picklable_config() -> None:
    argv = ["generate", "--tp", "2", "--kv-cache-memory", "1.5GiB", "--block-size", "32"]
    argv += ["--max-prefill-tokens", "64", "--no-prefix-caching", "--threads", "3"]
    argv += ["--quantize", "int4", "--group-size", "64", "--max-seq-len", "128", "--prompt", "x"]
    ns = build_parser().parse_args(argv)
    config = run_config(ns, GenerateJob(("x",)))
    assert config.parallel == Parallel(tp=2)
    assert config.cache == CacheOptions(
        max_seq_len=128,
        kv_cache_memory=3 * 2**29,
        block_size=32,
        max_prefill_tokens=64,
        prefix_caching=False,
    )
    assert (config.threads, config.quantize) == (3, QuantConfig("int4", 64))
    assert pickle.loads(pickle.dumps(config)) == config  # what the launcher sends each rank
    assert config.model == ModelOptions()  # the demo checkpoint, fp32, vocabulary-parallel


def test_serve_defaults_to_the_fastest_engine_that_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve``: TensorRT where it loads, else Inductor (never the eager reference);
    ``generate`` keeps eager (a one-shot run spends more on compiling than it gains)."""
    from torch_tensorrt_dist.config import ServeJob
    from torch_tensorrt_dist.conversion import availability

    def serve_engine() -> str:
        ns = build_parser().parse_args(["serve", "--tp", "1"])
        assert ns.engine == "auto"
        return run_config(ns, ServeJob()).engine

    missing = availability.tensorrt_engine_missing(isolated=True)
    assert serve_engine() == ("tensorrt" if missing is None else "inductor")
    monkeypatch.setattr(availability, "tensorrt_engine_missing", lambda isolated: None)
    assert serve_engine() == "tensorrt"
    monkeypatch.setattr(availability, "tensorrt_engine_missing", lambda isolated: "absent")
    assert serve_engine() == "inductor"
    ns = build_parser().parse_args(["serve", "--engine", "eager"])
    assert run_config(ns, ServeJob()).engine == "eager"
    assert build_parser().parse_args(["generate"]).engine == "eager"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--engine", "auto"])


def test_the_config_refuses_what_does_not_fit_together() -> None:
    with pytest.raises(ConfigError, match="command 'serve' does not run a GenerateJob"):
        RunConfig("serve", ModelOptions(), Parallel(tp=1), GenerateJob())
    with pytest.raises(ConfigError, match="--verify checks a compiled engine"):
        RunConfig("serve", ModelOptions(), Parallel(tp=1), ServeJob(), engine="none", verify=True)
    with pytest.raises(ConfigError, match="--artifacts replaces --model"):
        ModelOptions(model="tiny", artifacts="DIR")
    with pytest.raises(ConfigError, match=r"--tp, --pp and --ep must be >= 1, got tp=1 pp=0"):
        Parallel(tp=1, pp=0)


def test_the_family_follows_the_model_and_the_layout() -> None:
    def spec(**parallel: int) -> object:
        model = ModelOptions(model="tiny")
        return checkpoint_spec(RunConfig("generate", model, Parallel(**parallel), GenerateJob()))

    assert type(spec(tp=2)) is DenseSpec
    assert type(spec(tp=1, pp=2)) is PipelineSpec
    with pytest.raises(ConfigError, match="--ep 2 needs a mixture-of-experts checkpoint"):
        spec(tp=1, ep=2)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["generate", "--kv-cache-memory", "12XB"],
            f"error: --kv-cache-memory '12XB' is not a size: {FORMS}",
        ),
        (["serve", "--kv-cache-memory", "0"], "error: --kv-cache-memory '0' is not above 0 bytes"),
        (["eval", "--perplexity", "demo", "--block-size", "3"], "error: --block-size 3 is not a"),
        (["serve", "--max-prefill-tokens", "8"], "error: --max-prefill-tokens 8 is below --bloc"),
        (  # serve clamped it to the model's positions before
            ["serve", "--max-seq-len", "300"],
            "error: --max-seq-len 300 exceeds the model's 256 positions (max_position_embeddings)",
        ),
        (["compile", "--max-seq-len", "300", "--out", "OUT"], "error: --max-seq-len 300 exceeds"),
        (["generate", "--threads", "0"], "error: --threads must be an integer >= 1, got 0"),
    ],
)
def test_every_command_refuses_bad_options_in_one_line(
    argv: list[str], message: str, tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(tmp_path) if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1, err


def test_a_malformed_omp_num_threads_is_refused_before_any_rank(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "four")
    assert main(["generate", "--tp", "2", "--engine", "none"]) == 2
    assert capsys.readouterr().err.startswith("error: OMP_NUM_THREADS='four' is not a thread")
