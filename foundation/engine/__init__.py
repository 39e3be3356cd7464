"""The training engine: one plain PyTorch loop for every task (see ``loop.py``).

    foundation train CONFIG [key=value ...]    loop.train via cli.train_main
    foundation eval CONFIG checkpoint=PATH      loop.evaluate
    foundation plot RUN_DIR                     plot.plot_run
    foundation compare CONFIG | depth           compare.main: norms x seeds x lrs / depths, one report

Tasks plug in through the contract in ``task.py``; configs are the dataclasses in
``config.py``. ``rundir.py`` owns a run directory (its lock, the config comparison on
resume, the record of a failure); ``failure.py`` names the failure classes, their exit
codes and their one-line messages.
"""
from foundation.engine.task import Task, get_task, register_task

__all__ = ["Task", "get_task", "register_task"]
