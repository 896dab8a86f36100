"""Memory error counters of the EDAC subsystem (/sys/devices/system/edac/mc), per memory controller and DIMM.

Layout (Linux Documentation/ABI/testing/sysfs-devices-edac; `edac-util -v`, rasdaemon's `ras-mc-ctl
--error-count` read the same files):

    mc/mcN/{ce_count, ue_count}                 errors on the controller since its counters were reset
    mc/mcN/{ce_noinfo_count, ue_noinfo_count}   ... that the driver could not place on a DIMM
    mc/mcN/seconds_since_reset                  the counters were zero that long ago (boot, driver load)
    mc/mcN/{dimm,rank}M/{dimm_ce_count, dimm_ue_count, dimm_label, dimm_location}   (kernels >= 4.10)
    mc/mcN/csrowM/{ce_count, ue_count, chK_ce_count, chK_dimm_label}                (older layout)

A label is whatever the admin (or `edac-ctl --register-labels`) wrote; empty or the driver's default
("CPU_SrcID#0_Ha#0_Chan#0_DIMM#0", "mc#0csrow#0channel#0") otherwise. Each counter is one decimal
integer; a file that is not one raises ParseError naming it.
"""

from __future__ import annotations

from ..core.lazyre import lazy_compile
from ..core.structs import Struct
from .host import Host

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import List, Optional, Tuple

EDAC_MC = "/sys/devices/system/edac/mc"
_MC = lazy_compile(r"^mc[0-9]+$")
_DIMM = lazy_compile(r"^(dimm|rank)[0-9]+$")
_CSROW = lazy_compile(r"^csrow[0-9]+$")
_CHANNEL_CE = lazy_compile(r"^ch([0-9]+)_ce_count$")


class Dimm(Struct):
    key: str  # "mc0/dimm3", "mc1/rank2", "mc0/csrow1/ch0": stable across runs, the history's key
    label: str  # the DIMM's label, or "" (no label file, or empty)
    location: str  # dimm_location ("channel 0 slot 1"), or ""
    ce: Optional[int]  # None: not counted at this level (a csrow's UEs, below)
    ue: Optional[int]  # None: this layout counts UEs per csrow, not per channel


class Controller(Struct):
    name: str  # "mc0"
    ce: int
    ue: int
    ce_noinfo: int
    ue_noinfo: int
    seconds_since_reset: Optional[int]
    dimms: Tuple[Dimm, ...]


def read_edac(host: Host) -> Tuple[Controller, ...]:
    """Every memory controller under EDAC_MC; () when EDAC is not loaded (no such directory)."""
    controllers = []
    for path in host.glob(EDAC_MC, "mc*"):
        name = path.rsplit("/", 1)[1]
        if not _MC.match(name):
            continue
        controllers.append(
            Controller(
                name,
                host.read_int(path + "/ce_count", default=0),
                host.read_int(path + "/ue_count", default=0),
                host.read_int(path + "/ce_noinfo_count", default=0),
                host.read_int(path + "/ue_noinfo_count", default=0),
                host.read_int(path + "/seconds_since_reset", default=None),
                tuple(_dimms(host, path, name)),
            )
        )
    return tuple(controllers)


def _dimms(host: Host, mc_path: str, mc: str) -> List[Dimm]:
    entries = host.listdir(mc_path, default=[])
    dimms = [
        Dimm(
            "%s/%s" % (mc, name),
            _label(host, "%s/%s/dimm_label" % (mc_path, name)),
            host.read_text("%s/%s/dimm_location" % (mc_path, name), default="").strip(),
            host.read_int("%s/%s/dimm_ce_count" % (mc_path, name), default=0),
            host.read_int("%s/%s/dimm_ue_count" % (mc_path, name), default=0),
        )
        for name in entries
        if _DIMM.match(name)
    ]
    if dimms:
        return dimms
    # The csrow layout (drivers not converted to the dimm/rank objects, kernels before 4.10): CEs per
    # channel with the channel's label; UEs only per csrow, which names the labels of its channels.
    for csrow in (n for n in entries if _CSROW.match(n)):
        base = "%s/%s" % (mc_path, csrow)
        channels = sorted(
            int(m.group(1))
            for m in (_CHANNEL_CE.match(f) for f in host.listdir(base, default=[]))
            if m
        )
        labels = []
        for channel in channels:
            label = _label(host, "%s/ch%d_dimm_label" % (base, channel))
            labels.append(label)
            dimms.append(
                Dimm(
                    "%s/%s/ch%d" % (mc, csrow, channel),
                    label,
                    "%s channel %d" % (csrow, channel),
                    host.read_int("%s/ch%d_ce_count" % (base, channel)),
                    None,
                )
            )
        row_ue = host.read_int(base + "/ue_count", default=None)
        if row_ue is not None:
            dimms.append(
                Dimm(
                    "%s/%s" % (mc, csrow), " or ".join(x for x in labels if x), csrow, None, row_ue
                )
            )
    return dimms


def _label(host: Host, path: str) -> str:
    label = host.read_text(path, default="", max_bytes=256)
    return "".join(c for c in label.strip() if c.isprintable())[:64]
