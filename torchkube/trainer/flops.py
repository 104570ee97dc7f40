"""The dense peak FLOP/s of one device, what MFU is measured against. No torch here."""

import os
from typing import Literal

from torchkube.api.contract import Env

MatmulPrecision = Literal["bf16", "tf32", "fp32"]

# Dense peak FLOP/s of one device per matmul precision: bf16 and TF32 on the tensor (matrix)
# cores — half the datasheets' "with sparsity" figures — and fp32 without TF32. Vendor
# datasheets, cited in docs/trainer.md (MFU). Matched as substrings of
# torch.cuda.get_device_name(), most specific first.
PEAK_FLOPS: list[tuple[str, dict[MatmulPrecision, float]]] = [
    ("H100 NVL", {"bf16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    ("H100 PCIe", {"bf16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    ("H200 NVL", {"bf16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12}),
    ("H200", {"bf16": 989e12, "tf32": 494.5e12, "fp32": 67e12}),  # SXM
    ("H100", {"bf16": 989e12, "tf32": 494.5e12, "fp32": 67e12}),  # SXM: "NVIDIA H100 80GB HBM3"
    ("B200", {"bf16": 2250e12, "tf32": 1100e12, "fp32": 75e12}),  # HGX B200, 1,000 W
    ("MI300X", {"bf16": 1307.4e12, "tf32": 653.7e12, "fp32": 163.4e12}),
    ("A100", {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
]


def peak_flops(device_name: str, precision: MatmulPrecision) -> float | None:
    """Peak FLOP/s of one device at the precision its matmuls run in, ``TORCHKUBE_PEAK_FLOPS``
    first; None when unknown (CPU), so that no made-up MFU is reported."""
    if os.environ.get(Env.PEAK_FLOPS):
        return float(os.environ[Env.PEAK_FLOPS])
    for pattern, peaks in PEAK_FLOPS:
        if pattern in device_name:
            return peaks[precision]
    return None
