"""Which CPUs are online and how they group into cores and sockets, as the kernel states it.

Sources (`lscpu`, `lscpu -e`, `lstopo` read the same):
- /sys/devices/system/cpu/{present,online}: offline means *present and not online*. The kernel's
  own `offline` file also lists every possible CPU that is not online, including slots the
  firmware advertises for hot-plug that hold no CPU (VMware guests, many servers, s390 LPARs), so
  it is not used.
- /sys/devices/system/cpu/cpuN/topology/: a core is the set of CPUs in `thread_siblings_list`
  (`core_cpus_list` on newer kernels), a socket the set in `core_siblings_list`
  (`package_cpus_list`), a die `die_cpus_list`. Identity by sibling list, as the kernel, lscpu
  and hwloc do it: (`physical id`, `core id`) is not unique where core ids restart per die or
  cluster (multi-die AMD, 64-core RISC-V), and the package id is -1 on POWER LPARs and s390.

Fallbacks for older kernels and partial captures, each noted in `notes` (the check shows them):
no `online` file -> the cpuN/online flags, else the cpuN directories with a topology, else the
processors of /proc/cpuinfo; no `present` file -> online plus the cpuN directories; no sibling
lists -> /proc/cpuinfo's physical id/core id, else the topology ids, else one core per CPU.
"""

from __future__ import annotations

from ..core.lazyre import lazy_compile
from ..core.structs import Struct
from .host import Host, HostError, ParseError, parse_cpulist, parse_cpumask
from .procfs import parse_cpuinfo_processors, parse_cpuinfo_topology

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Dict, FrozenSet, Iterable, List, Optional, Tuple

CPU_DIR = "/sys/devices/system/cpu"
_CPU_ENTRY = lazy_compile(r"^cpu[0-9]+$")
THREAD_LISTS = (
    "core_cpus_list",
    "thread_siblings_list",
    "thread_siblings",
)  # newest name first, then the mask
PACKAGE_LISTS = ("package_cpus_list", "core_siblings_list", "core_siblings")


class Socket(Struct):
    """One socket (package): its online CPUs and its cores (each a set of online CPUs), in CPU order."""

    name: str  # "socket 0" (the package id) or "socket #2" (the kernel gives no id: -1)
    cpus: FrozenSet[int]
    cores: Tuple[FrozenSet[int], ...]

    @property
    def thread_counts(self) -> Tuple[int, ...]:
        """Distinct threads-per-core values of this socket, ascending ((1, 2) on hybrid CPUs)."""
        return tuple(sorted({len(core) for core in self.cores}))


class CpuLayout(Struct):
    online: FrozenSet[int]
    offline: FrozenSet[int]  # present and not online
    present: FrozenSet[int]
    sockets: Tuple[Socket, ...]  # ordered by their lowest CPU, like hwloc's logical indexes
    source: str  # where cores and sockets came from
    notes: Tuple[str, ...] = ()  # fallbacks used: which files were missing

    @property
    def cores(self) -> List[FrozenSet[int]]:
        """Every core's online CPUs in Slurm's logical core order (socket by socket, `lstopo -l` Core L#)."""
        return [core for socket in self.sockets for core in socket.cores]


def read_cpu_layout(host: Host, cpuinfo: str = "") -> CpuLayout:
    """The CPU layout of the node under `host` (see the module docstring for sources and fallbacks)."""
    notes: List[str] = []
    entries = [
        int(name[3:]) for name in host.listdir(CPU_DIR, default=[]) if _CPU_ENTRY.match(name)
    ]
    online = _online(host, entries, cpuinfo, notes)
    present = _cpulist(host, CPU_DIR + "/present")
    if present is None:
        present = online | frozenset(entries)
        notes.append("%s/present missing: present = online CPUs and the cpuN directories" % CPU_DIR)
    offline = present - online
    sockets, source = _from_sibling_lists(host, online)
    if sockets is None:
        sockets, source = _from_ids(host, online, cpuinfo, notes)
    return CpuLayout(online, offline, present | online, sockets, source, tuple(notes))


def _cpulist(host: Host, path: str) -> Optional[FrozenSet[int]]:
    """A *_list file (or, for a path not ending in _list/online/present, a hex mask file); None if absent."""
    text = host.read_text(path, default=None)
    if text is None:
        return None
    if path.endswith(("_siblings", "_cpus")):
        return parse_cpumask(text, path)
    return parse_cpulist(text, path)


def _online(host: Host, entries: List[int], cpuinfo: str, notes: List[str]) -> FrozenSet[int]:
    online = _cpulist(host, CPU_DIR + "/online")
    if online is not None:
        return online
    flags = {cpu: _flag(host, "%s/cpu%d/online" % (CPU_DIR, cpu)) for cpu in entries}
    if any(flag is not None for flag in flags.values()):
        # cpu0 often has no `online` file: it cannot be taken offline, so it is online
        found = frozenset(
            cpu
            for cpu, flag in flags.items()
            if flag != 0 and (flag == 1 or host.isdir("%s/cpu%d/topology" % (CPU_DIR, cpu)))
        )
        notes.append("%s/online missing: online CPUs from the cpuN/online flags" % CPU_DIR)
        return found
    with_topology = frozenset(
        cpu for cpu in entries if host.isdir("%s/cpu%d/topology" % (CPU_DIR, cpu))
    )
    if with_topology:
        notes.append(
            "%s/online missing: online CPUs are the cpuN directories with a topology" % CPU_DIR
        )
        return with_topology
    processors = frozenset(parse_cpuinfo_processors(cpuinfo))
    if processors:
        notes.append(
            "%s/online and the cpuN topology missing: online CPUs are /proc/cpuinfo's processors"
            % CPU_DIR
        )
        return processors
    raise HostError(
        CPU_DIR + "/online",
        "no such file, and neither cpuN directories nor /proc/cpuinfo name a CPU",
    )


