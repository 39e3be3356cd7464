"""What the image tasks share (not a task itself; no task imports a sibling task).

``images``      image files to RGB (every PIL mode), errors naming the file
``folder``      ImageNet-layout folders: ``ImageFolderDataset``, checks, ``verify`` (``python -m foundation_tasks.vision_common.folder``)
``transforms``  timm's ImageNet transforms (fine-tuning, BEiT pretraining, evaluation), MEAN / STD
``front_end``   backbone checks for the ViT front end (``foundation.embed.ViTFrontEnd``), loading a pretrained one
``task``        ``ImageFolderTask``, the base of classification, mim and vq_tokenizer
``masking``     BEiT's block-wise masking (mim, vl_pretrain)
``vqkd``, ``quantizer``   BEiT v2's VQ-KD tokenizer model (trained by the ``vq_tokenizer`` task)
``tokenizer``   a trained tokenizer, frozen: the targets of mim and vl_pretrain
"""
