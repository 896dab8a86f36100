"""parse_cpuinfo_models reads only the lines that can name a model (procfs._model_lines), and still
gives what the plain line-by-line loop gives, on every real /proc/cpuinfo of the capture corpus
(tests/captures/manifest.toml names each source) and on generated text full of odd keys,
cases, blanks and line breaks."""

from __future__ import annotations

import functools
import glob
import os
import random
import tarfile

import pytest

from slurm_hooks.hw import procfs

CAPTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "captures")


# The archives are read when a test needs them, not when the module is collected: decompressing
# the 26 captures cost ~0.3 s of CPU in every xdist worker, and only one worker runs each test.
ARCHIVES = sorted(glob.glob(os.path.join(CAPTURES, "*.tar.xz")))


@functools.cache
def _cpuinfo_of(archive):
    """((member name, text), ...) of every /proc/cpuinfo in one capture archive."""
    texts = []
    with tarfile.open(archive) as tar:
        for name in tar.getnames():
            if name.endswith("/proc/cpuinfo"):
                texts.append((name, tar.extractfile(name).read().decode("utf-8", "replace")))
    return tuple(texts)


def _corpus_cpuinfo():
    return [text for archive in ARCHIVES for text in _cpuinfo_of(archive)]


def _line_by_line(text, monkeypatch):
    """The result of the loop over every line (what parse_cpuinfo_models did before the fast path)."""
    with monkeypatch.context() as patch:
        patch.setattr(procfs, "_model_lines", lambda t: t.splitlines())
        return procfs.parse_cpuinfo_models(text)


def test_the_corpus_has_cpuinfo_of_every_kind():
    assert len(_corpus_cpuinfo()) >= 20  # x86, Arm, POWER, s390, RISC-V, LoongArch, SPARC


@pytest.mark.parametrize(
    "archive", ARCHIVES, ids=[os.path.basename(a)[: -len(".tar.xz")] for a in ARCHIVES]
)
def test_real_cpuinfo_gives_the_same_models_as_every_line(archive, monkeypatch):
    found = _cpuinfo_of(archive)
    if not found:
        pytest.skip("%s holds no /proc/cpuinfo" % os.path.basename(archive))
    for name, text in found:
        expected = _line_by_line(text, monkeypatch)
        assert procfs.parse_cpuinfo_models(text) == expected, name


def test_an_x86_file_is_read_one_line_per_cpu():
    """A 64-CPU x86 file: 64 'processor' blocks of ~25 lines; the loop sees the 64 model lines."""
    text = dict(_cpuinfo_of(os.path.join(CAPTURES, "x86_64-64cpu.tar.xz")))[
        "x86_64-64cpu/proc/cpuinfo"
    ]
    processors = sum(1 for line in text.splitlines() if line.startswith("processor"))
    lines = procfs._model_lines(text)
    assert processors == 64
    assert len(lines) == processors
    assert all(line.startswith("model name") for line in lines)


FRAGMENTS = [
    "model name",
    "Model Name",
    "MODEL NAME",
    "model  name",
    "cpu",
    "CPU",
    "cpu MHz",
    "cpu part",
    "CPU part",
    "cpu implementer",
    "CPU implementer",
    "cpuid level",
    "uarch",
    "processor",
    "processor 0",
    "processor 12",
    "Processor",
    "flags",
    "isa",
    ":",
    " : ",
    "\t: ",
    "\t",
    " ",
    "\x1f",
    "\n",
    "\n\n",
    "\r",
    "\r\n",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x85",
    "\u2028",
    "\u00a0",
    "0x41",
    "0xd40",
    "0x4e",
    "0x004",
    "0xzz",
    "machine = 3931",
    "version = FF,  machine = 2964",
    "Intel(R) Xeon(R)    CPU @ 2.6GHz",
    "POWER10 (architected)",
    "sifive,u74-mc",
    "",
]


def test_generated_text_gives_the_same_models_as_every_line(monkeypatch):
    rng = random.Random(26)
    for _ in range(3000):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 40)))
        assert procfs.parse_cpuinfo_models(text) == _line_by_line(text, monkeypatch), repr(text)


def test_generated_text_the_fast_path_takes_gives_the_same_models(monkeypatch):
    """Only fragments that keep the text on the fast path (ASCII, "\\n" the only line break)."""
    plain = [
        f for f in FRAGMENTS if f.isascii() and not any(b in f for b in procfs._OTHER_LINE_BREAKS)
    ]
    rng = random.Random(29)
    for _ in range(3000):
        text = "".join(rng.choice(plain) for _ in range(rng.randint(1, 40)))
        assert procfs.parse_cpuinfo_models(text) == _line_by_line(text, monkeypatch), repr(text)
