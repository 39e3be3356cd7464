"""ESPnet's ASR training (``python -m espnet2.bin.asr_train``) with ``encoder: magneto``
available: the same command line and config files, one more encoder choice::

    python -m foundation_tasks.asr.espnet_train --config conf/train_asr_magneto.yaml --train_data_path_and_name_and_type ...

In your own launcher, ``register_in_espnet()`` before ``ASRTask.main()`` (or
``ASRTask.build_model(args)``) does the same.
"""
from __future__ import annotations

from foundation_tasks.asr.espnet_encoder import register_in_espnet


def main(cmd=None) -> None:
    register_in_espnet()
    from espnet2.bin.asr_train import main as asr_train

    asr_train(cmd)


if __name__ == "__main__":
    main()
