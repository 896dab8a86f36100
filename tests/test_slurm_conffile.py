"""gres.conf / slurm.conf read the way Slurm reads them (slurm_hooks.slurm.conffile, .gres).

Inputs are real: site files and slurmd output under tests/captures/slurmconf/ (README names the
sources), and a gres.conf that the real slurmd 22.05.8 of this host read, with what it printed.
"""

import os
import re
from pathlib import Path

import pytest

from slurm_hooks.hw.host import Host, HostError, ParseError
from slurm_hooks.slurm import conffile, gres

CAPTURES = Path(__file__).parent / "captures" / "slurmconf"


def _text(name: str) -> str:
    return (CAPTURES / name).read_text()


def _reader(root: Path):
    return conffile.host_reader(Host(str(root)))


# -- gres.conf: AutoDetect on a NodeName line ---------------------------------------------------


def test_inline_autodetect_on_a_nodename_line_applies_to_those_nodes():
    """Real site lines (NodeName=gpu2 AutoDetect=off Name=gpu ...): before, read as not set."""
    conf = gres.parse_gres_conf(_text("sites/phoebe-gpu2-mig-gres.conf"), "gres.conf")
    assert conf.autodetect_for("gpu2") == "off"
    assert conf.autodetect_for("gpu1") == ""  # another node: the line does not apply
    assert [len(line.files) for line in conf.gpu_lines("gpu2")] == [2, 2, 2, 3]


def test_inline_autodetect_nvml_on_a_nodename_line_wins_over_the_global_one():
    text = "AutoDetect=off\nNodeName=gpu[01-02] AutoDetect=nvml Name=gpu Type=h100 File=/dev/nvidia[0-3]\n"
    conf = gres.parse_gres_conf(text, "gres.conf")
    assert conf.autodetect_for("gpu02") == "nvml" and conf.autodetect_for("gpu03") == "off"
    assert conf.gpu_lines("gpu01")[0].files == tuple("/dev/nvidia%d" % i for i in range(4))


def test_inline_autodetect_without_nodename_is_ignored_as_slurm_ignores_it():
    conf = gres.parse_gres_conf(_text("sites/rdgpu01-mig-gres.conf"), "gres.conf")
    assert conf.autodetect_for("rdgpu01") == ""
    assert conf.gpu_lines("rdgpu01")[2].files == (
        "/dev/nvidia1",
        "/dev/nvidia-caps/nvidia-cap201",
        "/dev/nvidia-caps/nvidia-cap202",
    )


def test_real_site_files_parse():
    conf = gres.parse_gres_conf(_text("sites/danielmc81-gres.conf"), "gres.conf")
    assert [ln.fields["type"] for ln in conf.gpu_lines("visualizacion1")] == ["gtx970", "gtx1060"]
    assert len(conf.gpu_lines("ibnodo2")[0].files) == 4
    conf = gres.parse_gres_conf(_text("sites/hpclab3-gres.conf"), "gres.conf")
    assert conf.autodetect_for("gpu01") == "nvidia" and len(conf.gpu_lines("gpu01")) == 1


def test_autodetect_first_then_more_words_is_an_error_as_in_slurmd():
    """slurmd 22.05.8 here: 'Parse error in file gres.conf line 1' and fatal. UNKNOWN, not a guess."""
    with pytest.raises(ParseError, match="gres.conf:1"):
        gres.parse_gres_conf("AutoDetect=off Name=gpu File=/dev/nvidia0\n", "gres.conf")


# -- saved `slurmd -G` output and slurmd logs ----------------------------------------------------


def _slurmd_records(text: str):
    """(File, Cores) of each 'Gres Name=...' record slurmd printed: what slurmd itself read."""
    out = set()
    for line in text.splitlines():
        files = re.search(r" File=(\S+)", line)
        cores = re.search(r" Cores=(\S+)", line)
        if " Gres Name=" in line and files:
            out.add((files.group(1), cores.group(1) if cores else None))
    return out


def test_saved_slurmd_minus_g_output_of_a_real_slurmd_parses():
    """Real slurmd 22.05.8 output ('slurmd-n1: Gres ... CoreCnt=2 (null)'): before, a parse error."""
    text = _text("slurmd-22.05.8/slurmd-G-n1.txt")
    conf = gres.parse_gres_conf(text, "slurmd -G")
    got = {(",".join(ln.files), ln.fields.get("cores")) for ln in conf.gpu_lines("n1")}
    assert got == _slurmd_records(text) and len(got) == 4


def test_slurmd_log_lines_with_time_stamps_are_skipped_not_errors():
    for name in ("logs/deepops-1214-slurmd.log", "logs/slinky-57-slurmd.log"):
        conf = gres.parse_gres_conf(_text(name), name)
        assert conf.lines == ()


