"""benchmarks/asr_reference.py, the plain PyTorch transducer the speech recipe is held against,
runs end to end on a tiny corpus (it reads the tokenizer and CMVN statistics a recipe run wrote)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

CONFIG = """\
run_name: ref
output_dir: {out}
device: cpu
backbone: {{norm: preln, dim: 32, depth: 1, heads: 2, ffn_dim: 64}}
tasks:
  - name: asr
    batch_size: 1
    data_dir: {data}
    train_splits: [train]
    eval_splits: [train]
    vocab_size: 19
    max_frames: 4000
    cache_features: true
    vgg_channels: [4, 8]
    freq_masks: 0
    time_masks: 0
train: {{steps: 1}}
eval: {{every: 0}}
log: {{progress: false, writers: [jsonl]}}
"""


def test_the_plain_reference_trains_and_reports_a_wer(overfit_corpus, tmp_path, capsys, one_thread):
    from foundation.engine.config import load_config
    from foundation.engine.loop import train

    path = tmp_path / "asr.yaml"
    path.write_text(CONFIG.format(out=tmp_path / "runs", data=overfit_corpus))
    assert train(*load_config(path)).status == "finished"  # writes the tokenizer and the CMVN statistics
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "asr_reference.py"
    spec = importlib.util.spec_from_file_location("asr_reference", script)
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    capsys.readouterr()
    assert reference.main(["--config", str(path), "--steps", "3", "--warmup", "1", "--frontend", "vgg"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"plain PyTorch T-T, 3 steps, lr 0.004: greedy WER train \d+\.\d \(training \d+ s\)", line), line
