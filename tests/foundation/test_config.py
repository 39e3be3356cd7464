"""BackboneConfig: combinations that would be silently ignored are errors naming the field,
and every shipped config still loads, under every norm rule."""
from pathlib import Path

import pytest

from foundation.config import BackboneConfig, ConfigError, build, read_mapping
from foundation.engine.config import load_config
from foundation.scaling import NORMS, RULES

REPO = Path(__file__).resolve().parents[2]
BASE = dict(dim=16, depth=2, heads=2)


@pytest.mark.parametrize("fields, field", [
    (dict(norm="postln", final_norm=True), "final_norm"),
    (dict(norm="deepnorm", final_norm=True), "final_norm"),
    (dict(shared_attention=True), "shared_attention"),
    (dict(rel_pos_grid=[4, 4]), "rel_pos_grid"),
    (dict(rel_pos="1d", rel_pos_grid=[4, 4]), "rel_pos_grid"),
    (dict(norm="preln", residual_scale=0.974), "residual_scale"),
    (dict(norm="magneto", residual_scale=0.974), "residual_scale"),
])
def test_ignored_combinations_are_errors_naming_the_field(fields, field):
    with pytest.raises(ConfigError, match=f"field '{field}'"):
        BackboneConfig(**BASE, **fields)
    with pytest.raises(ConfigError, match=f"field '{field}'"):  # a YAML's backbone section
        build(BackboneConfig, {**BASE, **fields})


def test_meaningful_combinations_stay_valid():
    for norm in ("preln", "magneto"):
        assert not BackboneConfig(**BASE, norm=norm, final_norm=False).has_final_norm
        assert BackboneConfig(**BASE, norm=norm).has_final_norm
        assert BackboneConfig(**BASE, norm=norm, final_norm=True).has_final_norm
    for norm in ("postln", "deepnorm"):  # what these rules do anyway: no LayerNorm after the last layer's own
        assert not BackboneConfig(**BASE, norm=norm, final_norm=False).has_final_norm
        assert not BackboneConfig(**BASE, norm=norm).has_final_norm
    BackboneConfig(**BASE, norm="postln", residual_scale=0.974)
    BackboneConfig(**BASE, norm="deepnorm", residual_scale=2.0)
    BackboneConfig(**BASE, experts=["vision", "text"], shared_attention=True)
    BackboneConfig(**BASE, rel_pos="2d", rel_pos_grid=[4, 4])
    cfg = BackboneConfig(**BASE, norm="postln")
    assert BackboneConfig.from_dict(cfg.to_dict()) == cfg  # a saved config loads back


def test_the_rules_are_described_once():
    assert set(RULES) == set(NORMS) == {"preln", "postln", "magneto", "deepnorm"}
    assert [n for n in NORMS if RULES[n].pre_norm] == ["preln", "magneto"]
    assert [n for n in NORMS if RULES[n].sub_ln] == ["magneto"]
    assert [n for n in NORMS if not RULES[n].scale_cross] == ["magneto"]
    assert all(RULES[n].final_norm == RULES[n].pre_norm for n in NORMS)


BACKBONE_FILES = sorted((REPO / "configs" / "backbone").glob("*.yaml"))
TRAIN_FILES = sorted(p for p in (REPO / "configs").rglob("*.yaml") if p.parent.name != "backbone")


def test_there_are_configs():
    assert BACKBONE_FILES and len(TRAIN_FILES) > 20


@pytest.mark.parametrize("path", BACKBONE_FILES, ids=lambda p: p.stem)
def test_shipped_backbone_configs_load(path):
    BackboneConfig.from_yaml(path)


