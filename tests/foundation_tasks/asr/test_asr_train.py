"""End to end through the engine: a tiny transducer overfits a few synthesised utterances,
and greedy (and beam) decoding of them returns their transcripts."""
from __future__ import annotations

CONFIG = """\
run_name: overfit
output_dir: {out}
seed: 0
device: cpu
backbone: {{norm: magneto, dim: 48, depth: 2, heads: 4, ffn_dim: 96, rel_pos: 1d}}
tasks:
  - name: asr
    batch_size: 1
    data_dir: {data}
    train_splits: [train]
    eval_splits: [train]        # decode what it was trained on
    vocab_size: {vocab}
    max_frames: 4000
    cache_features: true
    vgg_channels: [4, 8]
    predictor_embed_dim: 32
    predictor_dim: 48
    predictor_dropout: 0.0
    joint_dim: 48
    joint_sub_batch: 2
    aux_layers: [0]
    aux_mlp_dim: 32
    freq_masks: 0
    time_masks: 0
    hyp_dir: {out}/hyp
optim: {{lr: 5.0e-3, weight_decay: 0.0, clip_grad: 5.0}}
schedule: {{name: constant, warmup_steps: 10}}
train: {{steps: {steps}}}
log: {{progress: false, writers: [jsonl]}}
"""


def test_overfit_then_greedy_decoding_returns_the_transcripts(overfit_corpus, sentences, tmp_path, capsys,
                                                              one_thread):
    from foundation.engine.config import load_config
    from foundation.engine.loop import train

    texts = [line.split(" ", 1)[1] for p in (overfit_corpus / "train").rglob("*.trans.txt")
             for line in p.read_text().splitlines()]
    assert sorted(texts) == sorted(sentences)
    path = tmp_path / "overfit.yaml"  # 19 units: the most sentencepiece makes of four sentences
    path.write_text(CONFIG.format(out=tmp_path / "runs", data=overfit_corpus, vocab=19, steps=150))
    cfg, specs = load_config(path)
    result = train(cfg, specs)
    assert result.status == "finished"
    losses = [line for line in (result.run_dir / "metrics.jsonl").read_text().splitlines() if '"loss/asr"' in line]
    import json

    first, last = json.loads(losses[0])["asr/rnnt"], json.loads(losses[-1])["asr/rnnt"]
    assert last < 0.1 * first, (first, last)
    assert result.metrics["asr/wer_train"] == 0.0, (result.metrics, (tmp_path / "runs/hyp/train/hyp.txt").read_text())
    hyps = (tmp_path / "runs" / "hyp" / "train" / "hyp.txt").read_text().splitlines()
    assert sorted(h.split(" ", 1)[1] for h in hyps) == sorted(texts)

    # `foundation eval` with beam search on the trained checkpoint
    from foundation.engine.cli import eval_main

    assert eval_main([str(path), "tasks.asr.decoding=beam", "tasks.asr.beam_size=3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["asr/wer_train"] == 0.0
