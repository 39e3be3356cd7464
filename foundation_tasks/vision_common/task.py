"""``ImageFolderTask``: the base of the tasks that read an ImageNet-layout folder
(classification, mim, vq_tokenizer): the backbone and data checks, and the train / val
datasets with the reader's errors turned into ``ConfigError`` naming ``data_dir``."""
from __future__ import annotations

import abc

from torch.utils.data import Dataset

from foundation.config import ConfigError
from foundation.engine.task import Task
from foundation_tasks.vision_common.folder import check_root
from foundation_tasks.vision_common.front_end import check_vision_backbone
from foundation_tasks.vision_common.images import ImageDataError


class ImageFolderTask(Task):
    """``self.cfg`` has ``data_dir``, ``img_size`` and ``patch_size``."""

    multiway = False  # whether its tokens may take the 'vision' expert of a multiway backbone

    def check(self) -> None:
        c = self.cfg
        check_vision_backbone(self.backbone_cfg, c.img_size, c.patch_size, multiway=self.multiway)
        check_root(c.data_dir)

    @abc.abstractmethod
    def dataset(self, split: str, train: bool) -> Dataset:
        """The items of ``ROOT/split`` (``train``: with training augmentation)."""

    def _dataset(self, split: str) -> Dataset:
        try:
            return self.dataset(split, split == "train")
        except ImageDataError as e:
            raise ConfigError(f"field 'data_dir': {e}") from None

    def train_dataset(self) -> Dataset:
        return self._dataset("train")

    def eval_dataset(self) -> Dataset:
        return self._dataset("val")