@pytest.mark.parametrize("path", TRAIN_FILES, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_shipped_training_configs_load_under_every_rule(path):
    """As shipped (data files aside: the demo data is not made here), and their backbone
    section with each rule (what ``foundation compare --norms`` does); a backbone that asks for
    a final LayerNorm runs with the pre-norm rules only."""
    try:
        load_config(path, ["init_from=null"], check_data=False)
    except ConfigError as e:
        if "not found" not in str(e):
            raise
    backbone = dict(read_mapping(path).get("backbone") or {})
    for norm in NORMS:
        fields = {**backbone, "norm": norm}
        if not backbone.get("final_norm") or RULES[norm].pre_norm:
            assert build(BackboneConfig, fields).norm == norm
        else:
            with pytest.raises(ConfigError, match="field 'final_norm'"):
                build(BackboneConfig, fields)


def test_one_yaml_reader_for_every_config(tmp_path):
    """BackboneConfig, ViTConfig and the training config read YAML and overrides the same way."""
    from foundation.config import read_yaml
    from foundation.vit import ViTConfig

    (tmp_path / "b.yaml").write_text("dim: 32\ndepth: 2\nheads: 4\nlayer_scale: 0.1\n")
    cfg = BackboneConfig.from_yaml(tmp_path / "b.yaml", ["depth=3", "~layer_scale"])
    assert (cfg.depth, cfg.layer_scale) == (3, None)
    (tmp_path / "v.yaml").write_text("img_size: 32\npatch_size: 8\nbackbone: {dim: 32, depth: 2, heads: 4}\n")
    vit = ViTConfig.from_yaml(tmp_path / "v.yaml", ["backbone.depth=1"])
    assert (vit.img_size, vit.backbone.depth, vit.backbone.ffn_dim) == (32, 1, 128)
    (tmp_path / "bad.yaml").write_text("hello\n")
    for load in (BackboneConfig.from_yaml, ViTConfig.from_yaml):
        with pytest.raises(ConfigError, match="a bare string"):
            load(tmp_path / "bad.yaml")
    (tmp_path / "t.yaml").write_text("tasks:\n  - {name: seq2seq, problem: reverse}\n  - {name: asr, id: speech}\n")
    raw = read_yaml(tmp_path / "t.yaml", ["tasks.seq2seq.problem=sort", "~tasks.speech"])
    assert [dict(t) for t in raw.tasks] == [{"name": "seq2seq", "problem": "sort"}]
    with pytest.raises(ConfigError, match="no task 'vqa' in the config"):
        read_yaml(tmp_path / "t.yaml", ["tasks.vqa.x=1"])


@pytest.mark.parametrize("word", ["off", "on", "yes", "no", "true", "False"])
def test_an_override_of_a_string_field_keeps_its_text_and_a_bool_field_converts_it(tmp_path, word):
    """YAML 1.1 reads off / yes / on as booleans: run_name=off named the run directory 'False'."""
    (tmp_path / "t.yaml").write_text("tasks:\n  - {name: seq2seq, problem: reverse}\n")
    cfg, _ = load_config(tmp_path / "t.yaml", [f"run_name={word}", f"log.progress={word}"], check_data=False)
    assert cfg.run_name == word and cfg.run_dir.name == word
    assert cfg.log.progress is (word.lower() in ("on", "yes", "true"))


@pytest.mark.parametrize("path", TRAIN_FILES[::4], ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_to_dict_and_yaml_are_omegaconfs_own(path):
    """``to_dict`` walks built dataclasses itself (OmegaConf wraps every list element in a node:
    seconds for a VQA v2 answer vocabulary); what it returns and writes is OmegaConf's, to the
    float an int was given as and the quoting of strings that read as numbers."""
    from omegaconf import OmegaConf

    from foundation.config import to_dict, yaml_text

    try:
        cfg, _ = load_config(path, ["init_from=null", "optim.lr=1"], check_data=False)
    except ConfigError as e:
        if "not found" not in str(e):
            raise
        pytest.skip(f"needs its data: {e}")
    cfg.tasks[0]["answers"] = ["yes", "1.0", "null", "true", "0x1f"] * 3
    reference = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    ours = to_dict(cfg)
    assert repr(ours) == repr(reference) and isinstance(ours["optim"]["lr"], float)
    assert yaml_text(ours) == OmegaConf.to_yaml(OmegaConf.create(reference))
    assert OmegaConf.to_container(OmegaConf.create(yaml_text(ours))) == ours  # read back as written


def test_importing_the_config_warns_about_nothing():
    """The ``by_norm`` resolver registers through the installed omegaconf's own API (2.4 renamed
    ``register_new_resolver``, deprecating it; in 2.3 ``register_resolver`` is the deprecated 2.0 API):
    every ``foundation`` command imports this, so a deprecation here is a warning on every run."""
    import subprocess
    import sys

    code = ("from omegaconf import OmegaConf\nimport foundation.config\n"
            "c = OmegaConf.create({'backbone': {'norm': 'preln'}, 'lr': '${by_norm:{magneto: 5, preln: 3}}'})\n"
            "assert c.lr == 3, c.lr\n")
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
