"""``serve --quantize``: the serving ranks quantize their shard as ``generate`` does, and the
serving core then emits the tokens ``generate --quantize`` prints; bad combinations are
one-line refusals before any rank starts. In process, on the demo checkpoint, no server."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from torch_tensorrt_dist.cli import build_parser, main
from torch_tensorrt_dist.cli._options import run_config
from torch_tensorrt_dist.cli._rank import plan_run
from torch_tensorrt_dist.cli._serve_job import ServeRankJob
from torch_tensorrt_dist.config import ServeJob
from torch_tensorrt_dist.families import Rank
from torch_tensorrt_dist.generation.core import Request
from torch_tensorrt_dist.quantization.modules import WeightOnlyLinear
from torch_tensorrt_dist.quantization.scheme import QuantConfig

PROMPT = "The return statement"


def test_serving_core_on_a_quantized_shard_gives_generates_tokens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--quantize", "int8", "--engine", "none"]
    assert main(["generate", *args, "--max-new-tokens", "12", "--json", "--prompt", PROMPT]) == 0
    [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    want = json.loads(line)["tokens"][0]
    assert len(want) >= 4  # greedy ids of the quantized model (it stops at </s> or 12)

    ns = build_parser().parse_args(["serve", *args, "--max-batch-size", "2"])
    job = ServeRankJob()
    config, spec, plan = plan_run(run_config(ns, ServeJob(port=0)), job)  # as every rank plans
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:  # one rank of one: its shard, quantized (and its stop signals and socket: undone)
        built = job.build(Rank(config, spec, plan))
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(-1)
    built.sock.close()
    gen, tok = built.generator, built.tokenizer
    assert (built.rows, config.quantize) == (2, QuantConfig("int8"))
    quantized = [m for m in gen.runner.model.modules() if isinstance(m, WeightOnlyLinear)]
    assert len(quantized) == 7 * plan.args.n_layers  # q, k, v, o, w1, w2, w3 of every block
    stop = tuple(tok.eos_ids or plan.args.eos_token_ids)
    core = gen.core()
    sched = gen.scheduler(core)
    sched.add(Request(0, tuple(tok.encode(PROMPT)), 12, stop_ids=stop))
    got: list[int] = []
    while not sched.idle():
        for e in core.step(sched.plan()):
            got += e.tokens
    assert got == want


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--quantize", "int4", "--group-size", "32", "--engine", "tensorrt"],
            "--group-size 32 with --engine tensorrt: TensorRT's INT4 block quantization takes "
            "groups of 64 or 128",
        ),
        (["--group-size", "64"], "--group-size needs --quantize int8 or --quantize int4"),
        (  # generate --artifacts and serve --artifacts take what the artifacts hold
            ["--quantize", "int8", "--artifacts", "ARTIFACTS"],
            "--quantize int8: the artifacts were compiled without --quantize (their weights are "
            "fp32); drop --quantize, or recompile",
        ),
    ],
)
def test_serve_refuses_bad_quantize_options_in_one_line(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torch_tensorrt_dist.artifacts.manifest import write_manifest

    from .test_quantization_artifacts import _manifest

    write_manifest(tmp_path, _manifest(None))  # artifacts compiled without --quantize
    extra = [str(tmp_path) if a == "ARTIFACTS" else a for a in extra]
    assert main(["serve", "--port", "0", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
