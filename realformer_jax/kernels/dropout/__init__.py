"""Attention dropout as the kernels draw it: the counter-based hash and its keep decisions
(dropout_bits.py), one tile's mask inside a kernel (dropout_tiles.py), and whether a
rematerialised layer's mask is stored, drawn per layer or drawn in the backward
(remat_masks.py)."""
