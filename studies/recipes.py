"""The tasks' declared recipes (``RECIPE`` in ``foundation_tasks/<task>/recipe.py``), found by task name."""
from __future__ import annotations

import importlib

from foundation.engine.recipe import Recipe
from foundation.engine.task import TASKS_PACKAGE, known_tasks


def recipes() -> list[Recipe]:
    """Every task's recipe, in table order (``Recipe.rank``); a task without recipe.py has none."""
    found = []
    for name in known_tasks():
        module = f"{TASKS_PACKAGE}.{name}.recipe"
        try:
            found.append(importlib.import_module(module).RECIPE)
        except ModuleNotFoundError as e:
            if e.name not in (module, f"{TASKS_PACKAGE}.{name}"):
                raise  # the recipe exists but one of its own imports is missing: show that
    return sorted(found, key=lambda r: r.rank)
