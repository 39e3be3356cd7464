"""`foundation data make NAME --out X` writes only into a folder it may fill (issue 37, item 7):
every generator refuses a non-empty folder unless --force (one flag name everywhere), and
a file or a read-only folder as --out is one line with exit status 2, before anything is
generated."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from foundation.cli import main as cli
from foundation.engine.demo_cli import demo_data_sets

GENERATORS = ["speech", "segmentation", "vision", "vl", "vqa-shifted"]


def test_every_generator_is_checked():
    assert sorted(demo_data_sets()) == sorted(GENERATORS)


def refused(capsys, name: str, out: Path, needle: str) -> None:
    capsys.readouterr()
    assert cli(["data", "make", name, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and err.startswith(f"foundation data make {name}: "), err


@pytest.mark.parametrize("name", GENERATORS)
def test_a_full_folder_a_file_and_a_read_only_folder_are_refused(tmp_path, capsys, monkeypatch, name):
    full = tmp_path / "LibriSpeech"
    full.mkdir()
    (full / "19-198.trans.txt").write_text("the user's own transcripts\n")
    refused(capsys, name, full, "is not empty; pass --force")
    assert [p.name for p in full.iterdir()] == ["19-198.trans.txt"]
    assert (full / "19-198.trans.txt").read_text() == "the user's own transcripts\n"

    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    refused(capsys, name, a_file, "is a file")
    refused(capsys, name, a_file / "sub", "Not a directory")
    assert a_file.read_text() == "x"

    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.access(read_only, os.W_OK):  # root writes anywhere: what any other user is told
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == read_only else real(p, mode, **kw))
    refused(capsys, name, read_only, "not writable")
    assert not list(read_only.iterdir())


@pytest.mark.parametrize("name, flag", [("speech", "--train-per-voice"), ("segmentation", "--val"),
                                        ("vision", "--train-per-class"), ("vl", "--nlvr2-dev"),
                                        ("vqa-shifted", "--nlvr2-train")])
def test_an_empty_split_is_refused_before_anything_is_written(tmp_path, capsys, name, flag):
    """A count of 0 items would write a split that training or evaluation then rejects: the generator says so."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        cli(["data", "make", name, "--out", str(out), flag, "0"])
    assert e.value.code == 2 and not out.exists()
    assert f"argument {flag}: must be at least 1, got 0" in capsys.readouterr().err
