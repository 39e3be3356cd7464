# mmseg-native: Pre-LN ViT-L (vanilla ViT) + UperNet on ADE20k; the baseline of
# magneto-large_upernet_8xb1-amp-160k_ade20k-640x640.py (same recipe, norm='preln').
_base_ = ['./magneto-large_upernet_8xb1-amp-160k_ade20k-640x640.py']
model = dict(backbone=dict(norm='preln'))
