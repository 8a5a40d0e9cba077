"""Azure VM sizes used for training: what one node of an AmlCompute cluster brings (vCPUs, RAM, GPUs, InfiniBand).

Figures are Azure's published sizes (learn.microsoft.com/azure/virtual-machines/sizes). A size missing here is
refused rather than guessed: processes per node, /dev/shm and the NCCL settings all follow from these numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.azure.errors import AzureError


@dataclass(frozen=True)
class Sku:
    """One Azure VM size as a training node."""

    name: str
    vcpus: int
    ram_gib: int
    gpus: int = 0
    gpu_model: str = ""
    gpu_mem_gib: int = 0
    infiniband: bool = False
    nccl_topo_file: str = ""  # NCCL topology file Azure's HPC images ship for this size ("" = none needed)

    def describe(self) -> str:
        """``Standard_ND96asr_v4: 96 vCPUs, 900 GiB, 8 x A100 40 GiB, InfiniBand``."""
        gpus = f", {self.gpus} x {self.gpu_model} {self.gpu_mem_gib} GiB" if self.gpus else ", no GPU"
        return f"{self.name}: {self.vcpus} vCPUs, {self.ram_gib} GiB{gpus}{', InfiniBand' if self.infiniband else ''}"


NDV4_TOPO = "/opt/microsoft/ndv4-topo.xml"
NDV5_TOPO = "/opt/microsoft/ndv5-topo.xml"

_SIZES = [
    # NCv3: V100 16 GiB over PCIe; the "r" size adds InfiniBand.
    Sku("Standard_NC6s_v3", 6, 112, 1, "V100", 16),
    Sku("Standard_NC12s_v3", 12, 224, 2, "V100", 16),
    Sku("Standard_NC24s_v3", 24, 448, 4, "V100", 16),
    Sku("Standard_NC24rs_v3", 24, 448, 4, "V100", 16, infiniband=True),
    # NDv2: 8 V100 32 GiB with NVLink, 100 Gb/s EDR InfiniBand.
    Sku("Standard_ND40rs_v2", 40, 672, 8, "V100", 32, infiniband=True),
    # NC A100 v4: A100 80 GiB PCIe, no InfiniBand (scale up inside one node).
    Sku("Standard_NC24ads_A100_v4", 24, 220, 1, "A100", 80),
    Sku("Standard_NC48ads_A100_v4", 48, 440, 2, "A100", 80),
    Sku("Standard_NC96ads_A100_v4", 96, 880, 4, "A100", 80),
    # ND A100 v4: 8 A100 with NVSwitch, 8 x 200 Gb/s HDR InfiniBand.
    Sku("Standard_ND96asr_v4", 96, 900, 8, "A100", 40, infiniband=True, nccl_topo_file=NDV4_TOPO),
    Sku("Standard_ND96amsr_A100_v4", 96, 1900, 8, "A100", 80, infiniband=True, nccl_topo_file=NDV4_TOPO),
    # H100: NC H100 v5 is one H100 NVL (94 GiB); ND H100 v5 is 8 H100 SXM with 8 x 400 Gb/s NDR InfiniBand.
    Sku("Standard_NC40ads_H100_v5", 40, 320, 1, "H100 NVL", 94),
    Sku("Standard_ND96isr_H100_v5", 96, 1900, 8, "H100", 80, infiniband=True, nccl_topo_file=NDV5_TOPO),
    # CPU sizes: data preparation, smoke tests of the job plumbing, the gloo backend.
    Sku("Standard_D4s_v3", 4, 16),
    Sku("Standard_D16s_v3", 16, 64),
    Sku("Standard_DS3_v2", 4, 14),
    Sku("Standard_E16s_v3", 16, 128),
]

SKUS: dict[str, Sku] = {sku.name.lower(): sku for sku in _SIZES}
"""Known sizes by lower-case name (Azure treats VM size names case-insensitively)."""


def get_sku(name: str) -> Sku:
    """The size called ``name`` (any case); an unknown one is an AzureError listing the known sizes."""
    sku = SKUS.get(str(name).strip().lower())
    if sku is None:
        known = ", ".join(s.name for s in _SIZES)
        raise AzureError(f"--sku: {name!r} is not a known VM size; allowed: {known}")
    return sku
