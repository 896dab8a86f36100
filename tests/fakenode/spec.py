"""Node spec: load a TOML description of one fake node, validate it, fill in defaults.

A spec is a small TOML file (see README.md for every key).  ``load_spec`` returns a *resolved* spec:
a plain dict with every default filled in and every derived value (UUIDs, NUMA of devices, CPU lists)
computed, so the sysfs builder and the fake-NVML state writer read the same numbers.

Collections (``gpu``, ``switch``, ``nic``, ``nvme``, ``numa``) may be written either as tables keyed by
id (``[gpu.3]``) or as arrays of tables (``[[gpu]]`` with ``index = 3``); both normalise to a dict keyed
by id, which is also the shape overlays use: ``{"gpu": {3: {"remapped_rows": {"pending": True}}}}``.
"""

from __future__ import annotations

import copy
import hashlib
import marshal
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from . import defaults as D

SPEC_DIR = Path(__file__).resolve().parent / "specs"

# collection name -> (id field in array-of-tables form, id type)
COLLECTIONS = {
    "gpu": ("index", int),
    "switch": ("name", str),
    "nic": ("name", str),
    "nvme": ("name", str),
    "numa": ("id", int),
    "job": ("id", str),
}


class SpecError(ValueError):
    """A spec problem; the message names the file and the dotted key."""


def _toml_loads(text: str) -> Dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib  # novermin (guarded by the version check above)

        return tomllib.loads(text)
    import toml  # python < 3.11: the 'toml' package (a declared dependency there)

    return toml.loads(text)


def find_spec(name_or_path: Union[str, Path]) -> Path:
    """A shipped spec name ('dgx-h100') or a path to a .toml file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if not p.is_file():
            raise SpecError("%s: spec file not found" % p)
        return p
    cand = SPEC_DIR / (str(name_or_path) + ".toml")
    if not cand.is_file():
        names = sorted(x.stem for x in SPEC_DIR.glob("*.toml"))
        raise SpecError("%s: no such spec (shipped specs: %s)" % (name_or_path, ", ".join(names)))
    return cand


def load_spec(
    name_or_path: Union[str, Path, Dict[str, Any]] = "dgx-h100",
    overrides: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Load, overlay, validate and resolve a spec.

    ``name_or_path``: shipped spec name, path to a TOML file, or an already parsed dict.
    ``overrides``: dict deep-merged on top before validation, e.g.
    ``{"gpu": {3: {"ecc": {"volatile": {"uncorrected": {"dram": 2}}}}}}``.
    """
    text = None
    if isinstance(name_or_path, dict):
        source, raw = "<dict>", copy.deepcopy(name_or_path)
    else:
        path = find_spec(name_or_path)
        source = str(path)
        text = path.read_text()
        cache_key = _resolved_key(source, text, overrides)
        if cache_key in _resolved:
            return marshal.loads(_resolved[cache_key])
        try:
            raw = _toml_loads(text)
        except Exception as exc:  # tomllib.TOMLDecodeError / toml.TomlDecodeError
            raise SpecError("%s: invalid TOML: %s" % (source, exc)) from None
    spec = _load(raw, source, overrides)
    if text is not None:
        _remember_resolved(_resolved_key(source, text, overrides), spec)
    return spec


# resolved specs of files by (path, text, overrides), marshalled: the suite resolves the same few
# specs ~300 times a run (~6 ms each for a DGX); each caller gets its own copy
_resolved: Dict[Optional[str], bytes] = {}
_PLAIN = (str, int, float, bool, type(None))


def _plain(value: Any) -> bool:
    """Whether repr(value) says all there is to it (what a cache key may hold)."""
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN)


def _resolved_key(source: str, text: str, overrides: Optional[Dict[str, Any]]) -> Optional[str]:
    if overrides is not None and not _plain(overrides):
        return None
    return hashlib.sha256(repr((source, text, overrides)).encode()).hexdigest()


def _remember_resolved(cache_key: Optional[str], spec: Dict[str, Any]) -> None:
    if cache_key is None:
        return
    try:
        _resolved[cache_key] = marshal.dumps(spec)
    except ValueError:  # something marshal cannot copy: resolve it again next time
        return
    if len(_resolved) > 256:
        _resolved.pop(next(iter(_resolved)))


