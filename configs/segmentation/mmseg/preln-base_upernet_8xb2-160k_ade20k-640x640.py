# mmseg-native: Pre-LN ViT-B (vanilla ViT) + UperNet on ADE20k; the baseline of
# magneto-base_upernet_8xb2-160k_ade20k-640x640.py (same recipe, norm='preln').
_base_ = ['./magneto-base_upernet_8xb2-160k_ade20k-640x640.py']
model = dict(backbone=dict(norm='preln'))
