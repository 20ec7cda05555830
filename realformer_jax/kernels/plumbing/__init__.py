"""What joins the model to a fused backend: which kernels and carry a run takes (select.py),
the static half of a kernel's arguments (spec.py), the one custom VJP over a backend's kernels
(fused.py), attending through it (attend.py), the derivatives refused (refusals.py) and the
arithmetic of one attention tile every backend shares (tile_math.py)."""