def _load(raw: Dict[str, Any], source: str, overrides: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    raw = normalize(raw, source)
    if overrides:
        raw = deep_merge(raw, normalize(copy.deepcopy(overrides), source + " (overrides)"))
        source += " + overrides"
    spec = resolve(raw, source)
    spec["_source"] = source
    return spec


def normalize(raw: Dict[str, Any], source: str) -> Dict[str, Any]:
    """Turn array-of-tables collections into dicts keyed by id; int-ify numeric keys."""
    if not isinstance(raw, dict):
        raise SpecError("%s: spec must be a table, got %s" % (source, type(raw).__name__))
    for coll, (idfield, idtype) in COLLECTIONS.items():
        if coll not in raw:
            continue
        val = raw[coll]
        if isinstance(val, list):
            out = {}
            for n, item in enumerate(val):
                if not isinstance(item, dict) or idfield not in item:
                    raise SpecError(
                        "%s: %s[%d]: array entries need an '%s' key" % (source, coll, n, idfield)
                    )
                item = dict(item)
                out[_key(item.pop(idfield), idtype, source, coll)] = item
            raw[coll] = out
        elif isinstance(val, dict):
            raw[coll] = {_key(k, idtype, source, coll): v for k, v in val.items()}
        else:
            raise SpecError("%s: %s: expected a table or array of tables" % (source, coll))
    return raw


def _key(k: Any, idtype: type, source: str, where: str) -> Any:
    try:
        return idtype(k)
    except (TypeError, ValueError):
        raise SpecError(
            "%s: %s: bad id %r (expected %s)" % (source, where, k, idtype.__name__)
        ) from None


def deep_merge(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    """Recursive dict merge; ``over`` wins; lists and scalars are replaced, not merged."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def check(value: Any, schema: Any, where: str, source: str) -> Any:
    """Validate ``value`` against ``schema`` (a defaults tree) and return the merged result.

    Schema leaves are example defaults whose type is enforced; ``D.OPEN`` marks a free-form table,
    ``D.Open(x)`` a table whose values all follow schema ``x``; ``None`` accepts anything.
    """
    if isinstance(schema, D.Open):
        if not isinstance(value, dict):
            raise SpecError("%s: %s: expected a table" % (source, where))
        return {k: check(v, schema.item, "%s.%s" % (where, k), source) for k, v in value.items()}
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise SpecError("%s: %s: expected a table, got %r" % (source, where, value))
        unknown = sorted(set(value) - set(schema))
        if unknown:
            raise SpecError(
                "%s: %s.%s: unknown key (known: %s)"
                % (source, where, unknown[0], ", ".join(sorted(map(str, schema))))
            )
        out = {k: materialize(v) for k, v in schema.items()}
        for k, v in value.items():
            out[k] = check(v, schema[k], "%s.%s" % (where, k), source)
        return out
    if schema is None or value is None:
        return value
    want = type(schema)
    ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise SpecError(
            "%s: %s: expected %s, got %s %r"
            % (source, where, want.__name__, type(value).__name__, value)
        )
    return value


def materialize(schema: Any) -> Any:
    """Defaults as plain data: open tables become {}."""
    if isinstance(schema, D.Open):
        return {}
    if isinstance(schema, dict):
        return {k: materialize(v) for k, v in schema.items()}
    return copy.deepcopy(schema)


# ---------------------------------------------------------------- resolution


def resolve(raw: Dict[str, Any], source: str) -> Dict[str, Any]:
    unknown = sorted(set(raw) - set(D.TOP_LEVEL))
    if unknown:
        raise SpecError(
            "%s: %s: unknown top-level key (known: %s)"
            % (source, unknown[0], ", ".join(D.TOP_LEVEL))
        )
    s: Dict[str, Any] = {}
    for sect in ("node", "cpu", "memory", "pcie", "iommu", "nvml", "memory_peers"):
        s[sect] = check(raw.get(sect, {}), getattr(D, sect.upper()), sect, source)
    s["modules"] = _modules(raw.get("modules", {}), source)
    s["swap"] = [
        check(x, D.SWAP, "swap[%d]" % i, source) for i, x in enumerate(_list(raw, "swap", source))
    ]
    s["mounts"] = [
        _mount(x, i, source) for i, x in enumerate(_list(raw, "mounts", source, D.MOUNTS))
    ]
    s["kmsg"] = [_kmsg(x, i, source) for i, x in enumerate(_list(raw, "kmsg", source))]
    _resolve_cpu_numa(s, raw.get("numa", {}), source)
    switch_defaults = raw.get("switch_defaults", {})
    check(switch_defaults, D.SWITCH, "switch_defaults", source)
    s["switch"] = {
        k: check(deep_merge(switch_defaults, v), D.SWITCH, "switch.%s" % k, source)
        for k, v in raw.get("switch", {}).items()
    }
    _resolve_switches(s, source)
    gpu_defaults = check(raw.get("gpu_defaults", {}), D.GPU, "gpu_defaults", source)
    s["gpu"] = {}
    for idx in sorted(raw.get("gpu", {})):
        g = check(deep_merge(gpu_defaults, raw["gpu"][idx]), D.GPU, "gpu.%d" % idx, source)
        s["gpu"][idx] = _resolve_gpu(s, idx, g, source)
    if list(s["gpu"]) != list(range(len(s["gpu"]))):
        raise SpecError(
            "%s: gpu: indices must be 0..N-1 without gaps, got %s" % (source, list(s["gpu"]))
        )
    for i, m in enumerate(s["kmsg"]):
        if m["xid"] > 0 and m["gpu"] not in s["gpu"]:
            raise SpecError("%s: kmsg[%d]: gpu %d is not one of the GPUs" % (source, i, m["gpu"]))
    s["nic"] = {
        k: _resolve_nic(s, k, check(v, D.NIC, "nic.%s" % k, source), source)
        for k, v in sorted(raw.get("nic", {}).items())
    }
    s["nvme"] = {
        k: _resolve_dev(s, "nvme.%s" % k, check(v, D.NVME, "nvme.%s" % k, source), source)
        for k, v in sorted(raw.get("nvme", {}).items())
    }
    _resolve_node(s, source)
    _unique_bdfs(s, source)
    _check_pci_tree(s, source)
    _resolve_slurm_side(s, raw, source)
    return s


def _resolve_switches(s: Dict[str, Any], source: str) -> None:
    """PCIe switches and bridges: below a CPU root port, or nested below another switch or bridge (``parent``).

    A nested one inherits its parent's NUMA node unless it sets its own, and its ``root_port`` is
    the CPU root port at the top of its chain.
    """
    switches = s["switch"]
    for name, sw in switches.items():
        where = "switch.%s" % name
        if sw["kind"] not in ("switch", "bridge"):
            raise SpecError(
                "%s: %s.kind: %r not one of switch, bridge" % (source, where, sw["kind"])
            )
        _require(sw, ("upstream",), where, source)
        sw["upstream"] = _bdf(sw["upstream"], where + ".upstream", source)
        if bool(sw["root_port"]) == bool(sw["parent"]):
            raise SpecError(
                "%s: %s: give either root_port (below a CPU root port) or parent (below another switch "
                "or bridge)" % (source, where)
            )
        if sw["root_port"]:
            sw["root_port"] = _bdf(sw["root_port"], where + ".root_port", source)
        elif sw["parent"] not in switches:
            raise SpecError(
                "%s: %s.parent: unknown switch %r (have %s)"
                % (source, where, sw["parent"], sorted(switches))
            )
    for name in sorted(switches):
        chain, cur = [name], name
        while switches[cur]["parent"]:
            cur = switches[cur]["parent"]
            if cur in chain:
                raise SpecError(
                    "%s: switch.%s.parent: the switches %s form a loop"
                    % (source, name, " -> ".join(chain))
                )
            chain.append(cur)
        top = switches[chain[-1]]
        sw = switches[name]
        sw["root_port"] = top["root_port"]
        numa = next(
            (switches[c]["numa_node"] for c in chain if switches[c]["numa_node"] is not None), 0
        )
        sw["resolved_numa"] = numa
    for name, sw in switches.items():
        if sw["numa_node"] is None:
            sw["numa_node"] = sw.pop("resolved_numa")
        else:
            sw.pop("resolved_numa")
        _numa_ok(s, sw["numa_node"], "switch.%s.numa_node" % name, source)
        sw["cpulist"] = (
            s["numa"][sw["numa_node"]]["cpulist"]
            if sw["numa_node"] >= 0
            else format_cpulist(list(range(s["cpu"]["count"])))
        )


def _check_pci_tree(s: Dict[str, Any], source: str) -> None:
    """The bus numbers must make a real hierarchy (see pci.check_bus_numbers)."""
    from . import pci

    try:
        pci.topology(s)
    except pci.BusNumberingError as exc:
        raise SpecError("%s: pci: %s" % (source, exc)) from None


def _resolve_slurm_side(s: Dict[str, Any], raw: Dict[str, Any], source: str) -> None:
    """cgroup version, Slurm files, job cgroups, host processes and IRQs (see README 'Slurm side')."""
    s["cgroup"] = check(raw.get("cgroup", {}), D.CGROUP, "cgroup", source)
    if s["cgroup"]["version"] not in ("v2", "v1", "none"):
        raise SpecError(
            "%s: cgroup.version: %r not one of v2, v1, none" % (source, s["cgroup"]["version"])
        )
    s["slurm"] = check(raw.get("slurm", {}), D.SLURM, "slurm", source)
    s["job"] = {}
    for job_id, job in sorted(raw.get("job", {}).items()):
        where = "job.%s" % job_id
        if not str(job_id).isdigit():
            raise SpecError("%s: %s: job ids are numbers" % (source, where))
        j = check(job, D.JOB, where, source)
        _require(j, ("cpus",), where, source)
        cpus = set(parse_cpulist(j["cpus"]))
        if not j["mems"]:
            j["mems"] = format_cpulist(
                [n for n, node in s["numa"].items() if cpus & set(node["cpus"])]
            )
        s["job"][str(job_id)] = j
    procs = {p["pid"]: dict(D.HOST_PROCESS, **p) for p in D.HOST_PROCESSES}
    for i, p in enumerate(_list(raw, "process", source)):
        entry = check(p, D.HOST_PROCESS, "process[%d]" % i, source)
        _require(entry, ("pid", "comm"), "process[%d]" % i, source)
        procs[entry["pid"]] = entry
    s["process"] = [procs[pid] for pid in sorted(procs)]
    s["irq"] = [
        check(x, D.IRQ, "irq[%d]" % i, source) for i, x in enumerate(_list(raw, "irq", source))
    ]


def _list(raw: Dict[str, Any], key: str, source: str, default: Optional[list] = None) -> list:
    val = raw.get(key, default if default is not None else [])
    if not isinstance(val, list):
        raise SpecError("%s: %s: expected an array" % (source, key))
    return val


def _require(d: Dict[str, Any], keys: tuple, where: str, source: str) -> None:
    for k in keys:
        if d.get(k) in (None, ""):
            raise SpecError("%s: %s.%s: required" % (source, where, k))


def _bdf(text: str, where: str, source: str) -> str:
    """Canonical sysfs PCI address 'dddd:bb:dd.f' (lower case)."""
    try:
        dom, bus, rest = text.strip().lower().split(":")
        dev, fn = rest.split(".")
        d, b, v, f = int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)
        if b > 0xFF or v > 0x1F or f > 7 or d > 0xFFFFFFFF:
            raise ValueError
    except ValueError:
        raise SpecError(
            "%s: %s: bad PCI address %r (want e.g. 0000:18:00.0)" % (source, where, text)
        ) from None
    return "%04x:%02x:%02x.%x" % (d, b, v, f)


def _numa_ok(s: Dict[str, Any], node: int, where: str, source: str) -> None:
    if node != -1 and node not in s["numa"]:
        raise SpecError(
            "%s: %s: NUMA node %d not defined (have %s)" % (source, where, node, sorted(s["numa"]))
        )


def _modules(raw: Any, source: str) -> Dict[str, Dict[str, Any]]:
    if not isinstance(raw, dict):
        raise SpecError("%s: modules: expected a table" % source)
    out: Dict[str, Dict[str, Any]] = {}
    for name, v in raw.items():
        where = "modules.%s" % name
        if v is False:
            out[name] = {"loaded": False}
        elif v is True:
            out[name] = check({}, D.MODULE, where, source)
        elif isinstance(v, str):
            out[name] = check({"version": v}, D.MODULE, where, source)
        else:
            out[name] = check(v, D.MODULE, where, source)
    return out


def _mount(x: Any, i: int, source: str) -> Dict[str, Any]:
    if isinstance(x, str):
        parts = x.split()
        if len(parts) < 4:
            raise SpecError("%s: mounts[%d]: want 'device mountpoint fstype options'" % (source, i))
        x = dict(zip(("device", "mountpoint", "fstype", "options"), parts[:4]))
    return check(x, D.MOUNT, "mounts[%d]" % i, source)


def _kmsg(x: Any, i: int, source: str) -> Dict[str, Any]:
    if isinstance(x, str):
        x = {"msg": x}
    m = check(x, D.KMSG, "kmsg[%d]" % i, source)
    if m["xid"] <= 0:
        _require(m, ("msg",), "kmsg[%d]" % i, source)
    if m["compute_instance"] >= 0 and m["gpu_instance"] < 0:
        raise SpecError(
            "%s: kmsg[%d]: compute_instance needs gpu_instance (the driver prints GPU-CI only "
            "after GPU-I)" % (source, i)
        )
    return m


def parse_cpulist(text: str) -> List[int]:
    """'0-3,8,10-11' -> [0,1,2,3,8,10,11] (the kernel's cpulist format)."""
    out: List[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return sorted(set(out))


def format_cpulist(cpus: List[int]) -> str:
    cpus = sorted(set(cpus))
    parts, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else "%d-%d" % (cpus[i], cpus[j]))
        i = j + 1
    return ",".join(parts)


def cpu_location(s: Dict[str, Any], cpu: int) -> tuple:
    """Linux x86 enumeration: all first threads of every core of every socket, then the siblings."""
    c = s["cpu"]
    per_thread = c["sockets"] * c["cores_per_socket"]
    thread, rest = divmod(cpu, per_thread)
    socket, core = divmod(rest, c["cores_per_socket"])
    return socket, core, thread


def _resolve_cpu_numa(s: Dict[str, Any], raw_numa: Dict[int, Any], source: str) -> None:
    c = s["cpu"]
    for k in ("sockets", "cores_per_socket", "threads_per_core"):
        if c[k] < 1:
            raise SpecError("%s: cpu.%s: must be >= 1" % (source, k))
    total = c["sockets"] * c["cores_per_socket"] * c["threads_per_core"]
    c["count"] = total
    if not raw_numa:
        raw_numa = {sock: {} for sock in range(c["sockets"])}
    s["numa"] = {}
    nodes = sorted(raw_numa)
    mem = s["memory"]
    for n in nodes:
        where = "numa.%d" % n
        node = check(raw_numa[n], D.NUMA, where, source)
        if not node["cpulist"]:
            if len(nodes) != c["sockets"]:
                raise SpecError(
                    "%s: %s.cpulist: required when NUMA nodes != sockets" % (source, where)
                )
            node["cpulist"] = format_cpulist(
                [x for x in range(total) if cpu_location(s, x)[0] == nodes.index(n)]
            )
        try:
            node["cpus"] = parse_cpulist(node["cpulist"])
        except ValueError:
            raise SpecError(
                "%s: %s.cpulist: bad cpulist %r" % (source, where, node["cpulist"])
            ) from None
        if node["mem_total_kb"] == 0:
            node["mem_total_kb"] = mem["total_kb"] // len(nodes)
        if node["mem_free_kb"] == 0:
            node["mem_free_kb"] = (
                mem["free_kb"] // len(nodes) if mem["free_kb"] else node["mem_total_kb"] * 9 // 10
            )
        if not node["distance"]:
            node["distance"] = [10 if m == n else 21 for m in nodes]
        s["numa"][n] = node
    seen: Dict[int, int] = {}
    for n, node in s["numa"].items():
        for cpu in node["cpus"]:
            if cpu >= total:
                raise SpecError(
                    "%s: numa.%d.cpulist: CPU %d does not exist (%d CPUs)" % (source, n, cpu, total)
                )
            if cpu in seen:
                raise SpecError(
                    "%s: numa.%d.cpulist: CPU %d also in NUMA node %d" % (source, n, cpu, seen[cpu])
                )
            seen[cpu] = n
    missing = sorted(set(range(total)) - set(seen))
    if missing:
        raise SpecError("%s: numa: CPUs %s are in no NUMA node" % (source, format_cpulist(missing)))
    mem["total_kb"] = sum(x["mem_total_kb"] for x in s["numa"].values())
    mem["free_kb"] = sum(x["mem_free_kb"] for x in s["numa"].values())


def _resolve_dev(s: Dict[str, Any], where: str, d: Dict[str, Any], source: str) -> Dict[str, Any]:
    """Common PCI endpoint fields: pci address, switch, root port, NUMA node."""
    _require(d, ("pci",), where, source)
    d["pci"] = _bdf(d["pci"], where + ".pci", source)
    if d["switch"]:
        if d["switch"] not in s["switch"]:
            raise SpecError(
                "%s: %s.switch: unknown switch %r (have %s)"
                % (source, where, d["switch"], sorted(s["switch"]))
            )
        sw = s["switch"][d["switch"]]
        d["root_port"] = sw["root_port"]
        if d["numa_node"] is None:
            d["numa_node"] = sw["numa_node"]
    else:
        if d["root_port"] == "":
            dom, bus = d["pci"].split(":")[:2]
            d["root_port"] = "%s:%02x:01.0" % (dom, max(int(bus, 16) - 1, 0))
        elif d["root_port"] != "none":
            d["root_port"] = _bdf(d["root_port"], where + ".root_port", source)
    if d["numa_node"] is None:
        d["numa_node"] = 0
    _numa_ok(s, d["numa_node"], where + ".numa_node", source)
    d["cpulist"] = (
        s["numa"][d["numa_node"]]["cpulist"]
        if d["numa_node"] >= 0
        else format_cpulist(list(range(s["cpu"]["count"])))
    )
    return d


def _hash_hex(*parts: Any) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def _resolve_gpu(s: Dict[str, Any], idx: int, g: Dict[str, Any], source: str) -> Dict[str, Any]:
    where = "gpu.%d" % idx
    g = _resolve_dev(s, where, g, source)
    host = s["node"]["hostname"]
    if not g["uuid"]:
        h = _hash_hex(host, "gpu", idx)
        g["uuid"] = "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:32])
    if not g["serial"]:
        g["serial"] = "16523%08d" % (int(_hash_hex(host, "serial", idx)[:8], 16) % 10**8)
    if g["minor_number"] < 0:
        g["minor_number"] = idx
    if g["retired_pages"]["supported"] is None:
        g["retired_pages"]["supported"] = g["architecture"] < 7  # Ampere+ remaps rows instead
    nv = g["nvlink"]
    links = {}
    for link in range(nv["count"]):
        raw = nv["links"].get(link, nv["links"].get(str(link), {}))
        links[link] = check(raw, D.NVLINK_LINK, "%s.nvlink.links.%d" % (where, link), source)
    extra = sorted(set(map(int, nv["links"])) - set(links))
    if extra:
        raise SpecError(
            "%s: %s.nvlink.links.%d: link beyond nvlink.count=%d"
            % (source, where, extra[0], nv["count"])
        )
    nv["links"] = links
    for k in ("processes", "graphics_processes"):
        g[k] = [
            check(p, D.PROCESS, "%s.%s[%d]" % (where, k, i), source) for i, p in enumerate(g[k])
        ]
    if g["memory"]["used"] is None:
        g["memory"]["used"] = sum(
            p["used_memory"] for p in g["processes"] + g["graphics_processes"]
        )
    socket_of = (
        cpu_location(s, s["numa"][g["numa_node"]]["cpus"][0])[0] if g["numa_node"] >= 0 else 0
    )
    g["socket"] = socket_of
    return g


def _resolve_nic(s: Dict[str, Any], name: str, n: Dict[str, Any], source: str) -> Dict[str, Any]:
    where = "nic.%s" % name
    n = _resolve_dev(s, where, n, source)
    n["name"] = name
    if n["rdma"] is None:
        n["rdma"] = n["vendor"] == 0x15B3
    _, bus, rest = n["pci"].split(":")
    dev, fn = rest.split(".")
    if not n["netdev"]:
        pre = "ibp" if n["link_layer"] == "InfiniBand" else "enp"
        n["netdev"] = "%s%ds%d%s" % (
            pre,
            int(bus, 16),
            int(dev, 16),
            ("f%d" % int(fn, 16)) if int(fn, 16) else "",
        )
    if n["class"] < 0:
        n["class"] = 0x020700 if n["link_layer"] == "InfiniBand" else 0x020000
    if not n["node_guid"]:
        h = _hash_hex(s["node"]["hostname"], name)[:16]
        n["node_guid"] = ":".join(h[i : i + 4] for i in range(0, 16, 4))
    ports = n["ports"] or {1: {}}
    n["ports"] = {}
    for p in sorted(ports, key=int):
        port = check(ports[p], D.IB_PORT, "%s.ports.%s" % (where, p), source)
        port["link_layer"] = port["link_layer"] or n["link_layer"]
        port["counters"] = deep_merge(D.IB_COUNTERS, port["counters"])
        n["ports"][int(p)] = port
    return n


def _resolve_node(s: Dict[str, Any], source: str) -> None:
    node, nvml = s["node"], s["nvml"]
    if node["virtualization"] not in D.VIRT:
        raise SpecError(
            "%s: node.virtualization: %r not one of %s" % (source, node["virtualization"], D.VIRT)
        )
    if s["iommu"]["mode"] not in ("off", "passthrough", "translated"):
        raise SpecError(
            "%s: iommu.mode: %r not one of off, passthrough, translated"
            % (source, s["iommu"]["mode"])
        )
    if s["iommu"]["vendor"] not in ("intel", "amd"):
        raise SpecError(
            "%s: iommu.vendor: %r not one of intel, amd" % (source, s["iommu"]["vendor"])
        )
    if not node["cmdline"]:
        iommu = {
            "intel": {
                "off": "intel_iommu=off",
                "passthrough": "intel_iommu=on iommu=pt",
                "translated": "intel_iommu=on",
            },
            "amd": {"off": "amd_iommu=off", "passthrough": "iommu=pt", "translated": ""},
        }
        node["cmdline"] = (
            "BOOT_IMAGE=/boot/vmlinuz-%s root=UUID=3f1e2c4a-9b7d-4e2f-8a61-0c5d2e7b9f10 ro "
            "%s quiet" % (node["kernel_release"], iommu[s["iommu"]["vendor"]][s["iommu"]["mode"]])
        )
        node["cmdline"] = " ".join(node["cmdline"].split())
    if nvml["library"] is None:
        nvml["library"] = bool(s["gpu"])
    if not nvml["nvml_version"]:
        nvml["nvml_version"] = "%d.%s-fakenvml" % (
            nvml["cuda_driver_version"] // 1000,
            nvml["driver_version"],
        )
    if "fake" not in nvml["nvml_version"]:
        raise SpecError(
            "%s: nvml.nvml_version: must contain 'fake' (the sentinel tests check)" % source
        )
    mods = s["modules"]
    auto: Dict[str, Dict[str, Any]] = {}
    if s["gpu"]:
        for m in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
            auto[m] = dict(
                D.MODULE, version=nvml["driver_version"] if m == "nvidia" else "", taint="(OE)"
            )
    if any(n["rdma"] for n in s["nic"].values()):
        for m in ("mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs"):
            auto[m] = dict(D.MODULE)
    if s["nvme"]:
        auto["nvme"] = dict(D.MODULE)
        auto["nvme_core"] = dict(D.MODULE)
    for m, v in auto.items():
        mods.setdefault(m, v)
    s["modules"] = {k: v for k, v in mods.items() if v.get("loaded", True)}


def _unique_bdfs(s: Dict[str, Any], source: str) -> None:
    seen: Dict[str, str] = {}
    for kind in ("gpu", "nic", "nvme"):
        for k, d in s[kind].items():
            where = "%s.%s.pci" % (kind, k)
            if d["pci"] in seen:
                raise SpecError(
                    "%s: %s: PCI address %s also used by %s"
                    % (source, where, d["pci"], seen[d["pci"]])
                )
            seen[d["pci"]] = where
