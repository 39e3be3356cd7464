"""Everything is in pyproject.toml but one thing it cannot say: the configs/ folder ships
inside the package as ``foundation_configs`` (found packages plus one mapped folder), so
`foundation train vision/tiny_finetune_magneto` works from any directory."""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["foundation*", "tasks*"]) + ["foundation_configs"],
    package_dir={"foundation_configs": "configs"},
    package_data={"foundation_configs": ["**/*.yaml", "**/*.py", "**/*.md"]},
)
