"""safetensors checkpoints: exact round trips, strict loading that changes nothing on a
mismatch, clear errors for broken files, atomic saves, tied weights."""
import json
import os
import sys
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import foundation.checkpoint as ckpt
from foundation.checkpoint import (
    MODEL_KINDS, CheckpointError, load, load_state_into, read_config, register_model_kind, save,
)
from foundation.config import BackboneConfig, build
from foundation.transformer import Backbone


def tiny_config(**fields) -> BackboneConfig:
    base = dict(dim=32, depth=2, heads=4, ffn_dim=64, norm="magneto", experts=["vision", "text"], rel_pos="1d")
    return BackboneConfig(**{**base, **fields})


def random_backbone(seed: int = 0, **fields) -> Backbone:
    torch.manual_seed(seed)
    model = Backbone(tiny_config(**fields))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k in before:
        assert torch.equal(after[k], before[k]), f"{k} changed"


# --------------------------------------------------------------------------- round trips


def test_round_trip_is_exact(tmp_path):
    model = random_backbone()
    path = save(model, tmp_path / "m.safetensors")
    loaded = load(path)
    assert type(loaded) is Backbone
    assert loaded.config == model.config
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    x = torch.randn(2, 6, 32)
    segments = [("vision", 4), ("text", 2)]
    with torch.no_grad():
        assert torch.equal(model(x, segments=segments), loaded.eval()(x, segments=segments))
    kind, config = read_config(path)
    assert kind == "Backbone" and config == model.config


def test_metadata_holds_kind_and_config(tmp_path):
    from safetensors import safe_open

    path = save(random_backbone(), tmp_path / "m.safetensors")
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["foundation.kind"] == "Backbone"
    assert json.loads(meta["foundation.config"])["experts"] == ["vision", "text"]


def test_vision_transformer_round_trip(tmp_path):
    from foundation.vit import VisionTransformer, ViTConfig

    torch.manual_seed(0)
    cfg = ViTConfig(backbone=BackboneConfig(dim=16, depth=1, heads=2, norm="preln"), img_size=16,
                    patch_size=8, num_classes=3)
    model = VisionTransformer(cfg).eval()
    loaded = load(save(model, tmp_path / "vit.safetensors")).eval()
    assert type(loaded) is VisionTransformer and loaded.config == cfg
    images = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(model(images), loaded(images))


# --------------------------------------------------------------------------- tied weights


@dataclass
class TiedConfig:
    dim: int = 8


