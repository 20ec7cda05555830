"""Encoder-decoder models and their WEB -> BBE translation task, in one package.

    from realformer_jax.seq2seq import Seq2Seq, decoding
    model = Seq2Seq(config)                                   # model.py
    tokens, scores = decoding.beam_search(model, params, source, source_mask, ...)

Files: model (Seq2Seq: the project's encoder + a decoder), model_config (Seq2SeqModelConfig:
the encoder's ModelConfig plus the decoder's fields), decoder (standard / AAN / merged
decoder layers), average_attention (the AAN), decoding (greedy and beam search with caches),
bible_pairs (aligned WEB / BBE verses), data (tokenizer, cached encoded splits, length-bucketed
batches, the checkpointable train stream), config (the translation run's sections), task
(translation as a task of the training loop, train/loop.py), trainer (training through that
loop, BLEU). The package mirrors finetune/: a task built on the core model. Importing it loads
only the model modules; `seq2seq.trainer`, `seq2seq.task` and `seq2seq.data` bring the
training stack.
"""

from realformer_jax.seq2seq import decoding
from realformer_jax.seq2seq.average_attention import AverageAttention
from realformer_jax.seq2seq.decoder import Decoder, DecoderLayer
from realformer_jax.seq2seq.model import Seq2Seq
from realformer_jax.seq2seq.model_config import Seq2SeqModelConfig

__all__ = [
  'AverageAttention',
  'Decoder',
  'DecoderLayer',
  'Seq2Seq',
  'Seq2SeqModelConfig',
  'decoding',
]
