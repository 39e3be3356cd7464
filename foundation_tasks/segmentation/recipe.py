"""segmentation's tiny recipe for the studies (foundation demo, foundation compare pretraining)."""
from foundation.engine.recipe import Recipe

RECIPE = Recipe(
    task="segmentation", config="configs/segmentation/tiny.yaml", metric="mIoU", scale=1,
    modality="vision", rank=2,
    label="segmentation (mIoU %)", data="segmentation", data_field="tasks.segmentation.data_root",
    steps=300, minutes=2, bar=">= 75", baseline="one class everywhere <= 12.5", stability_steps=100,
    label_field="tasks.segmentation.train_fraction", label_budgets=("0.1", "all"),
    # the scenes' MIM first: it is the one that pays (--quick takes the first); MIM on the vision demo's shapes
    # changes nothing here (docs/studies.md)
    label_unit="fraction of the annotated images", pretrainings=("scenes", "pixels"),
    # from MIM weights, BEiT's layer decay: at 10 % of the masks, Magneto from the scenes' MIM 87.6 -> 89.4 mIoU
    # (seeds 0-2); from scratch it moves Magneto by 0.0 and Pre-LN by +1.6 (docs/segmentation.md)
    pretrained_overrides=("optim.layer_decay=0.65",),
)
