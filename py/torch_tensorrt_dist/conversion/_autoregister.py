"""Imported by ``torch_tensorrt_dist/__init__.py``: register with Torch-TensorRT if installed
(a single ``find_spec`` when it is not)."""

from __future__ import annotations

from torch_tensorrt_dist.conversion.registration import register_with_torch_tensorrt

register_with_torch_tensorrt()
