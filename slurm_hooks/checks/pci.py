"""Gatherer `pci.devices`: the PCI devices in sysfs (`lspci -D -n`), shared by the GPU and topology families."""

from __future__ import annotations

from ..core.structs import Struct
from ..registry import gatherer

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Tuple

PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0302, 0x0300)  # 3D controller (datacenter GPUs), VGA controller


class PciDevice(Struct):
    bdf: str  # 0000:18:00.0
    vendor: int
    device: int
    pci_class: int  # 24-bit class code, e.g. 0x030200

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and (self.pci_class >> 8) in GPU_CLASSES


@gatherer("pci.devices")
def read_pci_devices(ctx) -> Tuple[PciDevice, ...]:
    """/sys/bus/pci/devices/<bdf>/{vendor,device,class}; unreadable entries are skipped (hot-unplug races)."""
    host = ctx.host
    devices = []
    for bdf in host.listdir(PCI_DEVICES, default=[]):
        base = "%s/%s/" % (PCI_DEVICES, bdf)
        vendor = host.read_int(base + "vendor", default=None, base=16)
        if vendor is None:
            continue
        devices.append(
            PciDevice(
                bdf.lower(),
                vendor,
                host.read_int(base + "device", default=0, base=16),
                host.read_int(base + "class", default=0, base=16),
            )
        )
    return tuple(devices)


def normalize_bus_id(bus_id: str) -> str:
    """NVML's '00000000:18:00.0' (8-digit domain, upper case) -> sysfs '0000:18:00.0'.

    The kernel prints the domain with %04x: at least 4 digits, all of them when wider (VMD's
    '10000:01:00.0', Hyper-V guests), so only NVML's zero padding goes, never a digit.
    """
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    try:
        return "%04x:%s" % (int(domain, 16), rest) if rest else bus_id
    except ValueError:
        return bus_id
