"""`slurm-hooks ARGS` run inside the test process: cli.main.main(argv) with its own environment,
working directory, stdin, stdout and stderr, answered as subprocess.run would answer it.

A `python -m slurm_hooks` child costs ~0.1 s of CPU (interpreter start and imports); the suite
spawned ~200 of them, most for verbs that only read files and print. Such verbs give the same
answer here. What cannot run here, and is refused so that a test does not silently test
something else:
- hook verbs (prolog, epilog, ...): they fork, set signal handlers and leave through os._exit;
- `--live nvml`, unless the caller names the fake node (`nvml_node=`): a child finds the fake
  libnvidia-ml.so.1 through LD_LIBRARY_PATH when it starts, which this process did long ago; here
  pynvml is pointed at that node's library for the command (as the nvml_node fixture does for the
  checks), and a test about finding the library keeps its child.
A verb that leaves a check thread stuck would end the process (check_verbs.finish: os._exit);
here it is an error instead, and only for threads the verb started: a hung-check test run
earlier in this worker may have left its own stuck thread behind, which is no business of this
command (finish would otherwise kill the xdist worker for it).
Each verb keeps at least one subprocess test elsewhere, so the console entry point stays tested.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

from tests.helpers import REPO


def cli_in_process(
    args: List[str],
    env: Optional[Dict[str, str]] = None,
    stdin: Optional[str] = None,
    cwd: str = REPO,
    nvml_node: Any = None,
) -> "subprocess.CompletedProcess[str]":
    """main(args) with os.environ replaced by `env` (default: unchanged), cwd, and stdin text;
    its exit code (argparse's SystemExit included), stdout and stderr as a CompletedProcess.
    nvml_node: the FakeNode whose library `--live nvml` reads (pynvml reset before and after)."""
    from slurm_hooks.cli import main as cli_main

    args = [str(a) for a in args]
    if cli_main.parse_hook_args(args) is not None:
        raise ValueError("a hook verb runs as a subprocess: %r" % args)
    if "nvml" in args and "--live" in args and nvml_node is None:
        raise ValueError("--live nvml needs a fresh process (LD_LIBRARY_PATH): %r" % args)
    if nvml_node is None:
        return _main_in_process(args, env, stdin, cwd)
    with _library_of(nvml_node):
        return _main_in_process(args, env, stdin, cwd)


def _main_in_process(
    args: List[str], env: Optional[Dict[str, str]], stdin: Optional[str], cwd: str
) -> "subprocess.CompletedProcess[str]":
    from slurm_hooks.cli import check_verbs
    from slurm_hooks.cli import main as cli_main
    from slurm_hooks.core import logs

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="", errors="backslashreplace")
    given = io.TextIOWrapper(io.BytesIO((stdin or "").encode("utf-8")), encoding="utf-8")
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_streams = (sys.stdin, sys.stdout, sys.stderr)
    decisions = logging.getLogger(logs.LOGGER_NAME)
    saved_handlers = list(decisions.handlers)
    saved_logger = (decisions.level, decisions.propagate)
    saved_finish = check_verbs.finish
    check_verbs.finish = _finish_without_exit(set(threading.enumerate()))
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    os.chdir(cwd)
    sys.stdin, sys.stdout, sys.stderr = given, out, err
    try:
        try:
            code = cli_main.main(args)
        except SystemExit as exc:  # argparse: --help (0) or a usage error (parser.py: 3)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out.flush()
        err.flush()
    finally:
        check_verbs.finish = saved_finish
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for handler in list(decisions.handlers):  # the verb's handlers write to our closed streams
            if handler not in saved_handlers:
                decisions.removeHandler(handler)
                handler.close()
        for handler in saved_handlers:
            if handler not in decisions.handlers:
                decisions.addHandler(handler)
        decisions.level, decisions.propagate = saved_logger
    return subprocess.CompletedProcess(
        ["slurm-hooks"] + args,
        int(code),
        out.buffer.getvalue().decode("utf-8"),
        err.buffer.getvalue().decode("utf-8", "backslashreplace"),
    )


def _finish_without_exit(before):
    """check_verbs.finish for this process: the exit code, after the check threads this command
    started have ended (a few seconds for one winding down); one still stuck is an error."""

    def finish(code: int) -> int:
        for thread in threading.enumerate():
            if thread not in before and thread.name.startswith(("check:", "bounded:")):
                thread.join(5.0)
                if thread.is_alive():
                    raise RuntimeError(
                        "thread %s is stuck: run this command as a subprocess" % thread.name
                    )
        return code

    return finish


def cli_in_child(
    args: List[str], env: Optional[Dict[str, str]] = None, timeout: float = 60
) -> "subprocess.CompletedProcess[str]":
    """`python -m slurm_hooks ARGS` as a child: what cli_in_process is compared with."""
    return subprocess.run(
        [sys.executable, "-m", "slurm_hooks"] + list(args),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
    )


@contextmanager
def _library_of(node: Any) -> Iterator[None]:
    """The real pynvml on node's fake library, with no NVML session before or after."""
    from slurm_hooks.hw import nvml
    from tests.fakenode import fakenvml
    from tests.helpers import release_fake_nvml

    fakenvml.unload_from_pynvml()
    nvml.reset_sessions()
    if node.lib_path is not None:  # else pynvml looks for libnvidia-ml.so.1 as the child would
        node.load_into_pynvml()
    try:
        yield
    finally:
        release_fake_nvml()
