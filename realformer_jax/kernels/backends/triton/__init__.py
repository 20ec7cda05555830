"""GPU kernels written in Pallas Triton."""
