"""The toy Hugging Face BERT that the tests comparing with transformers build (transformers is
imported on use: it costs seconds, and pulls torch)."""

# Small enough to build and compile in seconds; no dropout, so that outputs compare exactly.
SIZES = dict(vocab_size=97, hidden_size=48, num_attention_heads=4, intermediate_size=80)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def toy_bert_config(**overrides):
  """A 3-layer transformers.BertConfig of SIZES over 40 positions; a test changes what it is
  about."""
  import transformers  # pylint: disable=import-outside-toplevel

  fields = {**SIZES, 'num_hidden_layers': 3, 'max_position_embeddings': 40, **NO_DROPOUT}
  return transformers.BertConfig(**{**fields, **overrides})