def _flag(host: Host, path: str) -> Optional[int]:
    """A cpuN/online flag; None when absent or unreadable (captures hold empty files they could not read)."""
    try:
        return host.read_int(path, default=None)
    except ParseError:
        return None


def _first_list(host: Host, base: str, names: Iterable[str]) -> Optional[FrozenSet[int]]:
    for name in names:
        found = _cpulist(host, base + name)
        if found is not None:
            return found
    return None


def _from_sibling_lists(
    host: Host, online: FrozenSet[int]
) -> Tuple[Optional[Tuple[Socket, ...]], str]:
    """Cores and sockets keyed by the kernel's sibling lists; None when an online CPU lacks them.

    The lists are symmetric (a CPU's siblings list it back), so each list is read once for all the
    CPUs it names: about one read per core instead of four per CPU (224 CPUs: ~120 reads, not ~900).
    """
    core_of: Dict[int, FrozenSet[int]] = {}
    package_of: Dict[int, FrozenSet[int]] = {}
    die_of: Dict[int, FrozenSet[int]] = {}
    package_id: Dict[FrozenSet[int], int] = {}
    for cpu in sorted(online):
        base = "%s/cpu%d/topology/" % (CPU_DIR, cpu)
        if cpu not in core_of:
            threads = _first_list(host, base, THREAD_LISTS)
            if threads is None:
                return None, ""
            # the kernel's lists may name offline CPUs (s390 keeps them); a CPU always belongs to its own
            core = (threads & online) | {cpu}
            core_of.update((member, core) for member in core if member not in core_of)
        if cpu not in package_of:
            listed = _first_list(host, base, PACKAGE_LISTS)
            if listed is None:
                return None, ""
            package = (listed & online) | {cpu}
            package_of.update((member, package) for member in package if member not in package_of)
            package_id.setdefault(package, host.read_int(base + "physical_package_id", default=-1))
        if cpu not in die_of:
            die = ((_cpulist(host, base + "die_cpus_list") or package_of[cpu]) & online) | {cpu}
            die_of.update((member, die) for member in die if member not in die_of)
    return _group(core_of, package_of, die_of, package_id), "sysfs sibling lists"


def _group(
    core_of: Dict[int, FrozenSet[int]],
    package_of: Dict[int, FrozenSet[int]],
    die_of: Dict[int, FrozenSet[int]],
    package_id: Dict[FrozenSet[int], int],
) -> Tuple[Socket, ...]:
    """Sockets (by lowest CPU), each with its cores ordered by (die's lowest CPU, core's lowest CPU)."""
    packages = sorted(set(package_of.values()), key=min)
    ids = [package_id.get(p, -1) for p in packages]
    usable_ids = all(i >= 0 for i in ids) and len(set(ids)) == len(ids)
    sockets = []
    for index, package in enumerate(packages):
        cores = sorted(
            {core_of[cpu] for cpu in package}, key=lambda core: (min(die_of[min(core)]), min(core))
        )
        name = "socket %d" % ids[index] if usable_ids else "socket #%d" % index
        sockets.append(Socket(name, frozenset().union(*cores), tuple(cores)))
    return tuple(sockets)


def _from_ids(
    host: Host, online: FrozenSet[int], cpuinfo: str, notes: List[str]
) -> Tuple[Tuple[Socket, ...], str]:
    """Older kernels and partial captures: (package id, core id) from /proc/cpuinfo or sysfs, else flat."""
    places = {cpu: place for cpu, place in parse_cpuinfo_topology(cpuinfo).items() if cpu in online}
    source = "/proc/cpuinfo physical id/core id"
    if set(places) != set(online):
        places, source = {}, "sysfs physical_package_id/core_id"
        for cpu in sorted(online):
            base = "%s/cpu%d/topology/" % (CPU_DIR, cpu)
            try:
                package, core = (
                    host.read_int(base + "physical_package_id"),
                    host.read_int(base + "core_id"),
                )
            except (HostError, ParseError):
                places = {}
                break
            places[cpu] = (package, core)
    if not places:
        notes.append(
            "no sibling lists or package/core ids for every online CPU: each CPU counted as a core "
            "of one socket"
        )
        places, source = {cpu: (0, cpu) for cpu in online}, "none (one core per CPU)"
    else:
        notes.append(
            "sysfs sibling lists missing: cores and sockets from %s (not unique on multi-die CPUs)"
            % source
        )
    by_core: Dict[Tuple[int, int], set] = {}
    for cpu, key in places.items():
        by_core.setdefault(key, set()).add(cpu)
    core_of = {cpu: frozenset(cpus) for cpus in by_core.values() for cpu in cpus}
    by_package: Dict[int, set] = {}
    for cpu, (package, _core) in places.items():
        by_package.setdefault(package, set()).add(cpu)
    package_of = {cpu: frozenset(cpus) for cpus in by_package.values() for cpu in cpus}
    package_id = {frozenset(cpus): package for package, cpus in by_package.items()}
    return _group(core_of, package_of, package_of, package_id), source
