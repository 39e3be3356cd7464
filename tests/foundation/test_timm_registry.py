"""Our ViTs as timm models, used the way a timm user would: create_model and its keywords,
parameter counts against timm's own ViTs, features_only, forward_intermediates,
grad checkpointing, timm's optimizer factory, and loading our safetensors (and a
classification run exported with `foundation export timm`)."""
import pytest
import timm
import torch
from timm.optim import create_optimizer_v2

import foundation  # noqa: F401  (registers the models)
from foundation import checkpoint
from foundation.checkpoint.timm import from_timm


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("size", ["tiny", "small", "base", "large"])
def test_sizes_are_vits_plus_the_sub_ln_norms(size):
    with torch.device("meta"):  # no memory, no init time: only the shapes matter here
        vit = timm.create_model(f"vit_{size}_patch16_224")
        preln = timm.create_model(f"preln_{size}_patch16_224")
        magneto = timm.create_model(f"magneto_{size}_patch16_224")
    dim, depth = vit.embed_dim, len(vit.blocks)
    assert n_params(preln) == n_params(vit)
    # Sub-LN: one LayerNorm (dim) before the attention output, one (4 x dim) before fc2, per block
    assert n_params(magneto) == n_params(vit) + depth * 2 * (dim + 4 * dim)
    assert magneto.backbone.config.ffn_dim == 4 * dim


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


KEYWORDS = [dict(patch_size=8, img_size=32), dict(qkv_bias=False), dict(global_pool="avg", num_classes=7),
            dict(class_token=False, global_pool="avg"), dict(mlp_ratio=2.0, embed_dim=96, depth=3, num_heads=2),
            dict(init_values=0.1), dict(num_classes=0), dict(global_pool="max", fc_norm=False)]


@pytest.mark.parametrize("kw", KEYWORDS, ids=[",".join(k) for k in KEYWORDS])
def test_create_model_keywords_as_on_timms_vit(kw):
    torch.manual_seed(0)
    theirs = timm.create_model("vit_tiny_patch16_224", **kw).eval()
    ours = timm.create_model("preln_tiny_patch16_224", **kw).eval()
    assert n_params(ours) == n_params(theirs)
    x = torch.randn(2, 3, *theirs.patch_embed.img_size)
    with torch.no_grad():
        if kw.get("global_pool") == "max":  # from_timm converts token / avg pooling only: shapes
            assert ours(x).shape == theirs(x).shape
            return
        # the same architecture: timm's weights, converted, load and compute timm's outputs
        ours.load_state_dict(from_timm(theirs).state_dict())
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)


def test_no_pooling_is_a_per_token_head():
    m = timm.create_model("preln_tiny_patch16_224", img_size=32, global_pool="", num_classes=3)
    ref = timm.create_model("vit_tiny_patch16_224", img_size=32, global_pool="", num_classes=3)
    x = torch.randn(2, 3, 32, 32)
    assert m(x).shape == ref(x).shape == (2, 5, 3)


def test_forward_intermediates_matches_timms_signature_and_results():
    torch.manual_seed(0)
    theirs = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=4).eval()
    ours = from_timm(theirs).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for kw in [dict(indices=2), dict(indices=[0, -2], norm=True, stop_early=True),
                   dict(indices=[1], output_fmt="NLC", intermediates_only=True),
                   dict(indices=[1, 2], return_prefix_tokens=True, stop_early=True),
                   dict(indices=[3], output_dict=True, return_prefix_tokens=True)]:
            a, b = theirs.forward_intermediates(x, **kw), ours.forward_intermediates(x, **kw)
            torch.testing.assert_close(b, a, atol=1e-5, rtol=0, msg=lambda m: f"{kw}: {m}")
        # timm's get_intermediate_layers-style pruning: blocks after the last index go
        assert ours.prune_intermediate_layers([1]) == [1] and len(ours.blocks) == 2
        assert theirs.prune_intermediate_layers([1]) == [1]
        torch.testing.assert_close(ours.forward_intermediates(x, [1], intermediates_only=True),
                                   theirs.forward_intermediates(x, [1], intermediates_only=True), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["magneto_tiny_patch16_224", "vit_tiny_patch16_224"])
