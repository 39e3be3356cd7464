"""mmseg's own inference APIs on our configs, written as an mmseg user writes them: a fresh
interpreter whose first line is ``from mmseg.apis import ...`` (nothing of ours imported
first), ``init_model`` / ``inference_model`` / ``MMSegInferencer`` on every shipped mmseg
config and on a user's own config naming ``type='MagnetoViT'``.

The interpreter starts the way an installed environment does: site.py runs
``foundation_mmseg.pth`` from site-packages (run.sh / setup.py put it there); here
``site.addsitedir`` runs the same file from a temporary folder, so the test also holds in
an environment installed before that file existed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
MMSEG_CONFIGS = REPO / "configs" / "segmentation" / "mmseg"
TINY = MMSEG_CONFIGS / "tiny-magneto_upernet_demo-48x48.py"
QUICK = [MMSEG_CONFIGS / "magneto-base_upernet_8xb2-160k_ade20k-640x640.py"]
# preln-* differ from magneto-* by one field; ViT-L takes 2.5 GB and ~10 s each to build on a CPU
SLOW = sorted(set(MMSEG_CONFIGS.glob("*.py")) - {TINY, *QUICK})

USER_CONFIG = """
_base_ = ['mmseg::_base_/models/upernet_beit.py', 'mmseg::_base_/datasets/ade20k.py',
          'mmseg::_base_/default_runtime.py']
custom_imports = dict(imports=['foundation_tasks.segmentation.mmseg_backbone'], allow_failed_imports=False)
crop_size = (64, 64)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(type='MagnetoViT', norm='magneto', img_size=64, patch_size=8, embed_dims=64, num_layers=4,
                  num_heads=4, out_indices=(0, 1, 2, 3)),
    neck=dict(embed_dim=64),
    decode_head=dict(in_channels=[64] * 4, channels=32, num_classes=150),
    auxiliary_head=dict(in_channels=64, channels=16, num_classes=150),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(48, 48)))
# small images: ADE20k's 2048x512 test resize would make CPU inference slow
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=(128, 64), keep_ratio=True),
                 dict(type='LoadAnnotations', reduce_zero_label=True), dict(type='PackSegInputs')]
test_dataloader = dict(dataset=dict(pipeline=test_pipeline))
"""

SCRIPT = """
import site, sys, time
t = time.time()
site.addsitedir(sys.argv[1])
from mmseg.apis import MMSegInferencer, inference_model, init_model
image, n_predict, configs = sys.argv[2], int(sys.argv[3]), sys.argv[4:]
assert 'foundation_tasks.segmentation.mmseg_backbone' not in sys.modules
for i, cfg in enumerate(configs):
    model = init_model(cfg, device='cpu')
    assert type(model.backbone).__name__ == 'MagnetoViT', cfg
    if i < n_predict:  # the small ones also predict, through both APIs
        seg = inference_model(model, image).pred_sem_seg.data
        assert seg.shape == (1, 72, 96), seg.shape
        out = MMSegInferencer(model=cfg, weights=None, device='cpu')(image, return_datasamples=True)
        assert out.pred_sem_seg.data.shape == (1, 72, 96)
    print('ok', cfg, round(time.time() - t, 1), flush=True)
    del model
"""


def run_as_mmseg_user(tmp_path: Path, configs: list[Path], n_predict: int = 0) -> None:
    from foundation_tasks.segmentation import demo

    data = tmp_path / "ade"
    demo.write(data, seed=0, n_train=1, n_val=1, height=72, width=96)
    image = next((data / "images" / "validation").glob("*.jpg"))
    pth_dir = tmp_path / "site"
    pth_dir.mkdir()
    shutil.copy(REPO / "foundation_tasks" / "segmentation" / "foundation_mmseg.pth", pth_dir)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(pth_dir), str(image), str(n_predict),
                           *map(str, configs)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-3000:]
    assert proc.stdout.count("ok ") == len(configs)


def test_mmseg_apis_on_the_tiny_config_a_users_config_and_magneto_base(tmp_path):
    user = tmp_path / "my_magneto_upernet.py"
    user.write_text(USER_CONFIG)
    run_as_mmseg_user(tmp_path, [TINY, user, *QUICK], n_predict=2)


@pytest.mark.slow
def test_mmseg_init_model_on_the_other_shipped_configs(tmp_path):
    run_as_mmseg_user(tmp_path, SLOW)


def test_every_shipped_mmseg_config_is_covered():
    assert len(SLOW) == 3 and all(p.is_file() for p in QUICK)
