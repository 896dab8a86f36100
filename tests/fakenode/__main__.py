"""CLI:  python -m tests.fakenode {build,run,list,show} ...

build SPEC DIR [--override JSON] [--state K=V ...]   build the tree + fake NVML under DIR, print the env
run SPEC [--override JSON] [--state K=V ...] [--keep] -- CMD ARGS...
                                                     build into a temp dir, run CMD with the env set and
                                                     '{root}' in its arguments replaced by the tree path
list                                                 shipped spec names
show SPEC [--override JSON]                          the resolved spec as JSON
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

from .fakenvml import FakeNvmlBuildError
from .node import FakeNode, fast_tmpdir
from .spec import SPEC_DIR, SpecError, load_spec


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tests.fakenode", description="Fake GPU node builder for tests"
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "spec", help="shipped spec name (dgx-h100, cpu-only) or path to a .toml spec"
        )
        sp.add_argument(
            "--override",
            metavar="JSON",
            help='deep-merged overlay, e.g. \'{"gpu": {"3": {"ecc": '
            '{"volatile": {"uncorrected": {"dram": 2}}}}}}\'',
        )
        sp.add_argument(
            "--state",
            metavar="KEY=VALUE",
            action="append",
            default=[],
            help="edit the NVML state after building, e.g. 'fault.nvmlDeviceGetEccMode.3=15'",
        )

    b = sub.add_parser("build", help="build SPEC into DIR and print the environment to export")
    common(b)
    b.add_argument("dir")
    r = sub.add_parser("run", help="build into a temp dir and run a command against it")
    common(r)
    r.add_argument(
        "--keep", action="store_true", help="keep the temp dir (its path is printed on stderr)"
    )
    sub.add_parser("list", help="list shipped specs")
    s = sub.add_parser("show", help="print the resolved spec as JSON")
    s.add_argument("spec")
    s.add_argument("--override", metavar="JSON")
    return p


def _overrides(text: Optional[str]) -> Optional[Dict]:
    if not text:
        return None
    try:
        val = json.loads(text)
    except ValueError as exc:
        raise SpecError("--override: invalid JSON: %s" % exc) from None
    if not isinstance(val, dict):
        raise SpecError("--override: must be a JSON object")
    return val


def _build(args: argparse.Namespace, directory: str) -> FakeNode:
    node = FakeNode.build(args.spec, directory, overrides=_overrides(args.override))
    changes = {}
    for item in args.state:
        if "=" not in item:
            raise SpecError("--state %r: want KEY=VALUE" % item)
        k, v = item.split("=", 1)
        changes[k.strip()] = v.strip()
    if changes:
        node.set_states(changes)
    return node


def env_lines(node: FakeNode) -> List[str]:
    return ["export %s=%s" % (k, shlex.quote(v)) for k, v in node.env.items()]


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: List[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = _parser().parse_args(argv)
    args.command = command
    try:
        if args.cmd == "list":
            for p in sorted(SPEC_DIR.glob("*.toml")):
                print(p.stem)
            return 0
        if args.cmd == "show":
            spec = load_spec(args.spec, _overrides(args.override))
            print(json.dumps(spec, indent=1, sort_keys=True, default=str))
            return 0
        if args.cmd == "build":
            node = _build(args, args.dir)
            print(
                "# fake node %s built in %s (nvml library: %s)"
                % (args.spec, node.root, node.lib_path or "none")
            )
            print("\n".join(env_lines(node)))
            return 0
        return _run(args)
    except (SpecError, FakeNvmlBuildError, FileExistsError) as exc:
        print("fakenode: error: %s" % exc, file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    cmd = args.command
    if not cmd:
        print("fakenode: error: run needs a command after --", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="fakenode-", dir=fast_tmpdir())
    try:
        node = _build(args, tmp)
        argv = [a.replace("{root}", str(node.root)) for a in cmd]
        if args.keep:
            print("fakenode: tree kept in %s" % node.root, file=sys.stderr)
        try:
            return subprocess.call(argv, env=node.subprocess_env())
        except OSError as exc:
            print("fakenode: error: cannot run %s: %s" % (argv[0], exc), file=sys.stderr)
            return 127
        except KeyboardInterrupt:
            return 130
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
