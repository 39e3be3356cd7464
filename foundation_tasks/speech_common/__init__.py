"""Pieces the speech tasks share (not a task itself).

``corpus``     ``Utterance`` records from the real on-disk layouts (LibriSpeech folders, Kaldi /
               ESPnet data dirs), with or without transcripts; ``SpeechDataError`` names the utterance
``features``   audio reading and header checks, Kaldi-compatible log-mel filterbanks, ESPnet's
               global CMVN statistics (``feats_stats.npz``), a per-utterance feature cache
``cmvn``       ``GlobalCMVN`` (statistics as buffers) and ``padding_mask``, the modules around
               the VGG front end that every speech head has
``task``       ``SpeechFields`` (the prepared-file paths of a speech config), ``check_speech_fields``
               and ``SpeechTask``, the base that reads the splits, computes the CMVN statistics once
               and loads them into a head

Used by ``foundation_tasks.asr`` and ``foundation_tasks.best_rq`` (which share its CMVN statistics file).
"""