def test_features_only(name):
    f = timm.create_model(name, features_only=True, out_indices=(1, 3), img_size=64, depth=6)
    feats = f(torch.randn(2, 3, 64, 64))
    assert [t.shape for t in feats] == [(2, 192, 4, 4)] * 2
    assert f.feature_info.channels() == [192, 192] and f.feature_info.reduction() == [16, 16]
    assert len(f.model.blocks) == 4  # pruned after the last index, as timm does


def test_grad_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    m = timm.create_model("magneto_tiny_patch16_224", img_size=32, depth=2, num_classes=3)
    x = torch.randn(2, 3, 32, 32)

    def grads():
        m.zero_grad()
        m(x).square().sum().backward()
        return {k: p.grad.clone() for k, p in m.named_parameters()}

    plain = grads()
    m.set_grad_checkpointing()
    assert m.grad_checkpointing
    checkpointed = grads()
    for k in plain:
        torch.testing.assert_close(checkpointed[k], plain[k], msg=k)


def test_timm_optimizer_factory_layer_decay_and_no_weight_decay():
    m = timm.create_model("magneto_tiny_patch16_224", img_size=32, depth=3)
    ref = timm.create_model("vit_tiny_patch16_224", img_size=32, depth=3)
    groups = create_optimizer_v2(m, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.5).param_groups
    theirs = create_optimizer_v2(ref, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.5).param_groups
    scales = lambda gs: sorted({g["lr_scale"] for g in gs})  # noqa: E731
    assert scales(groups) == scales(theirs)  # stem, 3 blocks, head: 5 depths
    named = {id(p): n for n, p in m.named_parameters()}
    decayed = {named[id(p)] for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert "pos_embed" not in decayed and "cls_token" not in decayed
    assert "backbone.encoder.layers.0.attn.qkv.weight" in decayed
    stem = next(g for g in groups if any(named[id(p)] == "pos_embed" for p in g["params"]))
    assert stem["lr_scale"] == min(scales(groups))


def test_pretrained_file_loads_our_safetensors(tmp_path):
    src = timm.create_model("magneto_tiny_patch16_224", num_classes=3, img_size=32, depth=2)
    path = checkpoint.save(src, tmp_path / "magneto_tiny.safetensors")
    # the file's architecture is the default: no sizes needed
    dst = timm.create_model("magneto_tiny_patch16_224", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v), k
    # ... and the same sizes given explicitly load the same
    same = timm.create_model("magneto_tiny_patch16_224", pretrained=True, num_classes=3, img_size=32, depth=2,
                             pretrained_cfg_overlay=dict(file=str(path)))
    assert torch.equal(same.head.weight, src.head.weight)
    assert type(checkpoint.load(path)) is type(src)
    # fine-tuning on another label set at another resolution: the body loads (positions
    # resampled), timm gives a fresh head
    ft = timm.create_model("magneto_tiny_patch16_224", pretrained=True, num_classes=10, img_size=64,
                           pretrained_cfg_overlay=dict(file=str(path)))
    assert ft.head.out_features == 10 and ft.pos_embed.shape[1] == 1 + 16
    assert torch.equal(ft.backbone.encoder.layers[0].attn.qkv.weight, src.backbone.encoder.layers[0].attn.qkv.weight)
    # a size that does not fit is an error naming the tensors, never a half-load
    with pytest.raises(ValueError, match="does not fit.*shape"):
        timm.create_model("magneto_tiny_patch16_224", pretrained=True, embed_dim=96, num_heads=3,
                          pretrained_cfg_overlay=dict(file=str(path)))
    with pytest.raises(ValueError, match="create it as magneto_tiny"):
        timm.create_model("preln_tiny_patch16_224", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))


