"""How residual attention's scores travel through a layer stack: the one object the model asks
(score_path.py), the carried float32 sum (carried.py), the stacked queries and keys instead of
the sum (qk_carry.py, its einsum reference qk_reference.py), the stacks that recompute their
sums going down (recomputed_scores.py, recomputed_stack.py), and a sequence split over devices
(ring_attention.py)."""
