"""The NVIDIA driver against the CUDA that vLLM's torch was built for, checked by
``make setup`` on GPU hosts (``python -m nightshift.engines.driver``).

vllm 0.33 pulls torch 2.14 built for CUDA 13, which needs an R580 or newer driver; many
H100/H200 fleets still run R535-R570, which top out at CUDA 12.x. Without this check the
venv installs cleanly and the first engine start fails deep in the engine core. A host
without ``nvidia-smi`` has nothing to check.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

# The oldest driver branch each CUDA major version runs on (NVIDIA's CUDA release notes,
# minor version compatibility).
DRIVER_FLOOR = {13: 580, 12: 525, 11: 450}


def driver_problem(driver: str, cuda: str | None, cuda_works: bool) -> str | None:
    """Why this venv's torch cannot use the GPU with ``driver``, with the fix; None if it can."""
    if cuda is None:
        return (
            f"this venv's torch has no CUDA (a CPU build, e.g. a .venv made on a CPU host), "
            f"yet the host has NVIDIA driver {driver}: rm -rf .venv && make setup"
        )
    floor = DRIVER_FLOOR.get(int(cuda.split(".")[0]))
    major = int(driver.split(".")[0])
    if floor is not None and major < floor:
        return (
            f"NVIDIA driver {driver} is too old for this venv's torch (built for CUDA {cuda}, "
            f"which needs an R{floor} or newer driver): upgrade the driver, or pin an older "
            "vllm whose torch is built for the CUDA your driver runs"
        )
    if not cuda_works:
        return (
            f"torch (CUDA {cuda}) sees no usable GPU with NVIDIA driver {driver}: check "
            "nvidia-smi and CUDA_VISIBLE_DEVICES, and that the driver loaded"
        )
    return None


def main() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    query = [smi, "--query-gpu=driver_version", "--format=csv,noheader"]
    out = subprocess.run(query, capture_output=True, text=True, timeout=60).stdout.split()
    if not out:
        print("error: nvidia-smi lists no GPU driver: check that it loaded", file=sys.stderr)
        return 1
    import torch

    cuda = torch.version.cuda
    problem = driver_problem(out[0], cuda, bool(cuda) and torch.cuda.is_available())
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    print(f"GPU check: NVIDIA driver {out[0]}, torch built for CUDA {cuda}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
