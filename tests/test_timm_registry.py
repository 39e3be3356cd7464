"""Our ViTs as timm models: create_model, forward_intermediates, loading our safetensors."""
import pytest
import timm
import torch

import foundation  # noqa: F401  (registers the models)
from foundation import checkpoint


@pytest.mark.parametrize("name", ["magneto_tiny_patch16_224", "preln_tiny_patch16_224"])
def test_create_model_and_intermediates(name):
    m = timm.create_model(name, num_classes=5, img_size=64, drop_path_rate=0.1).eval()
    assert m.config.backbone.norm == name.split("_")[0]
    assert m.config.backbone.drop_path == 0.1
    x = torch.randn(2, 3, 64, 64)
    assert m(x).shape == (2, 5)
    assert m.forward_head(m.forward_features(x), pre_logits=True).shape == (2, 192)
    final, inter = m.forward_intermediates(x, indices=[3, 5, 7, 11])
    assert final.shape == (2, 17, 192) and [t.shape for t in inter] == [(2, 192, 4, 4)] * 4


def test_pretrained_file_loads_our_safetensors(tmp_path):
    src = timm.create_model("magneto_tiny_patch16_224", num_classes=3, img_size=32)
    path = checkpoint.save(src, tmp_path / "magneto_tiny.safetensors")
    dst = timm.create_model(
        "magneto_tiny_patch16_224", pretrained=True, num_classes=3, img_size=32,
        pretrained_cfg_overlay=dict(file=str(path), num_classes=3),
    )
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v), k
    assert type(checkpoint.load(path)) is type(src)
    # fine-tuning on another label set: the body loads, timm gives a fresh head
    ft = timm.create_model(
        "magneto_tiny_patch16_224", pretrained=True, num_classes=10, img_size=32,
        pretrained_cfg_overlay=dict(file=str(path), num_classes=3),
    )
    assert ft.head.out_features == 10
    assert torch.equal(ft.backbone.encoder.layers[0].attn.qkv.weight, src.backbone.encoder.layers[0].attn.qkv.weight)


def test_unknown_timm_keyword_is_an_error():
    with pytest.raises(TypeError, match="unexpected keyword"):
        timm.create_model("preln_tiny_patch16_224", no_such_option=1)
