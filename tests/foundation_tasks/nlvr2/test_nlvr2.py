"""NLVR2: the reader's errors name the file and the record."""
import json

import pytest

from foundation_tasks.vl_common.images import DataError


def test_nlvr2_reader_errors_name_the_record(vl_demo_copy):
    from foundation_tasks.nlvr2.data import read_split

    data = vl_demo_copy
    assert len(read_split(data / "nlvr2", data / "nlvr2", "dev")) == 12
    path = data / "nlvr2/data/train.json"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[2])
    bad = dict(rec, label="maybe")
    path.write_text("\n".join(lines[:2] + [json.dumps(bad)] + lines[3:]))
    with pytest.raises(DataError, match=rf"train\.json:3 \({rec['identifier']}\): field 'label' must be"):
        read_split(data / "nlvr2", data / "nlvr2", "train")
    path.write_text("\n".join(lines[:2] + ['{"identifier": "x", '] + lines[3:]))
    with pytest.raises(DataError, match=r"train\.json:3: not valid JSON"):
        read_split(data / "nlvr2", data / "nlvr2", "train")
    path.write_text("\n".join(lines))
    left = rec["identifier"].rsplit("-", 1)[0]
    (data / f"nlvr2/images/train/{rec['directory']}/{left}-img1.png").unlink()
    with pytest.raises(DataError, match=rf"\({rec['identifier']}\): image not found: .*{left}-img1\.png"):
        read_split(data / "nlvr2", data / "nlvr2", "train")
