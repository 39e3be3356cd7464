"""Transducer decoding: batched greedy search, and ESPnet's beam search.

Both take the encoder output (B, T, D) and its lengths and return token id lists (blank
removed). Beam search is ESPnet's ``BeamSearchTransducer`` run on our predictor and joint
network (which are ESPnet's ``RNNDecoder`` and ``JointNetwork``), one utterance at a time.
"""
from __future__ import annotations

import torch

from foundation_tasks.asr.transducer import BLANK

SEARCH_TYPES = ("default", "maes", "tsd", "alsd")  # ESPnet's BeamSearchTransducer algorithms


@torch.no_grad()
def greedy_search(predictor, joint, enc: torch.Tensor, enc_lens: torch.Tensor, max_symbols: int = 5) -> list[list[int]]:
    """At each frame emit the best non-blank unit and advance the predictor, until blank
    wins or ``max_symbols`` units were emitted at that frame; then move to the next frame."""
    B, T, _ = enc.shape
    predictor.set_device(enc.device)
    enc_proj = joint.lin_enc(enc)
    state = predictor.init_state(B)
    start = torch.full((B, 1), BLANK, dtype=torch.long, device=enc.device)
    dec, state = predictor.rnn_forward(predictor.embed(start), state)
    dec_proj = joint.lin_dec(dec[:, 0])
    hyps: list[list[int]] = [[] for _ in range(B)]
    for t in range(T):
        active = t < enc_lens
        for _ in range(max_symbols):
            best = joint.lin_out(joint.joint_activation(enc_proj[:, t] + dec_proj)).argmax(-1)
            emit = active & (best != BLANK)
            if not emit.any():
                break
            new_dec, new_state = predictor.rnn_forward(predictor.embed(best[:, None]), state)
            dec_proj = torch.where(emit[:, None], joint.lin_dec(new_dec[:, 0]), dec_proj)
            state = tuple(torch.where(emit[None, :, None], new, old) for new, old in zip(new_state, state))
            for b in emit.nonzero()[:, 0].tolist():
                hyps[b].append(int(best[b]))
            active = emit
    return hyps


@torch.no_grad()
def beam_search(predictor, joint, enc: torch.Tensor, enc_lens: torch.Tensor, beam_size: int = 4,
                search_type: str = "default") -> list[list[int]]:
    """ESPnet's ``BeamSearchTransducer`` (``search_type``: default = Graves 2012, maes =
    modified adaptive expansion, tsd / alsd = time / alignment-length synchronous)."""
    from espnet2.asr_transducer.beam_search_transducer import BeamSearchTransducer

    if search_type not in SEARCH_TYPES:
        raise ValueError(f"search_type must be one of {', '.join(SEARCH_TYPES)}, got {search_type!r}")
    beam = min(beam_size, predictor.vocab_size - (2 if search_type == "maes" else 0))
    search = BeamSearchTransducer(predictor, joint, beam_size=beam, search_type=search_type)
    return [search(enc[b, : int(enc_lens[b])])[0].yseq[1:] for b in range(enc.shape[0])]
