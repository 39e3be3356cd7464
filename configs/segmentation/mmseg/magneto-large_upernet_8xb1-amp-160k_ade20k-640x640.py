# mmseg-native: Magneto ViT-L + UperNet on ADE20k, mmseg's BEiT-L recipe with our backbone
# (8 GPUs x 1 image x 2 accumulation steps, AMP, AdamW 2e-5, layer decay 0.95, out_indices 7/11/15/23).
_base_ = ['mmseg::beit/beit-large_upernet_8xb1-amp-160k_ade20k-640x640.py']
custom_imports = dict(imports=['foundation_tasks.segmentation.mmseg_backbone'], allow_failed_imports=False)

model = dict(
    pretrained=None,  # a MIM run's model.safetensors (or a VisionTransformer checkpoint); tables are resized
    # BEiT's arguments from _base_ still apply; layer scale only if the pretraining had it (foundation_tasks/mim: no)
    backbone=dict(type='MagnetoViT', norm='magneto', init_values=None))
optim_wrapper = dict(constructor='MagnetoLayerDecayOptimizerConstructor')
