"""A real ``torchtrt-dist serve`` process for the serving tests: started on a free port of
127.0.0.1, waited for, always stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from torch_tensorrt_dist.bench.serve_load import ServerProcess
from torch_tensorrt_dist.errors import ConfigError

CHAT_TEMPLATE = (
    "{% for m in messages %}{% if loop.first %}{{ bos_token }}{% endif %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] | trim }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def demo_with_chat_template(dest: Path, template: str = CHAT_TEMPLATE) -> Path:
    """A copy of the demo checkpoint whose tokenizer_config.json has a chat template."""
    import json
    import shutil

    from torch_tensorrt_dist.models.demo import demo_checkpoint_path

    src = demo_checkpoint_path()
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(src / name, dest / name)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dest


def demo_with_layers(dest: Path, layers: int) -> Path:
    """A copy of the demo checkpoint cut to its first ``layers`` layers (the same tokenizer,
    embeddings, norm and head): a model that compiles and loads faster where its text does not
    matter."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from torch_tensorrt_dist.models.demo import demo_checkpoint_path

    src = demo_checkpoint_path()
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dest / name)
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (dest / "config.json").write_text(json.dumps(cfg))
    weights = load_file(src / "model.safetensors")
    kept = {
        k: v
        for k, v in weights.items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers
    }
    save_file(kept, dest / "model.safetensors")
    return dest


#: the serve bench's child-process server: start, read its output, health, stop, kill
Server = ServerProcess


def start_server(
    args: list[str], *, timeout: float = 240, env: dict[str, str] | None = None
) -> Server:
    """``torchtrt-dist serve ARGS --port 0`` (``env``: more environment variables); returns
    once it printed its URL."""
    try:
        return Server(args, start_timeout_s=timeout, env=env).start()
    except ConfigError as exc:
        pytest.fail(str(exc))


def demo_tp2_server(
    ckpt: Path, *, rows: int, max_seq_len: int, max_queue: int | None = None, key: str = ""
) -> Server:
    """The serving tests' server: ``ckpt`` served as "demo" at TP 2 without compiling (the
    eager graphs), ``rows`` decoded together, an API key where ``key`` is given."""
    args = ["--model", str(ckpt), "--served-model-name", "demo", "--tp", "2", "--engine", "none"]
    args += ["--max-batch-size", str(rows), "--max-seq-len", str(max_seq_len)]
    if max_queue is not None:
        args += ["--max-queue", str(max_queue)]
    if key:
        args += ["--api-key", key]
    return start_server(args)