def test_unknown_timm_keyword_is_an_error():
    with pytest.raises(TypeError, match="unexpected keyword"):
        timm.create_model("preln_tiny_patch16_224", no_such_option=1)
    with pytest.raises(TypeError, match="reg_tokens"):
        timm.create_model("preln_tiny_patch16_224", reg_tokens=4)


def test_classification_run_exports_to_timm(tmp_path, capsys, one_thread):
    """A fine-tuned run -> `foundation export timm` -> timm.create_model(pretrained=True):
    the same logits as the run's own head."""
    from omegaconf import OmegaConf

    from foundation.cli import main as cli
    from foundation.engine.config import resolve
    from foundation.engine.loop import train
    from foundation_tasks.classification import demo

    data = tmp_path / "data"
    demo.write_dataset(data, seed=0, size=16, train_per_class=4, val_per_class=2, num_classes=3)
    cfg = {"run_name": "ft", "output_dir": str(tmp_path), "backbone": {"dim": 32, "depth": 2, "heads": 2},
           "tasks": [{"name": "classification", "data_dir": str(data), "num_classes": 3, "img_size": 16,
                      "patch_size": 4, "mixup": 0, "cutmix": 0}],
           "train": {"steps": 2, "batch_size": 4}, "log": {"progress": False, "writers": ["jsonl"]}}
    run = train(*resolve(OmegaConf.create(cfg)))
    assert run.status == "finished"
    # a run's file is not a timm file: the error says what to do
    with pytest.raises(ValueError, match="foundation export timm"):
        timm.create_model("magneto_tiny_patch16_224", pretrained=True,
                          pretrained_cfg_overlay=dict(file=str(run.run_dir / "best" / "model.safetensors")))
    out = tmp_path / "ft_timm.safetensors"
    assert cli(["export", "timm", str(run.run_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "timm.create_model('magneto_tiny_patch16_224', pretrained=True" in printed
    model = timm.create_model("magneto_tiny_patch16_224", pretrained=True,
                              pretrained_cfg_overlay=dict(file=str(out))).eval()
    trained = checkpoint.load(run.run_dir / "best" / "model.safetensors").eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), trained.heads["classification"].logits(trained.backbone, x))
    # with its sizes spelled out, as a timm user would
    sized = timm.create_model("magneto_tiny_patch16_224", pretrained=True, embed_dim=32, depth=2, num_heads=2,
                              patch_size=4, img_size=16, num_classes=3, pretrained_cfg_overlay=dict(file=str(out)))
    assert torch.equal(sized.head.weight, model.head.weight)
    assert cli(["export", "timm", str(tmp_path / "nothing"), "--out", str(out)]) == 2


def test_export_never_replaces_a_file_unless_told(tmp_path, capsys):
    """An existing --out is refused without --force, the exported file itself always, and a
    folder as --out is one line, not a traceback."""
    from foundation.cli import main as cli
    from foundation.config import BackboneConfig
    from foundation.vit import VisionTransformer, ViTConfig

    cfg = ViTConfig(backbone=BackboneConfig(dim=16, depth=1, heads=2, norm="preln"), img_size=16, patch_size=8,
                    num_classes=3)
    source = checkpoint.save(VisionTransformer(cfg), tmp_path / "run.safetensors")
    kept, out = source.read_bytes(), tmp_path / "out.safetensors"
    out.write_bytes(b"the user's file")

    def refused(*args: str, needle: str) -> None:
        capsys.readouterr()
        assert cli(["export", "timm", str(source), *args]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err

    refused("--out", str(out), needle="already exists; pass --force")
    assert out.read_bytes() == b"the user's file"
    for force in ([], ["--force"]):
        refused("--out", str(source), *force, needle="is the model file being exported")
    assert source.read_bytes() == kept
    refused("--out", str(tmp_path), needle="is a folder")
    assert cli(["export", "timm", str(source), "--out", str(out), "--force"]) == 0
    assert checkpoint.read_config(out)[1] == cfg
