"""The CUDA backend: exact forwards at one padded row count (`padded.py`), written in torch ops that run on a
CPU too, so that its logic is tested where no GPU is."""