class TiedModel(nn.Module):
    """Embedding and output layer sharing one matrix, plus a non-contiguous view buffer."""

    def __init__(self, config: TiedConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(5, config.dim)
        self.out = nn.Linear(config.dim, 5, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("transposed", torch.arange(config.dim * 2.0).view(2, config.dim).t())


register_model_kind("test.TiedModel", TiedModel, TiedConfig, lambda d: build(TiedConfig, d))


def test_tied_and_non_contiguous_tensors(tmp_path):
    torch.manual_seed(0)
    model = TiedModel(TiedConfig())
    path = save(model, tmp_path / "tied.safetensors")
    loaded = load(path)
    assert loaded.out.weight is loaded.embed.weight  # still tied after loading
    assert torch.equal(loaded.embed.weight, model.embed.weight)
    assert torch.equal(loaded.transposed, model.transposed)


def test_registry():
    assert MODEL_KINDS["Backbone"].model_cls is Backbone
    with pytest.raises(ValueError, match="already registered"):
        register_model_kind("Backbone", TiedModel, TiedConfig)
    register_model_kind("Backbone", Backbone, BackboneConfig)  # same class again: fine


def test_unregistered_model_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="register_model_kind"):
        save(nn.Linear(2, 2), tmp_path / "x.safetensors")
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- broken files


def _saved(tmp_path) -> Path:
    return save(random_backbone(seed=1), tmp_path / "good.safetensors")


@pytest.mark.parametrize("corrupt", ["truncated", "random", "empty"])
def test_corrupted_file(tmp_path, corrupt):
    data = _saved(tmp_path).read_bytes()
    bad = tmp_path / f"{corrupt}.safetensors"
    bad.write_bytes({"truncated": data[: len(data) // 2], "random": os.urandom(4096), "empty": b""}[corrupt])
    with pytest.raises(CheckpointError, match=re.escape(str(bad))):
        load(bad)
    model = random_backbone()
    before = snapshot(model)
    with pytest.raises(CheckpointError, match=re.escape(str(bad))):
        load_state_into(model, bad)
    assert_unchanged(model, before)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        load(tmp_path / "nope.safetensors")


def test_file_without_metadata(tmp_path):
    model = random_backbone()
    plain = tmp_path / "plain.safetensors"
    save_file(model.state_dict(), str(plain))
    with pytest.raises(CheckpointError, match=re.escape(str(plain)) + ".*metadata"):
        load(plain)
    other = random_backbone(seed=5)
    load_state_into(other, plain)  # weights alone still load into a built model
    assert torch.equal(other.encoder.rel_pos.table, model.encoder.rel_pos.table)


@pytest.mark.parametrize("meta, needle", [
    ({"foundation.kind": "Backbone", "foundation.config": json.dumps({"dim": 32, "heads": 5})}, "heads"),
    ({"foundation.kind": "Backbone", "foundation.config": json.dumps({"no_such_field": 1})}, "no_such_field"),
    ({"foundation.kind": "Backbone", "foundation.config": "{not json"}, "JSON"),
    ({"foundation.kind": "Unheard", "foundation.config": "{}"}, "unknown model kind 'Unheard'"),
    ({"foundation.kind": "Backbone", "foundation.config": "{}", "foundation.format": "99"}, "format"),
])
def test_wrong_metadata(tmp_path, meta, needle):
    path = tmp_path / "meta.safetensors"
    save_file(random_backbone().state_dict(), str(path), metadata=meta)
    with pytest.raises(CheckpointError) as err:
        load(path)
    assert str(path) in str(err.value) and needle in str(err.value)


def test_prediction_metadata_round_trip(tmp_path):
    """What ``export_meta`` returns (JSON values and bytes) comes back from the file, is kept
    on the loaded model and written again when that model is saved."""
    meta = {"cls": {"classes": ["cat", "dog"], "mean": [0.5, 0.5, 0.5], "spm": bytes(range(256)) * 3}}
    model = random_backbone()
    model.export_meta = lambda: meta
    path = save(model, tmp_path / "m.safetensors")
    assert ckpt.read_meta(path) == meta
    loaded = load(path)
    assert loaded.saved_meta == meta and isinstance(loaded.saved_meta["cls"]["spm"], bytes)
    assert ckpt.read_meta(save(loaded, tmp_path / "again.safetensors")) == meta
    plain = save(random_backbone(), tmp_path / "plain.safetensors")
    assert ckpt.read_meta(plain) == {} and load(plain).saved_meta == {}
    model.export_meta = lambda: {"cls": {"array": torch.zeros(2)}}
    with pytest.raises(TypeError, match="Tensor is not JSON or bytes"):
        save(model, tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()


def test_broken_prediction_metadata_names_the_file(tmp_path):
    path = tmp_path / "meta.safetensors"
    save_file(random_backbone().state_dict(), str(path), metadata={"foundation.meta": "{oops"})
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ".*foundation.meta.*not valid JSON"):
        ckpt.read_meta(path)


def test_run_files_load_with_no_import_first(tmp_path):
    """A run's MultiTaskModel is a kind of the foundation package: a fresh interpreter
    loads one with nothing imported but foundation.checkpoint (its tasks found by name)."""
    import subprocess
    import sys

    from foundation.engine.model import ModelConfig, MultiTaskModel

    model = MultiTaskModel(ModelConfig(backbone=BackboneConfig(dim=16, depth=1, heads=2, ffn_dim=32,
                                                               arch="encoder_decoder"),
                                       tasks=[{"name": "seq2seq", "problem": "reverse"}]))
    path = save(model, tmp_path / "run.safetensors")
    code = f"from foundation import checkpoint; print(type(checkpoint.load(r'{path}')).__name__)"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "MultiTaskModel"


def test_a_file_names_the_module_of_its_kind_and_only_project_modules_are_imported(tmp_path):
    """``load`` imports the module a file names for an unknown kind, but only inside this
    project's packages: a file naming any other module gets the unknown-kind error."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from foundation import checkpoint

    path = save(random_backbone(), tmp_path / "b.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    assert meta[checkpoint.META_MODULE] == "foundation.transformer"
    forged = tmp_path / "forged.safetensors"
    save_file(tensors, str(forged), metadata={**meta, checkpoint.META_KIND: "Evil",
                                             checkpoint.META_MODULE: "antigravity"})
    with pytest.raises(CheckpointError, match="unknown model kind 'Evil'"):
        checkpoint.load(forged)
    assert "antigravity" not in sys.modules


# --------------------------------------------------------------------------- forged files


def _forged(tmp_path, **config) -> Path:
    """A real tiny Backbone's file (0.1 MB) whose metadata's config is edited."""
    from safetensors import safe_open

    path = save(random_backbone(), tmp_path / "real.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    forged = tmp_path / "forged.safetensors"
    save_file(tensors, str(forged), metadata={**meta, ckpt.META_CONFIG: json.dumps({**json.loads(
        meta[ckpt.META_CONFIG]), **config})})
    return forged


@pytest.mark.parametrize("config, needle", [
    ({"dim": 4096, "ffn_dim": 16384}, "layers.0.norm1.vision.weight: the config builds (4096,), the file holds (32,)"),
    ({"depth": 10 ** 7}, "asks for 10000000 backbone layers, but the file holds"),
    ({"rel_pos": "2d", "rel_pos_grid": [32, 3000000]}, "encoder.rel_pos.table: the config builds (377999940, 4)"),
    ({"depth": 3}, "encoder.layers.2.norm1.vision.weight: the config builds (32,), the file has no such tensor"),
])
def test_a_forged_config_is_refused_before_anything_is_built(tmp_path, monkeypatch, config, needle):
    """The config in a file's metadata is checked against its tensors' shapes on the meta
    device: a 0.1 MB file that says dim: 4096 (or 10 million layers, or a 32 x 3,000,000
    patch grid) is one line naming the file and the tensor, and no real model is built."""
    forged = _forged(tmp_path, **config)
    real_init = Backbone.__init__

    def only_on_meta(self, cfg):
        assert torch.empty(0).device.type == "meta", f"a {cfg.dim}-wide, {cfg.depth}-layer backbone built for real"
        real_init(self, cfg)

    monkeypatch.setattr(Backbone, "__init__", only_on_meta)
    for read in (load, read_config):
        with pytest.raises(CheckpointError) as err:
            read(forged)
        assert str(err.value).startswith(f"{forged}: ") and needle in str(err.value) and "\n" not in str(err.value)


def test_a_forged_width_is_one_line_under_a_memory_cap(tmp_path):
    """dim: 32768 asked for 12.9 GB in one allocation: a traceback under a memory cap; now the
    file is refused by `foundation predict` in one line, well inside 8 GB of address space."""
    import resource
    import subprocess

    forged = _forged(tmp_path, dim=32768)
    image = tmp_path / "x.png"
    image.write_bytes(b"")

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "foundation.cli", "predict", str(forged), str(image)],
                          capture_output=True, text=True, cwd=root, timeout=300, preexec_fn=cap,
                          env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and str(forged) in done.stderr and "builds (32768,)" in done.stderr


# --------------------------------------------------------------------------- strict loading


def test_state_dict_mismatches_are_listed_and_change_nothing():
    model = random_backbone()
    before = snapshot(model)
    source = {k: torch.zeros_like(v) for k, v in random_backbone(seed=2).state_dict().items()}
    missing = "encoder.layers.0.attn.norm.text.bias"
    del source[missing]
    source["encoder.layers.9.extra.weight"] = torch.zeros(3)
    source["encoder.layers.1.mlp.vision.fc1.weight"] = torch.zeros(65, 32)
    with pytest.raises(CheckpointError) as err:
        load_state_into(model, source)
    msg = str(err.value)
    assert missing in msg
    assert "encoder.layers.9.extra.weight" in msg
    assert "encoder.layers.1.mlp.vision.fc1.weight: checkpoint (65, 32) vs model (64, 32)" in msg
    assert_unchanged(model, before)  # nothing copied, not even the keys that fit


@pytest.mark.parametrize("edit, needle", [
    (lambda sd: sd.pop("encoder.rel_pos.table"), "missing key(s): encoder.rel_pos.table"),
    (lambda sd: sd.__setitem__("head.weight", torch.zeros(2)), "unexpected key(s): head.weight"),
    (lambda sd: sd.__setitem__("encoder.norm.text.weight", torch.zeros(31)),
     "encoder.norm.text.weight: checkpoint (31,) vs model (32,)"),
])
def test_each_kind_of_mismatch(edit, needle):
    model = random_backbone()
    before = snapshot(model)
    source = dict(random_backbone(seed=3).state_dict())
    edit(source)
    with pytest.raises(CheckpointError, match="state dict does not fit Backbone") as err:
        load_state_into(model, source)
    assert needle in str(err.value)
    assert_unchanged(model, before)


def test_mismatched_file_names_the_file(tmp_path):
    path = save(random_backbone(norm="preln"), tmp_path / "preln.safetensors")  # no Sub-LN weights
    model = random_backbone()
    before = snapshot(model)
    with pytest.raises(CheckpointError) as err:
        load_state_into(model, path)
    assert str(path) in str(err.value) and "encoder.layers.0.mlp.vision.norm.weight" in str(err.value)
    assert_unchanged(model, before)


def test_load_state_into_succeeds():
    model, source = random_backbone(), random_backbone(seed=4)
    load_state_into(model, source.state_dict())
    key = "encoder.layers.1.attn.qkv.text.weight"
    assert torch.equal(model.state_dict()[key], source.state_dict()[key])


# --------------------------------------------------------------------------- atomic save


def _failing_save_file(tensors, filename, metadata=None):
    with open(filename, "wb") as f:
        f.write(b"partial garbage")
    raise OSError("disk full (simulated)")


def test_failing_save_keeps_the_old_file(tmp_path, monkeypatch):
    path = _saved(tmp_path)
    old = path.read_bytes()
    monkeypatch.setattr(ckpt.format, "save_file", _failing_save_file)
    with pytest.raises(OSError, match="disk full"):
        save(random_backbone(seed=7), path)
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary left behind
    load(path)


def test_failing_save_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt.format, "save_file", _failing_save_file)
    with pytest.raises(OSError):
        save(random_backbone(), tmp_path / "new.safetensors")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_saved_files_get_the_umask_mode_and_importing_changes_no_umask(tmp_path, umask):
    """A saved file has the mode any new file gets (0666 less the umask, not mkstemp's 0600),
    and importing the package leaves the process umask alone."""
    import subprocess

    code = ("import os; os.umask(0o027); import foundation.checkpoint; "
            "u = os.umask(0); print(oct(u))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0o27"
    before = os.umask(umask)
    try:
        path = save(random_backbone(), tmp_path / "m.safetensors")
        text = tmp_path / "t.txt"
        ckpt.atomic_write(text, lambda tmp: Path(tmp).write_text("hi"))
    finally:
        os.umask(before)
    for p in (path, text):
        assert p.stat().st_mode & 0o777 == 0o666 & ~umask
    assert text.read_text() == "hi"


def test_save_replaces_an_existing_file(tmp_path):
    path = _saved(tmp_path)
    model = random_backbone(seed=8)
    save(model, path)
    assert torch.equal(load(path).encoder.rel_pos.table, model.encoder.rel_pos.table)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_loading_a_different_norm_is_refused(tmp_path):
    from foundation import Backbone, BackboneConfig
    from foundation.checkpoint import CheckpointError, load_state_into, save

    # same keys and shapes: Pre-LN without its final LN vs Post-LN
    pre = Backbone(BackboneConfig(dim=32, depth=2, heads=4, norm="preln", final_norm=False))
    post = Backbone(BackboneConfig(dim=32, depth=2, heads=4, norm="postln"))
    save(pre, tmp_path / "pre.safetensors")
    before = {k: v.clone() for k, v in post.state_dict().items()}
    with pytest.raises(CheckpointError, match="norm: checkpoint 'preln' vs model 'postln'"):
        load_state_into(post, tmp_path / "pre.safetensors")
    assert all(torch.equal(before[k], v) for k, v in post.state_dict().items())
