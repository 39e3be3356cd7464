"""The training engine: one plain PyTorch loop for every task (see ``loop.py``).

    foundation train CONFIG [key=value ...]    loop.train via cli.train_main
    foundation eval CONFIG checkpoint=PATH      loop.evaluate

The research tools built on it (compare, depth, pretraining, probe, bench, demo, plot) are the
``studies`` package, which imports the engine; the engine never imports them.

Tasks plug in through the contract in ``task.py``; configs are the dataclasses in
``config.py``. ``rundir.py`` owns a run directory (its lock, the config comparison on
resume, the record of a failure); ``failure.py`` names the failure classes, their exit
codes and their one-line messages; ``recipe.py`` is what a task declares (in its own
``recipe.py``) for the studies.
"""
from foundation.engine.task import Task, get_task, register_task

__all__ = ["Task", "get_task", "register_task"]
