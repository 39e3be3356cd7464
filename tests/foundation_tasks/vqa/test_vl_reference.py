"""``benchmarks/vl_reference.py``'s label budget and plain VL pretraining, on a tiny demo set: the
masked word is a content word where the caption has one, VQA starts from every pretrained weight
but the output layer, and the whole path runs from the command line."""
import pytest
import torch

from support import load_benchmark

ref = load_benchmark("vl_reference")


def test_the_mask_falls_on_a_content_word_where_there_is_one():
    vocab = ref.Vocab(["A red circle and a blue square.", "Some picture."])
    ids = vocab.encode(["A red circle and a blue square.", "Some picture."])
    choose = ref.maskable(ids, vocab, ["red", "blue", "circle", "square"])
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        x, at, target = ref.mask_one(ids, choose, g, vocab.index["<mask>"])
        words = {i: w for w, i in vocab.index.items()}
        assert words[int(target[0])] in {"red", "blue", "circle", "square"}
        assert words[int(target[1])] in {"some", "picture"}  # no content word: any word
        assert (x == vocab.index["<mask>"]).sum(1).tolist() == [1, 1] and torch.equal(x[0, at[0]], torch.tensor(2))


def test_vqa_starts_from_every_pretrained_weight_but_the_output_layer():
    pre, vqa = ref.FiLMNet(30, 30), ref.FiLMNet(30, 7)
    assert ref.start_from(vqa, pre.state_dict()) == ["head.2.bias", "head.2.weight"]
    assert torch.equal(vqa.stem[0].weight, pre.stem[0].weight) and torch.equal(vqa.embed.weight, pre.embed.weight)
    assert torch.equal(vqa.stem[1].running_mean, pre.stem[1].running_mean)


def test_pretrain_then_vqa_on_a_label_budget(vl_demo, capsys):
    demo = vl_demo
    assert ref.main(["vqa", str(demo / "vqa"), "--steps", "3", "--batch-size", "4", "--train-fraction", "0.5",
                     "--pretrain", str(demo / "coco/annotations/captions_train2014.json"),
                     "--pretrain-steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "pretrained 3 steps of 4 on 24 captions" in out and "vqa reference" in out
    with pytest.raises(SystemExit):
        ref.main(["nlvr2", str(demo / "nlvr2"), "--train-fraction", "0.5"])
