"""Research tools built on the engine: each one trains or measures models and writes a report.

    compare       ``foundation compare CONFIG``: one recipe under several norms x seeds x lrs
    depth         ``foundation compare depth``: DeepNet's convergence with varying depth (and 1000 layers)
    pretraining   ``foundation compare pretraining``: cross-modal vs single-modality pretraining
    demo          ``foundation demo``: Pre-LN vs Magneto on every modality's demo data
    probe         ``foundation probe update``: DeepNet's model-update measurement
    bench         ``foundation bench backbone``: our backbone's speed against timm and torchscale
    plots         ``foundation plot RUN_DIR`` and the comparisons' figures
    mim           ``python -m studies.mim``: fine-tuning from MIM against from scratch
    vl_table      ``python -m studies.vl_table``: the vision-language table on the demo data

They share ``runs`` (launch or resume a `foundation train` run, read what it left),
``verdict`` (how a run is judged), ``report`` (tables) and ``recipes`` (the tasks' declared
recipes, ``foundation_tasks/<task>/recipe.py``). Studies import foundation and tasks; neither imports
studies (``foundation.cli`` names their commands by string).
"""
