"""Tasks: one package per training objective, found by name from the config.

``tasks: [{name: seq2seq, ...}]`` makes the engine import ``foundation_tasks.seq2seq``, which
registers its ``Task`` class with ``@foundation.engine.register_task("seq2seq")``.
Nothing imports a task package statically, so adding a task is adding a folder:

    foundation_tasks/<name>/
        __init__.py   imports the Task class (running its registration)
        task.py       the Task subclass and its config dataclass (the YAML fields)
        model.py      the head around the shared backbone, and the loss
        data.py       the data adapter: the real dataset's on-disk layout -> samples
        metrics.py    per-batch sums and the metrics computed from them
    configs/<name>/*.yaml

The contract a Task fulfils is documented in ``foundation/engine/task.py``.
"""
