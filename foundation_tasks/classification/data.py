"""``python -m foundation_tasks.classification.data verify ROOT``: open every image of an ImageNet-layout
folder once, list the bad ones. The reader itself is ``foundation_tasks.vision_common.folder``, shared by
the image-folder tasks (classification, mim, vq_tokenizer)."""
from __future__ import annotations

from foundation_tasks.vision_common.folder import main

if __name__ == "__main__":
    raise SystemExit(main(prog="python -m foundation_tasks.classification.data"))