def test_a_time_stamped_gres_record_is_read():
    text = (
        "[2026-10-09T06:49:39.052] debug:  Gres GPU plugin: Merging configured GRES with system GPUs\n"
        "[2026-10-09T06:49:39.052] Gres Name=gpu Type=h100 Count=1 Index=0 ID=7696487 "
        "File=/dev/nvidia0 Cores=0-55 CoreCnt=112 Links=-1,0 Flags=HAS_FILE,HAS_TYPE,ENV_NVML\n"
    )
    (line,) = gres.parse_gres_conf(text, "slurmd -G").gpu_lines("any")
    assert line.files == ("/dev/nvidia0",) and line.cores == frozenset(range(56))


# -- Slurm's syntax: the gres.conf the real slurmd read ------------------------------------------


def test_gres_conf_in_every_form_reads_as_slurmd_read_it():
    """Continuation, quotes, 'Key = Value', lower-case keys, Files=, MultipleFiles=, a relative
    include (from the directory of the top file, as Slurm does): the same files and Cores that the
    real slurmd printed for node n1. Before: the include and the continued line were lost."""
    directory = CAPTURES / "slurmd-22.05.8"
    conf = gres.parse_gres_conf(
        (directory / "gres.conf").read_text(), str(directory / "gres.conf"), _reader(Path("/"))
    )
    got = {(",".join(ln.files), ln.fields.get("cores")) for ln in conf.gpu_lines("n1")}
    assert got == _slurmd_records(_text("slurmd-22.05.8/slurmd-G-n1.txt"))
    assert conf.autodetect_for("n1") == "off" and conf.autodetect_for("n2") == "nvml"
    assert conf.autodetect_for("n9") == "nvml"  # the global line
    included = [ln for ln in conf.lines if ln.where.endswith("gres-extra.conf:1")]
    assert included and included[0].files == ("/dev/tty",)


def test_comment_and_escape_rules():
    lines = conffile.logical_lines(
        "A=1 \\# not a comment # comment\nB=x\\\\ \\\n C=2\nD=3 # c \\\nE=4"
    )
    assert [text.strip() for _, text in lines] == [
        "A=1 # not a comment",
        "B=x\\  C=2",
        "D=3",
        "E=4",
    ]
    assert [number for number, _ in lines] == [1, 2, 4, 5]
    pairs, leftover = conffile.split_pairs('Name = gpu File="/dev/a b" Type+=x')
    assert pairs == (("name", "gpu"), ("file", "/dev/a b"), ("type", "x")) and leftover == ""


# -- includes: bounded, errors name the file -----------------------------------------------------


def test_an_include_loop_is_an_error_naming_the_files(tmp_path):
    (tmp_path / "gres.conf").write_text("Name=gpu File=/dev/nvidia0\ninclude a.conf\n")
    (tmp_path / "a.conf").write_text("include gres.conf\n")
    with pytest.raises(ParseError, match="include loop.*a.conf"):
        conffile.read_conf(str(tmp_path / "gres.conf"), _reader(Path("/")))


def test_a_missing_include_names_the_file_and_the_line(tmp_path):
    (tmp_path / "gres.conf").write_text("# x\ninclude nodes/gpu.conf\n")
    with pytest.raises(HostError) as caught:
        conffile.read_conf(str(tmp_path / "gres.conf"), _reader(Path("/")))
    assert "nodes/gpu.conf" in str(caught.value) and "gres.conf:2" in str(caught.value)


def test_an_unreadable_include_is_an_error_naming_it(tmp_path):
    (tmp_path / "gres.conf").write_text("include sub\n")
    (tmp_path / "sub").mkdir()
    with pytest.raises(HostError, match="sub"):
        conffile.read_conf(str(tmp_path / "gres.conf"), _reader(Path("/")))


def test_a_huge_include_or_a_device_is_refused_without_reading_it_all(tmp_path):
    (tmp_path / "gres.conf").write_text("include big.conf\n")
    with open(tmp_path / "big.conf", "wb") as handle:
        handle.truncate(conffile.MAX_BYTES * 4)  # sparse: costs no disk
    with pytest.raises(ParseError, match="bytes"):
        conffile.read_conf(str(tmp_path / "gres.conf"), _reader(Path("/")))
    (tmp_path / "gres.conf").write_text("include /dev/zero\n")
    with pytest.raises(HostError, match="not a regular file"):
        conffile.read_conf(str(tmp_path / "gres.conf"), _reader(Path("/")))


