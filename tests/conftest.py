import os

# Tests run single-threaded BLAS: faster on the 2-core CI machines and reproducible.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
