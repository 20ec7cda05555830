"""The PyTorch module experiments.export_hf copies beside the weights of a Pre-LN, RealFormer
(or rotary) export: transformers loads it with trust_remote_code=True. Needs torch."""
