"""Label budgets (``train_fraction`` / ``subset_seed``) in segmentation, ASR and VQA: a seeded,
nested fraction of the training items; the evaluation sets never change."""
from __future__ import annotations

from pathlib import Path

import pytest

from foundation.config import BackboneConfig, ConfigError, build
from foundation.engine.data import labelled_fraction

pytestmark = pytest.mark.usefixtures("one_thread")


def test_labelled_fraction_is_seeded_nested_and_sorted():
    ten = labelled_fraction(200, 0.1, seed=0)
    assert len(ten) == 20 and ten == sorted(ten) and len(set(ten)) == 20
    assert ten == labelled_fraction(200, 0.1, seed=0)  # the same seed, the same items
    assert set(ten) < set(labelled_fraction(200, 0.5, seed=0))  # budgets nest
    assert ten != labelled_fraction(200, 0.1, seed=1)
    assert labelled_fraction(5, 0.01, seed=0) != []  # at least one item
    assert labelled_fraction(7, None, seed=3) == list(range(7)) == labelled_fraction(7, 1.0, seed=3)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ConfigError, match="field 'train_fraction'"):
            labelled_fraction(10, bad, seed=0)


def test_segmentation_trains_on_a_fraction_of_the_masks(write_ade_tree):
    from foundation_tasks.segmentation.task import Segmentation, SegmentationConfig

    root = write_ade_tree(n_train=10, n_val=3, height=24, width=32)

    def task(**kw) -> Segmentation:
        cfg = build(SegmentationConfig, {"data_root": str(root), "num_classes": 8, "img_size": 16, "patch_size": 4,
                                         "abs_pos_embed": True, **kw})
        return Segmentation(cfg, BackboneConfig(dim=32, depth=2, heads=2, final_norm=False))

    def images(ds) -> list[str]:
        return [ds.dataset.get_data_info(i)["img_path"] for i in ds.indices]

    every, half = task(), task(train_fraction=0.5, subset_seed=1)
    assert len(every.train_dataset()) == 10 and len(half.train_dataset()) == 5
    assert set(images(half.train_dataset())) < set(images(every.train_dataset()))
    assert images(half.train_dataset()) == images(task(train_fraction=0.5, subset_seed=1).train_dataset())
    assert images(half.train_dataset()) != images(task(train_fraction=0.5, subset_seed=2).train_dataset())
    assert images(half.eval_dataset()) == images(every.eval_dataset()) and len(half.eval_dataset()) == 3
    item = half.train_dataset()[0]  # an item of the subset goes through the pipeline
    assert item["split"] == "train" and item["data_samples"].img_path == images(half.train_dataset())[0]
    with pytest.raises(ConfigError, match="field 'train_fraction'"):
        task(train_fraction=2.0)


def test_asr_trains_and_builds_its_tokenizer_on_a_fraction_of_the_transcripts(speech_corpus, tmp_path):
    from foundation_tasks.asr.task import ASR, ASRConfig

    def task(**kw) -> ASR:
        cfg = ASRConfig(data_dir=str(speech_corpus), train_splits=["train"], eval_splits=["dev", "test"],
                        vocab_size=30, prep_dir=str(tmp_path / "prep"), max_frames=800, **kw)
        return ASR(cfg, BackboneConfig(dim=32, depth=2, heads=4, rel_pos="1d"))

    def ids(ds) -> set[str]:
        return {uid for bucket in ds.buckets for uid in bucket}

    half = task(train_fraction=0.5, subset_seed=0)
    half.check()
    assert half.cfg.tokenizer_path.name == "unigram30-frac0.5-s0.model" and half.cfg.tokenizer_path.is_file()
    labelled = {u.id for u in half.labelled_utterances()}
    assert len(labelled) == 16 and ids(half.train_dataset()) == labelled  # 32 training utterances
    every = task()
    every.prepare()  # its own tokenizer, of every transcript; the CMVN statistics (audio only) are shared
    assert ids(every.train_dataset()) > labelled
    assert ids(half.eval_dataset()) == ids(every.eval_dataset())
    other = task(train_fraction=0.5, subset_seed=1)
    assert {u.id for u in other.labelled_utterances()} != labelled
    assert other.cfg.tokenizer_path != half.cfg.tokenizer_path  # its transcripts, its tokenizer
    with pytest.raises(ConfigError, match="field 'train_fraction'"):
        task(train_fraction=0.0)


def test_vqa_trains_on_a_fraction_of_the_questions_and_their_answers(vl_demo):
    from foundation_tasks.vqa.task import VQA, VQAConfig

    def task(**kw) -> VQA:
        cfg = build(VQAConfig, {"data_dir": str(Path(vl_demo) / "vqa"), "min_answer_count": 1, "img_size": 16,
                                "patch_size": 8, **kw})
        return VQA(cfg, BackboneConfig(dim=32, depth=2, heads=2, experts=["vision", "text"]))

    def qids(ds) -> list[int]:
        return [q.question_id for q in ds.questions]

    every, tenth = task(), task(train_fraction=0.1, subset_seed=0)
    n = len(every.train_dataset())
    assert len(tenth.train_dataset()) == round(0.1 * n)
    assert set(qids(tenth.train_dataset())) < set(qids(every.train_dataset()))
    assert set(qids(tenth.train_dataset())) < set(qids(task(train_fraction=0.3, subset_seed=0).train_dataset()))
    assert qids(tenth.eval_dataset()) == qids(every.eval_dataset())
    # the answer vocabulary is the labelled questions' answers only
    seen = {a for q in tenth.train_dataset().questions for a in q.answers}
    assert set(tenth.cfg.answers) <= seen and set(tenth.cfg.answers) <= set(every.cfg.answers)