def test_deep_nesting_and_many_files_are_bounded(tmp_path):
    for depth in range(conffile.MAX_DEPTH + 3):
        (tmp_path / ("f%d.conf" % depth)).write_text("include f%d.conf\n" % (depth + 1))
    with pytest.raises(ParseError, match="nested"):
        conffile.read_conf(str(tmp_path / "f0.conf"), _reader(Path("/")))
    (tmp_path / "many.conf").write_text("include one.conf\n" * (conffile.MAX_FILES + 1))
    (tmp_path / "one.conf").write_text("Name=gpu\n")
    with pytest.raises(ParseError, match="included files"):
        conffile.read_conf(str(tmp_path / "many.conf"), _reader(Path("/")))


def test_include_is_refused_when_reading_text_only():
    with pytest.raises(ParseError, match="include"):
        gres.parse_gres_conf("include /etc/slurm/other.conf\n", "gres.conf")


# -- slurm.conf: a NodeName line continued with backslashes ---------------------------------------


def test_a_continued_nodename_line_keeps_cpuspeclist_memspeclimit_and_gres():
    """Real slurm.conf (amax-a100): before, CPUSpecList/MemSpecLimit/Gres were lost."""
    node = gres.parse_slurm_node_line(_text("sites/ncclab-amax-a100-slurm.conf"), "amax-a100")
    assert node["cpuspeclist"] == "0-31"
    assert node["memspeclimit"] == "32768"
    assert node["gres"] == "gpu:nvidia_a100_80gb_pcie:2"
    assert node["state"] == "UNKNOWN"


def test_slurm_conf_nodes_in_an_included_file(tmp_path):
    (tmp_path / "slurm.conf").write_text("ClusterName=Alpha\nInclude nodes-%c.conf\n")
    (tmp_path / "nodes-alpha.conf").write_text(
        "NodeName=DEFAULT CoresPerSocket=56\nNodeName=gpu[01-04] CPUs=224 \\\n  CpuSpecList=0,1\n"
    )
    text = (tmp_path / "slurm.conf").read_text()
    node = gres.parse_slurm_node_line(
        text, "gpu03", str(tmp_path / "slurm.conf"), _reader(Path("/"))
    )
    assert node["cpuspeclist"] == "0,1" and node["corespersocket"] == "56"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file")
def test_unreadable_include_as_non_root(tmp_path):
    (tmp_path / "slurm.conf").write_text("include secret.conf\n")
    (tmp_path / "secret.conf").write_text("NodeName=x\n")
    os.chmod(tmp_path / "secret.conf", 0)
    with pytest.raises(HostError, match="secret.conf"):
        conffile.read_conf(str(tmp_path / "slurm.conf"), _reader(Path("/")))


def test_a_hostlist_of_billions_of_names_is_refused_quickly():
    """Nested ranges multiply: n[0-99999][0-99999] is 10^10 names (before: ran until memory ran out)."""
    text = "NodeName=n[0-99999][0-99999] CpuSpecList=0-1\nNodeName=gpu01 CpuSpecList=2-3\n"
    with pytest.raises(ParseError, match="at most 100000 names"):
        gres.parse_slurm_node_line(text, "gpu01")
    assert gres.expand_hostlist("gpu[01-02]-ib[0-1]") == [
        "gpu01-ib0",
        "gpu01-ib1",
        "gpu02-ib0",
        "gpu02-ib1",
    ]


def test_many_hostlists_each_under_the_bound_are_bounded_per_file():
    """Each line's hostlist is under the bound of one (100,000 names), but 4 MiB of such lines was
    billions of names: 20 of them took 1.4 s and 150 MB, a file full of them ran out of memory."""
    gres_text = "NodeName=n[0-99999] Name=gpu File=/dev/nvidia[0-7]\n" * 11
    with pytest.raises(ParseError, match=r"at most 1000000 hostlist names in one file") as caught:
        gres.parse_gres_conf(gres_text, "/etc/slurm/gres.conf")
    assert "/etc/slurm/gres.conf:10" in str(caught.value)  # 10 x (100,000 names + 8 files)
    slurm_text = "NodeName=n[0-99999] CpuSpecList=0-1\n" * 11 + "NodeName=gpu01 CpuSpecList=2-3\n"
    with pytest.raises(ParseError, match=r"at most 1000000 hostlist names in one file"):
        gres.parse_slurm_node_line(slurm_text, "gpu01", "/etc/slurm/slurm.conf")
    # a real site's size passes: 20,000 nodes in 200 lines, 8 GPUs each
    site = "".join(
        "NodeName=r%03d-n[001-100] Name=gpu File=/dev/nvidia[0-7]\n" % r for r in range(200)
    )
    assert len(gres.parse_gres_conf(site).lines) == 200
