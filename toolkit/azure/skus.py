"""Azure VM sizes used for training and serving: what one node of an AmlCompute cluster (or one instance of a
managed online deployment) brings (vCPUs, RAM, GPUs, InfiniBand), and whether managed online endpoints offer it.

Figures are Azure's published sizes (learn.microsoft.com/azure/virtual-machines/sizes). A size missing here is
refused rather than guessed: processes per node, /dev/shm and the NCCL settings all follow from these numbers.
``online`` follows Azure's "Managed online endpoints SKU list" (learn.microsoft.com/azure/machine-learning/
reference-managed-online-endpoints-vm-sku-list): a size that is not on it cannot host a deployment.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.azure.errors import AzureError
from toolkit.errors import not_allowed


@dataclass(frozen=True)
class Sku:
    """One Azure VM size as a training node or a serving instance."""

    name: str
    vcpus: int
    ram_gib: int
    gpus: int = 0
    gpu_model: str = ""
    gpu_mem_gib: int = 0
    infiniband: bool = False
    nccl_topo_file: str = ""  # NCCL topology file Azure's HPC images ship for this size ("" = none needed)
    online: bool = False  # on the managed online endpoints SKU list (can host a ManagedOnlineDeployment)

    def describe(self) -> str:
        """``Standard_ND96asr_v4: 96 vCPUs, 900 GiB, 8 x A100 40 GiB, InfiniBand``."""
        gpus = f", {self.gpus} x {self.gpu_model} {self.gpu_mem_gib} GiB" if self.gpus else ", no GPU"
        return f"{self.name}: {self.vcpus} vCPUs, {self.ram_gib} GiB{gpus}{', InfiniBand' if self.infiniband else ''}"


NDV4_TOPO = "/opt/microsoft/ndv4-topo.xml"
NDV5_TOPO = "/opt/microsoft/ndv5-topo.xml"

_SIZES = [
    # NCv3: V100 16 GiB over PCIe; the "r" size adds InfiniBand.
    Sku("Standard_NC6s_v3", 6, 112, 1, "V100", 16, online=True),
    Sku("Standard_NC12s_v3", 12, 224, 2, "V100", 16, online=True),
    Sku("Standard_NC24s_v3", 24, 448, 4, "V100", 16, online=True),
    Sku("Standard_NC24rs_v3", 24, 448, 4, "V100", 16, infiniband=True),
    # NDv2: 8 V100 32 GiB with NVLink, 100 Gb/s EDR InfiniBand.
    Sku("Standard_ND40rs_v2", 40, 672, 8, "V100", 32, infiniband=True, online=True),
    # NC A100 v4: A100 80 GiB PCIe, no InfiniBand (scale up inside one node).
    Sku("Standard_NC24ads_A100_v4", 24, 220, 1, "A100", 80, online=True),
    Sku("Standard_NC48ads_A100_v4", 48, 440, 2, "A100", 80, online=True),
    Sku("Standard_NC96ads_A100_v4", 96, 880, 4, "A100", 80, online=True),
    # ND A100 v4: 8 A100 with NVSwitch, 8 x 200 Gb/s HDR InfiniBand.
    Sku("Standard_ND96asr_v4", 96, 900, 8, "A100", 40, infiniband=True, nccl_topo_file=NDV4_TOPO, online=True),
    Sku("Standard_ND96amsr_A100_v4", 96, 1900, 8, "A100", 80, infiniband=True, nccl_topo_file=NDV4_TOPO, online=True),
    # H100: NC H100 v5 is one or two H100 NVL (94 GiB); ND H100 v5 is 8 H100 SXM with 8 x 400 Gb/s NDR InfiniBand.
    Sku("Standard_NC40ads_H100_v5", 40, 320, 1, "H100 NVL", 94, online=True),
    Sku("Standard_NC80adis_H100_v5", 80, 640, 2, "H100 NVL", 94, online=True),
    Sku("Standard_ND96isr_H100_v5", 96, 1900, 8, "H100", 80, infiniband=True, nccl_topo_file=NDV5_TOPO, online=True),
    # NCasT4_v3: one to four T4 16 GiB, the small GPU sizes for serving.
    Sku("Standard_NC4as_T4_v3", 4, 28, 1, "T4", 16, online=True),
    Sku("Standard_NC8as_T4_v3", 8, 56, 1, "T4", 16, online=True),
    Sku("Standard_NC16as_T4_v3", 16, 110, 1, "T4", 16, online=True),
    Sku("Standard_NC64as_T4_v3", 64, 440, 4, "T4", 16, online=True),
    # CPU sizes: data preparation, smoke tests of the job plumbing, the gloo backend (Dsv3 cannot serve).
    Sku("Standard_D4s_v3", 4, 16),
    Sku("Standard_D16s_v3", 16, 64),
    Sku("Standard_DS3_v2", 4, 14, online=True),
    Sku("Standard_E16s_v3", 16, 128, online=True),
    # CPU sizes for managed online endpoints (general purpose, compute optimised, memory optimised). Azure lists
    # DS1_v2 too but warns it is too small for most models (1 vCPU, 3.5 GiB); it is left out.
    Sku("Standard_DS2_v2", 2, 7, online=True),
    Sku("Standard_DS4_v2", 8, 28, online=True),
    Sku("Standard_DS5_v2", 16, 56, online=True),
    Sku("Standard_D2as_v4", 2, 8, online=True),
    Sku("Standard_D4as_v4", 4, 16, online=True),
    Sku("Standard_D8as_v4", 8, 32, online=True),
    Sku("Standard_D16as_v4", 16, 64, online=True),
    Sku("Standard_F2s_v2", 2, 4, online=True),
    Sku("Standard_F4s_v2", 4, 8, online=True),
    Sku("Standard_F8s_v2", 8, 16, online=True),
    Sku("Standard_F16s_v2", 16, 32, online=True),
    Sku("Standard_E2s_v3", 2, 16, online=True),
    Sku("Standard_E4s_v3", 4, 32, online=True),
    Sku("Standard_E8s_v3", 8, 64, online=True),
]

SKUS: dict[str, Sku] = {sku.name.lower(): sku for sku in _SIZES}
"""Known sizes by lower-case name (Azure treats VM size names case-insensitively)."""


def get_sku(name: str) -> Sku:
    """The size called ``name`` (any case); an unknown one is an AzureError listing the known sizes."""
    sku = SKUS.get(str(name).strip().lower())
    if sku is None:
        known = ", ".join(s.name for s in _SIZES)
        raise AzureError(not_allowed("--sku", name, known, problem="is not a known VM size"))
    return sku


def get_online_sku(name: str) -> Sku:
    """The size called ``name`` if managed online endpoints offer it; an unknown size or one they do not offer
    is an AzureError listing the sizes that can host a deployment."""
    sku = get_sku(name)
    if not sku.online:
        allowed = ", ".join(s.name for s in _SIZES if s.online)
        raise AzureError(not_allowed("--sku", sku.name, allowed, problem="is not allowed for managed online endpoints"))
    return sku
