"""TPU kernels written in Pallas Mosaic."""
