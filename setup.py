"""Everything is in pyproject.toml but two things it cannot say:

* configs/ ships inside the package as ``foundation_configs`` (the found packages plus one
  mapped folder), so `foundation train vision/tiny_finetune` works from any directory;
* foundation_tasks/segmentation/foundation_mmseg.pth goes into site-packages (as a data file, so that
  editable installs get it too): at start-up it arms an import hook that puts the mmcv-lite
  stand-in for ``mmcv.ops`` in place when mmseg is first imported, so ``from mmseg.apis
  import init_model`` works as a program's first line (see foundation_tasks/segmentation/mmseg_autoinstall.py).
"""
import os
import sysconfig

from setuptools import find_packages, setup

# site-packages relative to the environment's prefix (lib/python3.11/site-packages in a venv)
SITE = os.path.relpath(sysconfig.get_path("purelib"), sysconfig.get_config_var("base"))

setup(
    packages=find_packages(include=["foundation*", "foundation_tasks*", "studies*"]) + ["foundation_configs"],
    package_dir={"foundation_configs": "configs"},
    package_data={"foundation_configs": ["**/*.yaml", "**/*.py", "**/*.md"]},
    data_files=[(SITE, ["foundation_tasks/segmentation/foundation_mmseg.pth"])],
)
