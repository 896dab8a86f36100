"""build_node(): one spec -> sysfs/procfs tree + fake NVML library and state, and the FakeNode handle."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from . import fakenvml, image, nvmlstate, pci, pool
from .fsutil import Tree, remove_tree
from .procfs import write_procfs
from .spec import load_spec
from .sysfs import write_sysfs

FAKE_DIR = ".fakenvml"


class FakeNode:
    """A built fake node.

    Attributes: ``root`` (tree root; pass as --root), ``spec`` (resolved spec dict), ``lib_dir`` (holds
    libnvidia-ml.so.1 when the spec has NVML), ``lib_path`` (None without NVML), ``state_path``,
    ``env`` (variables to add to a subprocess environment), ``pci_paths`` ({bdf: '/sys/devices/...'}).
    """

    def __init__(
        self,
        root: Path,
        spec: Dict[str, Any],
        lib_path: Optional[Path],
        state_path: Path,
        pci_paths: Dict[str, str],
    ) -> None:
        self.root = root
        self.spec = spec
        self.lib_dir = root / FAKE_DIR / "lib"
        self.lib_path = lib_path
        self.state_path = state_path
        self.pci_paths = pci_paths
        # the image (image.py) this node's tree was written as, when there is one: the pool's record
        self._image: Optional[image.TreeImage] = None
        self.env = {
            "LD_LIBRARY_PATH": str(self.lib_dir),
            "FAKE_NVML_STATE": str(state_path),
            "FAKENODE_ROOT": str(root),
            # root's parsed-configuration cache (slurm_hooks/core/config_cache.py) stays off for a
            # hook run on a fake node, as in the suite (conftest): tests that give a hook the
            # environment slurmd would (this one plus the job's) otherwise wrote the host's
            # /run/slurm-hooks (test_mode's fresh-install prolog did, as root)
            "SLURM_HOOKS_CONFIG_CACHE": "off",
            # and the drain lock goes to the hook's state_dir, not the host's /run (nodelock.py)
            "SLURM_HOOKS_LOCK_DIR": "off",
        }

    @classmethod
    def build(
        cls,
        spec: Union[str, Path, Dict[str, Any]] = "dgx-h100",
        directory: Union[str, Path, None] = None,
        overrides: Optional[Dict[str, Any]] = None,
    ) -> "FakeNode":
        """Load ``spec`` (name, path or dict) with ``overrides`` and build it into ``directory``."""
        if directory is None:
            raise TypeError("FakeNode.build needs a directory (e.g. pytest's tmp_path)")
        return build_node(load_spec(spec, overrides), directory)

    @classmethod
    def build_temp(
        cls,
        spec: Union[str, Path, Dict[str, Any]] = "dgx-h100",
        overrides: Optional[Dict[str, Any]] = None,
    ) -> "FakeNode":
        """Build into a fresh temp dir on tmpfs when available (see fast_tmpdir); call cleanup() when done."""
        resolved = load_spec(spec, overrides)
        use_lib = resolved["nvml"]["library"]
        key = image.spec_key(resolved, use_lib)
        earlier = image.lookup(key)
        kept = pool.pool()
        if kept is not None and earlier is not None:  # a released tree made into this node
            root = kept.take(key, earlier[0], fast_tmpdir())
            if root is not None:
                node = cls(Path(root), resolved, *_node_paths(Path(root), use_lib, earlier[1]))
                node._image = earlier[0]
                return node
        d = tempfile.mkdtemp(prefix="fakenode-", dir=fast_tmpdir())
        try:
            node = _write_node(resolved, Path(d).resolve(), use_lib, key, earlier)
        except BaseException:
            shutil.rmtree(d, ignore_errors=True)
            raise
        if kept is not None and node._image is not None:
            kept.follow(str(node.root), node._image, key)
        return node

    def cleanup(self, reuse: bool = True) -> None:
        """Remove the whole tree (only for nodes from build_temp or your own temp dirs). A node
        from build_temp goes to this process's pool instead (pool.py), which sees what the test
        changed; reuse=False removes it all the same (a test that changed it in a way the pool
        cannot see: a hard link made outside the tree, a shared mmap)."""
        kept = pool.pool()
        if kept is not None:
            if reuse and kept.release(str(self.root)):
                return
            if not reuse:
                kept.forget(str(self.root))
        remove_tree(str(self.root))

    # ---------------------------------------------------------------- paths and environments

    def path(self, p: str) -> Path:
        """Host path of a node path: node.path('/sys/bus/pci/devices')."""
        return self.root / p.lstrip("/")

    def subprocess_env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """``base`` (default os.environ) plus ``env``; LD_LIBRARY_PATH is prepended, not replaced."""
        env = dict(os.environ if base is None else base)
        old = env.get("LD_LIBRARY_PATH")
        env.update(self.env)
        if old:
            env["LD_LIBRARY_PATH"] = self.env["LD_LIBRARY_PATH"] + os.pathsep + old
        return env

    def gpu_bdfs(self) -> List[str]:
        return [g["pci"] for g in self.spec["gpu"].values()]

    # ---------------------------------------------------------------- NVML state editing

    def state(self) -> Dict[str, str]:
        return nvmlstate.read_state(self.state_path)

    def set_state(self, key: str, value: Any) -> None:
        """Set one state key (None deletes it), e.g. set_state('gpu.3.remapped_rows.pending', 1)."""
        nvmlstate.update_state(self.state_path, {key: value})

    def set_states(self, changes: Dict[str, Any]) -> None:
        nvmlstate.update_state(self.state_path, changes)

    def inject_fault(self, function: str, gpu: Union[int, str] = "*", code: int = 15) -> None:
        """Make ``function`` return nvmlReturn_t ``code`` (default 15 GPU_IS_LOST) for ``gpu`` or all ('*')."""
        self.set_state("fault.%s.%s" % (function, gpu), code)

    def inject_hang(self, function: str, gpu: Union[int, str] = "*") -> None:
        """Make ``function`` block forever (the process must be killed)."""
        self.set_state("hang.%s.%s" % (function, gpu), 1)

    def inject_crash(self, function: str, gpu: Union[int, str] = "*") -> None:
        """Make ``function`` abort() the calling process (SIGABRT)."""
        self.set_state("crash.%s.%s" % (function, gpu), 1)

    def inject_delay(self, function: str, gpu: Union[int, str] = "*", ms: int = 1000) -> None:
        self.set_state("delay_ms.%s.%s" % (function, gpu), ms)

    def clear_faults(self) -> None:
        keys = [
            k for k in self.state() if k.split(".", 1)[0] in ("fault", "hang", "crash", "delay_ms")
        ]
        nvmlstate.update_state(self.state_path, {k: None for k in keys})

    # ---------------------------------------------------------------- tree editing

    def add_kmsg(
        self, msg: str, level: int = 3, facility: int = 0, ts_us: Optional[int] = None
    ) -> str:
        """Append one record to /dev/kmsg (e.g. an Xid); returns the record line."""
        kmsg = self.path("/dev/kmsg")
        lines = kmsg.read_text().splitlines()
        seq = int(lines[-1].split(",")[1]) + 1 if lines else 0
        last_ts = int(lines[-1].split(",")[2]) if lines else 0
        rec = "%d,%d,%d,-;%s" % (
            facility * 8 + level,
            seq,
            ts_us if ts_us is not None else last_ts + 1000,
            msg,
        )
        with kmsg.open("a") as f:
            f.write(rec + "\n")
        return rec

    def add_cpu_ticks(self, ticks: Dict[int, Dict[str, int]]) -> None:
        """Let time pass on CPUs in /proc/stat: {cpu: {"user": 500, "idle": 100, ...}} (USER_HZ ticks) added
        to that CPU's columns (and to the all-CPU line), e.g. a daemon eating CPU 3: {3: {"system": 90}}."""
        from .procfs import format_proc_stat, parse_proc_stat_ticks

        current = parse_proc_stat_ticks(self.path("/proc/stat").read_text())
        for cpu, add in ticks.items():
            for column, value in add.items():
                current[int(cpu)][column] += int(value)
        self.write("/proc/stat", format_proc_stat(current))

    def add_cgroup_usage(self, usec: int, job_id: Optional[str] = None) -> None:
        """CPU time used by Slurm jobs (cgroup v2 cpu.stat usage_usec): added to the slurmstepd scope and,
        with job_id, to that job's cgroup too (a child's time counts in its parent, as in the kernel)."""
        from .procfs import cpu_stat

        scope = "/sys/fs/cgroup/system.slice/slurmstepd.scope"
        for directory in [scope] + (["%s/job_%s" % (scope, job_id)] if job_id else []):
            path = self.path(directory + "/cpu.stat")
            usage = int(path.read_text().split()[1]) + int(usec)
            self.write(directory + "/cpu.stat", cpu_stat(usage))

    def write(self, path: str, content: Union[str, bytes]) -> None:
        """Overwrite one file in the tree (sysfs values are newline-terminated automatically)."""
        Tree(self.root).write(path, content)

    # ---------------------------------------------------------------- in-process pynvml

    def load_into_pynvml(self) -> Any:
        """Point the real pynvml at this node's fake library (call before nvmlInit); returns pynvml."""
        if self.lib_path is None:
            raise RuntimeError(
                "spec %s has no NVML library (nvml.library = false)" % self.spec.get("_source")
            )
        if os.environ.get("FAKE_NVML_STATE", str(self.state_path)) != str(self.state_path):
            del os.environ[
                "FAKE_NVML_STATE"
            ]  # a stale one would win over the state next to the library
        return fakenvml.load_into_pynvml(self.lib_path)

    def __repr__(self) -> str:
        return "FakeNode(root=%r, spec=%r, gpus=%d)" % (
            str(self.root),
            self.spec.get("_source"),
            len(self.spec["gpu"]),
        )


