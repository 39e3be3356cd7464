# mmseg-native: Magneto ViT-B + UperNet on ADE20k, mmseg's BEiT recipe with our backbone.
#   python .venv/lib/python3.11/site-packages/mmseg/.mim/tools/train.py \
#       configs/segmentation/mmseg/magneto-base_upernet_8xb2-160k_ade20k-640x640.py
# Everything but the backbone and the optimizer constructor comes from mmseg's own config
# (8 GPUs x 2 images, 160k iterations, AdamW 3e-5, layer decay 0.9, warmup 1500, poly,
# slide inference 640 / 426).
_base_ = ['mmseg::beit/beit-base_upernet_8xb2-160k_ade20k-640x640.py']
custom_imports = dict(imports=['foundation_tasks.segmentation.mmseg_backbone'], allow_failed_imports=False)

model = dict(
    pretrained=None,  # a MIM run's model.safetensors (or a VisionTransformer checkpoint); tables are resized
    # BEiT's arguments from _base_ still apply; layer scale only if the pretraining had it (foundation_tasks/mim: no)
    backbone=dict(type='MagnetoViT', norm='magneto', init_values=None))
optim_wrapper = dict(constructor='MagnetoLayerDecayOptimizerConstructor')
