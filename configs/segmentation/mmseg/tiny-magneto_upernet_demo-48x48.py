# mmseg-native, tiny: Magneto ViT (dim 64, depth 4, patch 4, 48x48 crops) + UperNet on the demo scenes,
# trained with mmseg's own Runner on the CPU in minutes.
#   foundation data make segmentation --out data/ade-demo
#   python .venv/lib/python3.11/site-packages/mmseg/.mim/tools/train.py \
#       configs/segmentation/mmseg/tiny-magneto_upernet_demo-48x48.py --work-dir runs/mmseg-tiny
# (mmseg's tools/train.py from its package; or mmengine's Runner.from_cfg in Python.)
_base_ = [
    'mmseg::_base_/models/upernet_beit.py', 'mmseg::_base_/datasets/ade20k_640x640.py',
    'mmseg::_base_/default_runtime.py'
]
custom_imports = dict(imports=['foundation_tasks.segmentation.mmseg_backbone'], allow_failed_imports=False)

data_root = 'data/ade-demo'
num_classes = 8  # the demo uses the first 8 ADE20k classes
crop_size = (48, 48)
dim = 64  # = the tiny MIM pretraining (configs/vision)
norm_cfg = dict(type='BN', requires_grad=True)  # one process: BN (mmseg's default is SyncBN)

model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        _delete_=True, type='MagnetoViT', norm='magneto', img_size=48, patch_size=4, embed_dims=dim,
        num_layers=4, num_heads=2, mlp_ratio=4, out_indices=(0, 1, 2, 3), drop_path_rate=0.1, init_values=None,
        # as the tiny MIM pretraining (configs/vision): absolute positions, no relative bias
        rel_pos=False, abs_pos_embed=True, norm_cfg=dict(type='LN', eps=1e-5),
        pretrained=None),  # e.g. 'checkpoints/vision-mim-tiny-magneto/best/model.safetensors'
    neck=dict(embed_dim=dim, rescales=[4, 2, 1, 0.5], norm_cfg=norm_cfg),
    decode_head=dict(in_channels=[dim] * 4, channels=64, num_classes=num_classes, norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=dim, channels=32, num_classes=num_classes, norm_cfg=norm_cfg),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(32, 32)))

metainfo = dict(
    classes=('wall', 'building', 'sky', 'floor', 'tree', 'ceiling', 'road', 'bed '),
    palette=[[120, 120, 120], [180, 120, 120], [6, 230, 230], [80, 50, 50], [4, 200, 3], [120, 120, 80],
             [140, 140, 140], [204, 5, 255]])
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadCheckedAnnotations', num_classes=num_classes),
    dict(type='RandomResize', scale=(192, 48), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
# mmseg's own LoadAnnotations here: init_model / inference_model / MMSegInferencer drop it by
# that name to run on images without annotations (the checked loader guards the training data)
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(192, 48), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    constructor='MagnetoLayerDecayOptimizerConstructor',
    paramwise_cfg=dict(num_layers=4, layer_decay_rate=0.9))
max_iters = 2000
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=100),
    dict(type='PolyLR', power=1.0, begin=100, end=max_iters, eta_min=0.0, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=500)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=500, max_keep_ckpts=1))
env_cfg = dict(cudnn_benchmark=False, dist_cfg=dict(backend='gloo'))