BuiltNode = FakeNode


def fast_tmpdir() -> Optional[str]:
    """$FAKENODE_TMPDIR, else /dev/shm when writable (a DGX tree is ~4000 small files: 0.15 s on tmpfs, seconds on
    a busy disk), else None (the system temp dir)."""
    env = os.environ.get("FAKENODE_TMPDIR")
    if env:
        return env
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def build_node(
    spec: Dict[str, Any], root_dir: Union[str, Path], with_library: Optional[bool] = None
) -> FakeNode:
    """Write the tree for a resolved ``spec`` (from load_spec) under ``root_dir``; compile/install the fake NVML.

    ``with_library``: override spec.nvml.library (False skips gcc entirely; the state file is still written).
    """
    root = Path(root_dir).resolve()
    use_lib = spec["nvml"]["library"] if with_library is None else with_library
    key = image.spec_key(spec, use_lib)
    return _write_node(spec, root, use_lib, key, image.lookup(key))


def _node_paths(
    root: Path, use_lib: bool, pci_paths: Dict[str, str]
) -> Tuple[Optional[Path], Path, Dict[str, str]]:
    """FakeNode's lib_path, state_path and pci_paths for a tree at root."""
    lib_dir = root / FAKE_DIR / "lib"
    return (
        (lib_dir / fakenvml.SONAME if use_lib else None),
        lib_dir / fakenvml.STATE_NAME,
        dict(pci_paths),
    )


