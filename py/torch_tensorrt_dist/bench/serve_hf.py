"""The serving benchmark's baseline: ``transformers serve --continuous-batching``.

    reason = hf_serve_unavailable()                  # "" when it can run here
    with ServerProcess([], command=hf_serve_command(path), ready=HF_READY, env=HF_ENV) as hf:
        ...                                          # hf.url; requests name the model by path

transformers 5 serves a local checkpoint directory given as its ``force_model`` argument
(``ModelLoader`` passes it to ``from_pretrained``) on CPU with ``--device cpu``, and answers
``/v1/completions`` with a text prompt (not token ids), streamed with usage. The command runs its
CLI app in this interpreter (``python -c``): the ``transformers`` script's ``main`` first asks the
Hub for a newer version, which needs the network; ``HF_HUB_OFFLINE`` keeps the rest off it.
uvicorn prints the port it bound for ``--port 0``.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["HF_ENV", "HF_READY", "hf_serve_command", "hf_serve_unavailable"]

#: uvicorn's line once the server listens; group 1 its URL
HF_READY = r"Uvicorn running on (http://[\w.:\[\]]+)"
#: no Hub access (loopback only), no telemetry
HF_ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TRANSFORMERS_OFFLINE": "1"}


def hf_serve_command(path: str | Path) -> list[str]:
    """``transformers serve PATH --continuous-batching`` on CPU, fp32, 127.0.0.1, a free port."""
    return [
        sys.executable,
        "-c",
        "from transformers.cli.transformers import app; app()",
        "serve",
        str(path),
        "--continuous-batching",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]


def hf_serve_unavailable() -> str:
    """Why ``transformers serve`` cannot run here, or "" when it can."""
    try:
        import transformers
        from transformers.utils.import_utils import is_serve_available
    except ImportError as exc:
        return f"transformers is not installed ({exc}); pip install -e '.[dev]'"
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        return f"transformers {transformers.__version__} has no `serve --continuous-batching` CLI"
    if not is_serve_available():
        return "transformers serve needs its serving extras: pip install 'transformers[serving]'"
    return ""
