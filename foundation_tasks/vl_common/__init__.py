"""Pieces the vision-language tasks share (not a task itself).

``beit3``      BEiT-3 on our multiway Backbone: embeddings, pooler, the standalone model
``convert``    released BEiT-3 / torchscale BEiT3 checkpoints -> ours (``python -m foundation_tasks.vl_common.convert``)
``text``       tokenizers: open_clip's bundled BPE (default) or a sentencepiece model (BEiT-3's beit3.spm)
``images``     image loading with errors naming the file, open_clip transforms, per-item seeds
``task``       ``VLConfig`` (the front-end fields every VL task has) and ``VLTask``, their base,
               which shares one BEiT-3 embedding between all VL task heads of a model

Used by ``foundation_tasks.vqa``, ``foundation_tasks.nlvr2`` and ``foundation_tasks.vl_pretrain``.
"""