def _write_node(
    spec: Dict[str, Any],
    root: Path,
    use_lib: bool,
    key: str,
    earlier: Optional[Tuple[image.TreeImage, Dict[str, str]]],
) -> FakeNode:
    """The tree for spec under root: from an earlier build's image (image.lookup), else built."""
    for sub in ("sys", "proc", "dev"):
        if (root / sub).exists():
            raise FileExistsError(
                "%s already contains a node tree (%s/); use an empty directory" % (root, sub)
            )
    lib_path, state_path, _ = _node_paths(root, use_lib, {})
    lib_dir = state_path.parent
    if earlier is not None:  # this spec was built before: its bytes again (image.py)
        tree, paths = earlier
        tree.write_to(str(root))
        node = FakeNode(root, spec, lib_path, state_path, dict(paths))
        node._image = tree
        return node
    root.mkdir(parents=True, exist_ok=True)
    t = Tree(root)
    devs = pci.topology(spec)
    paths = write_sysfs(t, spec, devs)
    write_procfs(t, spec)
    lib_dir.mkdir(parents=True, exist_ok=True)
    nvmlstate.write_state(state_path, nvmlstate.state_lines(spec))
    if use_lib:
        fakenvml.install_library(lib_dir)
    node = FakeNode(root, spec, lib_path, state_path, paths)
    if image.wanted(key):
        node._image = image.keep(key, str(root), paths)
    return node
