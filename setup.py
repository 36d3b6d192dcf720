"""Packaging for torch_tensorrt_dist (the package lives under py/)."""

from __future__ import annotations

from pathlib import Path

from setuptools import find_packages, setup

_HERE = Path(__file__).parent
_version: dict[str, str] = {}
exec((_HERE / "py" / "torch_tensorrt_dist" / "_version.py").read_text(), _version)

#: ``torchtrt-dist serve``: the HTTP API, its metrics and chat templates
SERVE = [
    "fastapi>=0.110",
    "pydantic>=2.6",  # the request schema (serving/schema.py); fastapi brings it too
    "uvicorn>=0.29",
    # the HTTP thread's event loop (serving/http.py says why)
    "uvloop>=0.19; sys_platform != 'win32'",
    "prometheus-client>=0.20",
    "jinja2>=3.1.6",
    "llguidance>=1.9,<2",  # structured output (generation/grammar.py): one wheel, no dependencies
]

DEV = [
    *SERVE,
    "openai>=1.30",  # the serve tests talk to the server with the official client
    "openai-agents==0.24.0",  # an agent's two-turn tool loop against the server (tests)
    "httpx>=0.27",
    "pytest>=8",
    "pytest-timeout>=2.3",
    "pytest-xdist>=3.8",  # two workers, files in conftest's order (pyproject.toml's addopts)
    "hypothesis>=6.100",
    "jsonschema>=4.20",  # structured output tests validate what was generated
    "ruff>=0.6",
    "mypy>=1.10",
    "transformers>=5.25,<5.26",  # the transformers family (--model-impl) is tested on 5.25
    "accelerate>=1.0",
]

setup(
    name="torch_tensorrt_dist",
    version=_version["__version__"],
    description="Distributed (tensor / pipeline parallel) LLM inference for Torch-TensorRT",
    long_description=(_HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    python_requires=">=3.10",
    package_dir={"": "py"},
    packages=find_packages("py"),
    package_data={"torch_tensorrt_dist": ["py.typed", "data/*", "data/demo/*", "ops/*.cpp"]},
    install_requires=[
        "torch>=2.14,<2.15",
        "numpy>=1.26",
        "safetensors>=0.4",
        "tokenizers>=0.19",
        "tqdm>=4.66",
    ],
    extras_require={
        "tensorrt": ["torch-tensorrt>=2.14,<2.15"],
        "mpi": ["mpi4py>=3.1"],
        "serve": SERVE,
        # what torchtitan's model and parallelize modules import; torchtitan itself goes in
        # with --no-deps (its own requirements are for training): docs/clients.md
        "torchtitan": ["tyro>=0.9", "spmd_types==0.2.3"],
        # --model-impl transformers (families/transformers.py): the versions its tests ran on
        "transformers": ["transformers>=5.25,<5.26"],
        "dev": DEV,
    },
    entry_points={
        "console_scripts": ["torchtrt-dist=torch_tensorrt_dist.cli:main"],
        # Dynamo loads the backend on first use: importing the package stays cheap
        "torch_dynamo_backends": [
            "torch_tensorrt_dist = torch_tensorrt_dist.backend.backend:torch_tensorrt_dist_backend"
        ],
    },
)
